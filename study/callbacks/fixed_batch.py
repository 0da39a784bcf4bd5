"""`FixedBatchLoss`: the loss on one held-out batch, the same at every logged step, so that a jump in it is the
model changing and not the next training batch being harder."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from study import tags
from study.callbacks.base import due, last_step, write_scalars


class FixedBatchLoss(Callback):
    """Log ``train/fixed_batch_loss``: the module's loss on the first validation batch, in eval mode and without
    gradients, at step 0 (before any update) and after every ``every_n_steps``-th optimizer step.

    The training loss moves with each batch's difficulty (about 20% on 2 x 128 tokens), which makes spikes hard to
    tell from noise; a fixed batch removes that noise. The module must have a ``loss(batch)`` method (as
    `study.model.CausalLMModule` has); the batch is taken once, when training starts.

    Args:
        every_n_steps: evaluate after every this many optimizer steps (each evaluation costs one forward pass).

    Example::

        trainer = L.Trainer(callbacks=[FixedBatchLoss(every_n_steps=1)])
    """

    def __init__(self, every_n_steps: int = 1) -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an integer >= 1, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self._batch: Any = None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not callable(getattr(pl_module, "loss", None)):
            raise TypeError(f"FixedBatchLoss needs a `loss(batch)` method on {type(pl_module).__name__}")
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        if loader is None:
            trainer.fit_loop.epoch_loop.val_loop.setup_data()
            loaders = trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        if loader is None:
            raise ValueError("FixedBatchLoss needs a validation dataloader to take its batch from")
        self._batch = pl_module.transfer_batch_to_device(next(iter(loader)), pl_module.device, 0)
        self._log(trainer, pl_module, step=trainer.global_step)  # 0, or a resumed run's step (its weights now)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        # After the optimizer step: the loss of the weights the next step starts from, logged at that step.
        last = last_step(trainer)  # logged after the step: the run's last is global_step == last + 1
        if self._batch is not None and due(trainer.global_step, self.every_n_steps, None if last is None else last + 1):
            self._log(trainer, pl_module, step=trainer.global_step)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        modes = {module: module.training for module in pl_module.modules()}  # frozen parts may sit in eval mode
        pl_module.eval()
        with torch.no_grad():
            loss = float(pl_module.loss(self._batch))
        for module, training in modes.items():
            module.training = training
        write_scalars(trainer, {tags.FIXED_BATCH_LOSS: loss}, step)


__all__ = ["FixedBatchLoss"]
