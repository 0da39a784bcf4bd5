"""`BaselineValidation`: one validation epoch before the first update, so every in-training quantity has its step-0
value (the model as loaded, under the new attention, before any step) beside its final one."""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class BaselineValidation(Callback):
    """Run the validation loop once at step 0, before any optimizer step.

    The model has just been switched to its attention spec (a new temperature, top-k or normaliser) and not yet
    trained, so ``val/loss``, ``val/ppl`` and every monitor's ``val/...`` tag logged at step 0 are the baseline
    that a training effect is measured from: a perplexity that is already 50x worse before the first update
    says nothing about training. It is the same validation loop (same batches, same monitors) as the later
    ones, logged through the same loggers at step 0. A resumed run (global step > 0) has its baseline already.

    The step-0 model depends on the attention spec and the validation set, not on the seed or the optimizer: a
    sweep can validate it once per setting (``seed``: only in runs whose global seed, as `seed_everything` sets
    it, is this one) and let the report share that baseline with the setting's other runs.

    Args:
        seed: validate only when the run's global seed is this (None: in every run).

    Example::

        trainer = L.Trainer(callbacks=[BaselineValidation()], val_check_interval=100)
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be None or an integer, got {seed!r}")
        self.seed = seed

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != 0 or trainer.limit_val_batches == 0:
            return
        if self.seed is not None and os.environ.get("PL_GLOBAL_SEED") != str(self.seed):
            return
        epoch_loop = trainer.fit_loop.epoch_loop
        # What Lightning's own training loop does around a validation run (training_epoch_loop.on_advance_end).
        trainer.validating = True
        epoch_loop.val_loop.run()
        trainer.training = True


__all__ = ["BaselineValidation"]
