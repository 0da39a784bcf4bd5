"""`BaselineValidation`: one validation epoch before the first update, so every in-training quantity has its step-0
value (the frozen model under the new attention) beside its final one."""

from __future__ import annotations

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

    Example::

        trainer = L.Trainer(callbacks=[BaselineValidation()], val_check_interval=100)
    """

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != 0 or trainer.limit_val_batches == 0:
            return
        epoch_loop = trainer.fit_loop.epoch_loop
        # What Lightning's own training loop does around a validation run (training_epoch_loop.on_advance_end).
        trainer.validating = True
        epoch_loop.val_loop.run()
        trainer.training = True


__all__ = ["BaselineValidation"]
