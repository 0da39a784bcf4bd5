"""Step time: the seconds of each training step, measured by two callbacks placed around all the others.

The one way the project times steps: the sweep's up-front estimate (`study.sweep.estimate`) and the bench's
interleaved timing (`study.bench.timing`) both use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override


def synchronize(device: torch.device | str) -> None:
    """Wait for the queued kernels of ``device`` (a no-op off CUDA), so that a clock read counts them."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Seconds of every training step, from the first callback's batch start to the last callback's batch end.

    ``timer.around(callbacks)`` puts ``timer.start`` first and ``timer.stop`` last, so a step's time holds the
    training step, the backward, the optimizer step and every other callback's batch hooks; data loading is not
    timed. On CUDA both ends synchronise, so each step's kernels count in that step.

    Args:
        before_step: called with the trainer before the clock starts (the bench passes turns between threads here,
            so a wait for its turn is never timed).

    Attributes:
        records: ``(seconds, global_step)`` per step, ``global_step`` read when the step started.
    """

    def __init__(self, before_step: Callable[[L.Trainer], None] | None = None) -> None:
        self.records: list[tuple[float, int]] = []
        self.start = StepTimerStart(self, before_step)
        self.stop = StepTimerStop(self)

    @property
    def times(self) -> list[float]:
        return [seconds for seconds, _ in self.records]

    def around(self, callbacks: list[L.Callback]) -> list[L.Callback]:
        return [self.start, *callbacks, self.stop]


class StepTimerStart(L.Callback):
    """The clock's start: first in the Trainer's callbacks (see `StepTimer`)."""

    def __init__(self, timer: StepTimer, before_step: Callable[[L.Trainer], None] | None = None) -> None:
        self.timer, self.before_step = timer, before_step
        self.started = 0.0
        self.step = 0

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.before_step is not None:
            self.before_step(trainer)
        self.step = trainer.global_step
        synchronize(pl_module.device)
        self.started = time.perf_counter()


class StepTimerStop(L.Callback):
    """The clock's stop: last in the Trainer's callbacks (see `StepTimer`)."""

    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT,
                           batch: Any, batch_idx: int) -> None:
        synchronize(pl_module.device)
        start = self.timer.start
        self.timer.records.append((time.perf_counter() - start.started, start.step))
