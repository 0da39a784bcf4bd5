"""Peak memory of one steady-state training step, measured in a pass of its own (never during timing)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from study.bench.shapes import Settings, Shape, Variant
from study.bench.timing import _loader, _module, _monitors, _sync, _trainer


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


def measure_memory(shape: Shape, variant: Variant, settings: Settings, classes: list[type], log_dir: str) -> dict:
    """Peak bytes of one steady-state step (the third; a logging step for monitor variants)."""
    from lightning.pytorch.callbacks import Callback

    device = settings.device
    result: dict = {}

    class PeakMemoryStart(Callback):
        """Opens the measured step: resets the peak (GPU) or starts the memory profiler (CPU)."""

        @override
        def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                                 batch_idx: int) -> None:
            if trainer.global_step != 2:
                return
            _sync(device)
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
                self.before = torch.cuda.memory_allocated()
            else:
                self.resident = _resident_bytes(pl_module, trainer)
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
                self.prof.__enter__()

    class PeakMemoryEnd(Callback):
        """Closes the measured step and records its peak bytes."""

        @override
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT,
                               batch: Any, batch_idx: int) -> None:
            if trainer.global_step != 3:  # incremented by the optimizer step
                return
            _sync(device)
            if device.startswith("cuda"):
                result.update(peak_bytes=torch.cuda.max_memory_allocated(), method="torch.cuda.max_memory_allocated")
                return
            start.prof.__exit__(None, None, None)
            events = [e for e in start.prof.profiler.kineto_results.events()
                      if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
            live = peak = 0
            for e in sorted(events, key=lambda e: e.start_ns()):
                live += e.nbytes()
                peak = max(peak, live)
            result.update(step_peak_bytes=peak, resident_bytes=start.resident, peak_bytes=start.resident + peak,
                          method="torch.profiler memory events: resident (params, buffers, AdamW state) + step peak")

    start = PeakMemoryStart()
    module = _module(shape, variant)
    every = None if variant.monitor_every is None else 1  # tap on the profiled step
    trainer = _trainer(settings, 3, [start, *_monitors(classes, every), PeakMemoryEnd()], log_dir)
    trainer.fit(module, train_dataloaders=_loader(shape, 3))
    return result

