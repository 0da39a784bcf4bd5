"""`NonFiniteGuard`: stop (or skip the step) when the loss or the gradients stop being finite.

Model-agnostic: it looks only at the loss handed to `on_before_backward` and at the parameters' gradients in
`on_before_optimizer_step` (which Lightning calls after backward and before gradient clipping, so the norm it
sees is the pre-clip one).

    action: stop   the offending step is not applied (its gradients are dropped, so the weights stay the last good
                   ones), training stops cleanly with a message, and `diverged` holds the reason. The checkpoints
                   already written (e.g. last.ckpt) are kept.
    action: skip   the offending step is not applied and training goes on; `guard/skipped_steps` counts the skipped
                   steps (logged every time one is skipped). After `max_skips` skipped steps in a row the guard stops
                   as in `stop` mode (None: never).

"Not applied" means every gradient is set to None before the optimizer step: PyTorch optimizers skip parameters
without a gradient, so neither the weights nor the optimizer moments change (a zeroed gradient would still move
AdamW's moments and apply weight decay).

Its state (skipped count, divergence) is saved in checkpoints, so a resumed run keeps counting.

Example (YAML, under `trainer.callbacks`):

    - class_path: study.callbacks.nonfinite.NonFiniteGuard
      init_args: {action: stop}
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim import Optimizer
from typing_extensions import override

from study import tags
from study.metrics import total_grad_norm

ACTIONS = ("stop", "skip")
SKIPPED_TAG = tags.GUARD_SKIPPED
GRAD_NORM_TAG = tags.GUARD_GRAD_NORM
DIVERGED_TAG = tags.GUARD_DIVERGED


class NonFiniteGuard(L.Callback):
    """Stop or skip a training step whose loss or gradient norm is NaN or infinite.

    Args:
        action: "stop" (default) or "skip".
        check_loss: check the training loss before backward.
        check_grads: check the total gradient norm before the optimizer step.
        max_skips: in skip mode, stop after this many consecutive skipped steps (None: never stop).
        log_grad_norm: also log the total pre-clip gradient norm it computes anyway, as `guard/grad_norm_preclip`
            (off by default: a dedicated gradient monitor owns `grad_norm/*`; turn this on when none is used).
    """

    def __init__(
        self,
        action: str = "stop",
        check_loss: bool = True,
        check_grads: bool = True,
        max_skips: int | None = None,
        log_grad_norm: bool = False,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"NonFiniteGuard action must be one of {ACTIONS}, got {action!r}")
        if max_skips is not None and (
            isinstance(max_skips, bool) or not isinstance(max_skips, int) or max_skips < 1
        ):
            raise ValueError(f"max_skips must be None or a positive integer, got {max_skips!r}")
        self.action = action
        self.check_loss = check_loss
        self.check_grads = check_grads
        self.max_skips = max_skips
        self.log_grad_norm = log_grad_norm
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.diverged: dict[str, Any] | None = None
        self._loss: torch.Tensor | None = None
        self._loss_ok: torch.Tensor | None = None

    # ---- hooks ------------------------------------------------------------------------------------------------
    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        # Kept on the device and combined over the micro-batches of an accumulation window (any of them may be the
        # non-finite one); the loss and the gradients are judged together, with one host sync per optimizer step.
        if self.check_loss:
            finite = torch.isfinite(loss.detach()).all()
            self._loss_ok = finite if self._loss_ok is None else self._loss_ok & finite
            self._loss = loss.detach()

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer) -> None:
        grads = [p for p in pl_module.parameters() if p.grad is not None]
        norm = total_grad_norm(grads) if grads and (self.check_grads or self.log_grad_norm) else None
        loss_ok, self._loss_ok = self._loss_ok, None
        checks = ([] if loss_ok is None else [loss_ok]) + (
            [torch.isfinite(norm)] if self.check_grads and norm is not None else []
        )
        reason = None
        if checks and not bool(torch.stack(checks).all()):  # the one sync; the reason is worked out only when bad
            if loss_ok is not None and not bool(loss_ok):
                last = float(self._loss.float().reshape(-1)[0])
                reason = f"non-finite loss ({last if not math.isfinite(last) else 'an earlier micro-batch'})"
            else:
                reason = f"non-finite gradient norm ({float(norm)})"
        bad = reason is not None
        if trainer.world_size > 1:  # every rank must take the same decision
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
            reason = reason or "non-finite loss or gradients on another process"
        if not bad:
            self.consecutive_skips = 0
            if self.log_grad_norm and norm is not None:
                pl_module.log(GRAD_NORM_TAG, norm, on_step=True, on_epoch=False)
            return
        for p in pl_module.parameters():  # the optimizer skips parameters without a gradient
            p.grad = None
        step = trainer.global_step
        if self.action == "skip":
            self.skipped_steps += 1
            self.consecutive_skips += 1
            pl_module.log(SKIPPED_TAG, float(self.skipped_steps), on_step=True, on_epoch=False)
            rank_zero_warn(
                f"NonFiniteGuard: {reason} at step {step}; step skipped ({self.skipped_steps} so far)"
            )
            if self.max_skips is None or self.consecutive_skips < self.max_skips:
                return
            reason = f"{reason}; {self.consecutive_skips} consecutive steps skipped"
        self.diverged = {"step": step, "reason": f"{reason} at step {step}"}
        trainer.should_stop = True
        rank_zero_warn(
            f"NonFiniteGuard: training stopped, {reason} at step {step}. The step was not applied; the last "
            "checkpoint holds the last finite weights."
        )

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # One value per run, at the step it stopped on: HParams shows a tag's last value, so this is its "diverged"
        # column (0 or 1) beside the metrics, and a diverged run's huge perplexity reads as what it is.
        step = self.diverged["step"] if self.diverged else trainer.global_step
        for logger in trainer.loggers:
            logger.log_metrics({DIVERGED_TAG: float(self.diverged is not None)}, step=step)

    # ---- checkpointed state -----------------------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps, "diverged": self.diverged}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.diverged = state_dict.get("diverged")
