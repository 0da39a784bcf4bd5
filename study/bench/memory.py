"""Peak memory of one steady-state training step, measured in a pass of its own (never during timing)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from study.bench.shapes import Settings, Shape, Variant
from study.bench.timing import bench_trainer, build_module, monitor_callbacks, random_loader
from study.callbacks.steptime import synchronize


def _resident_bytes(module, trainer) -> int:
    seen, total = set(), 0
    tensors = list(module.parameters()) + list(module.buffers())
    for optimizer in trainer.optimizers:
        for state in optimizer.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v)]
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def profiled_peak_bytes(profiler: torch.profiler.profile) -> int:
    """Peak of the CPU memory allocated while ``profiler`` (``profile_memory=True``) ran, over what was live when it
    started: the running sum of its allocation events (frees are negative), in time order."""
    events = [e for e in profiler.profiler.kineto_results.events()
              if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]  # fmt: skip
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


class PeakMemory:
    """Peak bytes of the training step that starts at global step ``step``, by two callbacks placed around all
    the others (``peak.around(callbacks)``), so the monitors' work on that step counts.

    On a GPU, ``torch.cuda.max_memory_allocated`` over the step. On a CPU, torch keeps no allocator statistics:
    the step runs under ``torch.profiler`` with ``profile_memory=True``, and the peak is the most its allocation
    and free events held at once, plus the bytes that live across steps (parameters, buffers, AdamW state).
    """

    def __init__(self, step: int = 2) -> None:
        self.step = step
        self.result: dict = {}
        self.resident = 0
        self.profiler: torch.profiler.profile | None = None
        self.start = PeakMemoryStart(self)
        self.stop = PeakMemoryStop(self)

    def around(self, callbacks: list[L.Callback]) -> list[L.Callback]:
        return [self.start, *callbacks, self.stop]


class PeakMemoryStart(L.Callback):
    """Opens the measured step: resets the peak (GPU) or starts the memory profiler (CPU)."""

    def __init__(self, peak: PeakMemory) -> None:
        self.peak = peak

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step != self.peak.step:
            return
        synchronize(pl_module.device)
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        else:
            self.peak.resident = _resident_bytes(pl_module, trainer)
            self.peak.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                        profile_memory=True)
            self.peak.profiler.__enter__()


class PeakMemoryStop(L.Callback):
    """Closes the measured step and records its peak bytes in ``peak.result``."""

    def __init__(self, peak: PeakMemory) -> None:
        self.peak = peak

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT,
                           batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.peak.step + 1:  # incremented by the optimizer step
            return
        synchronize(pl_module.device)
        if pl_module.device.type == "cuda":
            self.peak.result.update(peak_bytes=torch.cuda.max_memory_allocated(),
                                    method="torch.cuda.max_memory_allocated")
            return
        profiler = self.peak.profiler
        profiler.__exit__(None, None, None)
        peak = profiled_peak_bytes(profiler)
        resident = self.peak.resident
        self.peak.result.update(
            step_peak_bytes=peak, resident_bytes=resident, peak_bytes=resident + peak,
            method="torch.profiler memory events: resident (params, buffers, AdamW state) + step peak",
        )


def measure_memory(shape: Shape, variant: Variant, settings: Settings, classes: list[type], log_dir: str) -> dict:
    """Peak bytes of one steady-state step (the third; a logging step for monitor variants)."""
    peak = PeakMemory(step=2)
    module = build_module(shape, variant)
    every = None if variant.monitor_every is None else 1  # tap on the profiled step
    trainer = bench_trainer(settings, 3, peak.around(monitor_callbacks(classes, every, variant.monitors)), log_dir)
    trainer.fit(module, train_dataloaders=random_loader(shape, 3))
    return peak.result
