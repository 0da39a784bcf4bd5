"""`GradientNormMonitor`: gradient norms before and after clipping, in total, per block, per kind and per
block and kind (the per-layer sensitivity of W_q/W_k beside the W_v, W_o and MLP controls)."""

from __future__ import annotations

import re
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from study import tags
from study.callbacks.base import due, last_step, write_scalars
from study.callbacks.layers import LayerChoice, check_layers, resolve_layers
from study.metrics import grouped_grad_norms, nonfinite_grad_count, total_grad_norm

_BLOCK = re.compile(re.escape(tags.GRAD_GROUP_BLOCK_PREFIX) + r"(\d+)(?:/|$)")  # a grouped norm's block: block_3, block_3/attn_q


class GradientNormMonitor(Callback):
    """Log gradient norms every ``every_n_steps`` optimizer steps (step 0 included: the gradient of the model as
    it was before any update):

        ``grad_norm/total``           L2 norm of all gradients before clipping (``on_before_optimizer_step``
                                      runs before Lightning clips), as `torch.nn.utils.get_total_norm` gives it;
        ``grad_norm/total_clipped``   the same after clipping: measured in a step post-hook of the optimizer,
                                      which runs after Lightning's closure (backward, this hook, clipping) and the
                                      update, while the gradients are still there. (A step PRE-hook would run
                                      before the closure and see the previous step's or no gradients.) Equals
                                      ``min(total, gradient_clip_val)`` with norm clipping. Absent on steps the
                                      optimizer skips (AMP overflow);
        ``grad_norm/block_{i}``, ``grad_norm/block_none``  per transformer block / outside blocks (``by`` "block");
        ``grad_norm/{kind}``          ``attn_q``, ``attn_k``, ``attn_v``, ``attn_out``, ``mlp``, ``embedding``,
                                      ``norm``, ``head``, ... (`study.metrics.parameter_kind`; fused qkv split);
        ``grad_norm/block_{i}/{kind}`` per block and kind (``by`` "block_kind"): W_q/W_k of each layer beside
                                      that layer's W_v, W_o and MLP, the controls of a per-layer 1/T reading;
        ``grad_norm/nonfinite_count`` NaN/inf gradient elements;
        ``grad_norm/param/{name}``    per parameter, only every ``per_parameter_every_n_steps`` (opt-in: one tag
                                      per parameter is costly to write).

    Frozen parameters have no gradient and no tag (attention-only fine-tuning logs no ``mlp``). Gradients are
    identical on every rank after DDP's all-reduce, so their norms are averaged across ranks (a no-op that keeps
    the ranks consistent). The attention Jacobian is `study.callbacks.AttentionJacobianMonitor`'s.

    Args:
        every_n_steps: log every this many optimizer steps.
        by: gradient groupings, any of "block", "kind", "block_kind" (see `study.metrics.grouped_grad_norms`).
        per_parameter_every_n_steps: also log one norm per parameter every this many steps (None: never).
        layers: the blocks whose ``block_{i}`` and ``block_{i}/{kind}`` norms are logged (indices, negative from
            the end, and "mid", resolved against the blocks that have gradients); None (default) every block. The
            total and per-kind norms always cover every parameter.

    Example::

        trainer = L.Trainer(gradient_clip_val=1.0, callbacks=[GradientNormMonitor(every_n_steps=10)])
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        by: tuple[str, ...] = ("block", "kind"),
        per_parameter_every_n_steps: int | None = None,
        layers: LayerChoice = None,
    ) -> None:
        super().__init__()
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an integer >= 1, got {every_n_steps!r}")
        if per_parameter_every_n_steps is not None and per_parameter_every_n_steps < 1:
            raise ValueError(f"per_parameter_every_n_steps must be None or >= 1, got {per_parameter_every_n_steps}")
        unknown = sorted(set(by) - {"block", "kind", "block_kind"})
        if unknown:
            raise ValueError(f"by={tuple(by)!r}: unknown grouping(s) {unknown}; choose from block, kind, block_kind")
        self.every_n_steps = every_n_steps
        self.by = tuple(by)
        self.per_parameter_every_n_steps = per_parameter_every_n_steps
        self.layers = check_layers(layers)
        self._module: L.LightningModule | None = None
        self._hooks: list[Any] = []
        self._pre: dict[str, Tensor] | None = None
        self._pre_step: int | None = None
        self._post: Tensor | None = None

    # ----- gradients ---------------------------------------------------------------------------------------

    def _grad_due(self, trainer: L.Trainer) -> bool:
        return due(trainer.global_step, self.every_n_steps, last_step(trainer))

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._module = pl_module
        for optimizer in trainer.optimizers:
            self._hooks.append(optimizer.register_step_post_hook(self._after_optimizer_step))

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer) -> None:
        # Before clipping. With several optimizers the first call of a step measures every parameter once.
        if not self._grad_due(trainer) or self._pre is not None:
            return
        named = [(n, p) for n, p in pl_module.named_parameters() if p.grad is not None]
        pre = {tags.grad_norm(k): v for k, v in self._chosen_blocks(grouped_grad_norms(named, by=self.by)).items()}
        # The total as clip_grad_norm_ computes it (norm of per-tensor norms), not the grouped sum of squares.
        pre[tags.GRAD_NORM] = total_grad_norm([p for _, p in named])
        # Any NaN/inf element makes the total non-finite, so a finite total means a count of 0 without another
        # pass over every gradient (one host sync, on logging steps only).
        total = pre[tags.GRAD_NORM]
        pre[tags.GRAD_NORM_NONFINITE] = (
            torch.zeros((), dtype=torch.float64, device=total.device)
            if bool(torch.isfinite(total))
            else nonfinite_grad_count([p for _, p in named]).to(torch.float64)
        )
        n = self.per_parameter_every_n_steps
        if n is not None and trainer.global_step % n == 0:
            for name, p in named:
                pre[tags.grad_norm(f"param/{name}")] = torch.linalg.vector_norm(p.grad, dtype=torch.float32)
        self._pre = pre
        self._pre_step = trainer.global_step

    def _chosen_blocks(self, grouped: dict[str, Tensor]) -> dict[str, Tensor]:
        """The grouped norms without the blocks ``layers`` leaves out (blocks counted from the names that have one)."""
        if self.layers is None:
            return grouped
        blocks = {key: int(m.group(1)) for key in grouped if (m := _BLOCK.match(key))}
        if not blocks:
            return grouped
        chosen = resolve_layers(self.layers, max(blocks.values()) + 1)
        return {key: value for key, value in grouped.items() if key not in blocks or blocks[key] in chosen}

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        # After Lightning's closure has clipped the gradients and the optimizer has used them.
        if self._pre is not None and self._post is None and self._module is not None:
            self._post = total_grad_norm([p for p in self._module.parameters() if p.grad is not None])

    def _gradient_metrics(self, trainer: L.Trainer) -> dict[str, Tensor]:
        pre, post = self._pre, self._post
        self._pre, self._post = None, None
        if pre is None:
            return {}
        values = dict(pre)
        if post is not None:
            values[tags.GRAD_NORM_CLIPPED] = post
        device = values[tags.GRAD_NORM].device
        flat = torch.stack([v.to(device=device, dtype=torch.float64).reshape(()) for v in values.values()])
        if trainer.world_size > 1:
            flat = trainer.strategy.reduce(flat, reduce_op="mean")
        return dict(zip(values, flat.unbind()))

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        # Log once the optimizer has stepped (an accumulation window's micro-batches make one gradient).
        if self._pre_step is not None and trainer.global_step > self._pre_step:
            step, self._pre_step = self._pre_step, None
            values = self._gradient_metrics(trainer)
            if values:
                metrics = dict(zip(values, torch.stack(list(values.values())).tolist()))  # one host sync
                write_scalars(trainer, metrics, step)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._pre, self._post, self._pre_step = None, None, None


__all__ = ["GradientNormMonitor"]
