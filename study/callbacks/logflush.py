"""`LogFlush`: everything logged before a checkpoint's step is on disk before training goes past it.

A resumed run starts from its checkpoint's step S and rewrites the steps from S on (its TensorBoard writer purges
them). The steps before S must then be on disk already. Two things used to lose them at a kill: the writer's queue
(events logged but not yet flushed die with the process), and Lightning's order within a step (the step that makes
the checkpoint logs its metrics and runs its validation *after* the checkpoint is written). So this callback
flushes the loggers when a checkpoint is saved, and again at the start of the next step, once that step's logs
and validation are done. Only a kill between those two moments can still lose step S - 1; a sweep sees that when
it resumes (the logs end before S - 1) and starts the run over (`study.sweep.run`).

Place it before callbacks that may stop the process at the start of a step.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override


class LogFlush(L.Callback):
    """Flush every logger at each checkpoint and at the start of the step after it."""

    def __init__(self) -> None:
        self._after_checkpoint = False

    @staticmethod
    def _flush(trainer: L.Trainer) -> None:
        for logger in trainer.loggers:
            experiment = getattr(logger, "_experiment", None)  # only a logger that has written something
            if experiment is not None and hasattr(experiment, "flush"):
                experiment.flush()

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._flush(trainer)
        self._after_checkpoint = True

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._after_checkpoint:
            self._flush(trainer)
            self._after_checkpoint = False


__all__ = ["LogFlush"]
