"""`GradientNormMonitor`: gradient norms before and after clipping, grouped, and the attention Jacobian norm."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from study import tags
from study.attention import AttentionSpec
from study.callbacks.base import TRAIN, VAL, Sums, TapMonitor
from study.metrics import (
    SATURATED,
    grouped_grad_norms,
    nonfinite_grad_count,
    sample_rows,
    softmax_jacobian_norm,
    total_grad_norm,
)


class GradientNormMonitor(TapMonitor):
    """Log gradient norms (before and after clipping, per block and per kind) and the attention Jacobian norm.

    Gradient norms, every ``every_n_steps`` optimizer steps:
        ``grad_norm/total``           L2 norm of all gradients before clipping (``on_before_optimizer_step``
                                      runs before Lightning clips), as `torch.nn.utils.get_total_norm` gives it;
        ``grad_norm/total_clipped``   the same after clipping: measured in a step post-hook of the optimizer,
                                      which runs after Lightning's closure (backward, this hook, clipping) and the
                                      update, while the gradients are still there. (A step PRE-hook would run
                                      before the closure and see the previous step's or no gradients.) Equals
                                      ``min(total, gradient_clip_val)`` with norm clipping. Absent on steps the
                                      optimizer skips (AMP overflow);
        ``grad_norm/block_{i}``, ``grad_norm/block_none``  per transformer block / outside blocks;
        ``grad_norm/{kind}``          ``attn_q``, ``attn_k``, ``attn_v``, ``attn_out``, ``mlp``, ``embedding``,
                                      ``norm``, ``head``, ... (`study.metrics.parameter_kind`; fused qkv split);
        ``grad_norm/nonfinite_count`` NaN/inf gradient elements;
        ``grad_norm/param/{name}``    per parameter, only every ``per_parameter_every_n_steps`` (opt-in: one tag
                                      per parameter is costly to write).

    Attention Jacobian, on ``jacobian_rows`` random rows of every attention call of a logging step (and of
    every validation batch): the spectral norm of d a / d l = (1/T)(diag(a) - a a^T), T the layer's temperature
    (for top-k rows, the Jacobian with respect to the selected keys' logits):
        ``attention/jacobian/layer_{l}``, ``attention/jacobian/mean`` (mean over sampled rows),
        ``attention/jacobian/max``, ``attention/jacobian/frac_above_quarter_T`` (rows above 1/(4T)),
        ``attention/jacobian/frac_above_sqrt2`` (rows above sqrt 2: with 1/(4T), the paper's stated bound is
        min(1/(4T), sqrt 2)), ``attention/jacobian/frac_saturated`` (sampled rows whose max weight exceeds 0.99:
        their Jacobian is ~0 whatever T, so a 1/T law can only show on the others),
        ``attention/jacobian/bound_quarter_T`` = 1/(4T) (the paper's Corollary 3) and
        ``attention/jacobian/bound_half_T`` = 1/(2T) (the exact maximum), with T the smallest temperature seen.
    Validation epochs log the Jacobian tags under ``val/``. Only softmax layers contribute (top-k included):
    the closed form is softmax's, and other normalisers have other Jacobians (sparsemax's is
    (1/T)(diag(s) - s s^T / |S|) on its support S, of norm exactly 1/T).

    Gradients are identical on every rank after DDP's all-reduce, so their norms are averaged across ranks (a
    no-op that keeps the ranks consistent); the Jacobian sums and counts are added, maxima maxed.

    Args:
        every_n_steps: log every this many optimizer steps.
        validation: also log the Jacobian over each validation epoch.
        by: gradient groupings, any of "block", "kind", "block_kind" (see `study.metrics.grouped_grad_norms`).
        per_parameter_every_n_steps: also log one norm per parameter every this many steps (None: never).
        jacobian_rows: rows sampled per attention call for the Jacobian (each costs an Lk x Lk eigenproblem);
            0 disables the Jacobian and the tap.
        seed: seed of the row sampler (offset by the global rank, so ranks sample different rows).

    Example::

        trainer = L.Trainer(gradient_clip_val=1.0, callbacks=[GradientNormMonitor(every_n_steps=10)])
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        validation: bool = True,
        by: tuple[str, ...] = ("block", "kind"),
        per_parameter_every_n_steps: int | None = None,
        jacobian_rows: int = 16,
        seed: int = 0,
    ) -> None:
        super().__init__(every_n_steps, validation)
        if per_parameter_every_n_steps is not None and per_parameter_every_n_steps < 1:
            raise ValueError(f"per_parameter_every_n_steps must be None or >= 1, got {per_parameter_every_n_steps}")
        self.by = tuple(by)
        self.per_parameter_every_n_steps = per_parameter_every_n_steps
        self.jacobian_rows = jacobian_rows
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)  # training rows; its state is saved in checkpoints
        # Validation rows come from their own sampler, reseeded from (seed, rank, step) at each validation: a
        # validation leaves the training sampler as it was, so a run resumed from a checkpoint written just before
        # a validation samples the training rows the uninterrupted run does.
        self._val_generator = torch.Generator().manual_seed(seed)
        self._module: L.LightningModule | None = None
        self._hooks: list[Any] = []
        self._pre: dict[str, Tensor] | None = None
        self._post: Tensor | None = None
        self._pending: dict[str, list[tuple[int, Tensor, float]]] = {}  # phase -> sampled rows awaiting norms
        self._restored: Tensor | None = None  # the sampler's state from a checkpoint, applied at fit start

    # ----- the tap: Jacobian norm on sampled rows ----------------------------------------------------------

    def wants_tap(self, trainer: L.Trainer, phase: str, batch_idx: int, dataloader_idx: int = 0) -> bool:
        return self.jacobian_rows > 0 and super().wants_tap(trainer, phase, batch_idx, dataloader_idx)

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        if spec.normalizer != "softmax":  # the closed form is softmax's Jacobian
            return {}
        # Only sample here; the norms of every layer's rows come from one batched root-finding at log time.
        generator = self._val_generator if self._phase == VAL else self._generator
        rows = sample_rows(weights, allowed, self.jacobian_rows, generator=generator)
        self._pending.setdefault(self._phase, []).append((layer, rows, spec.temperature))
        return {}

    def before_reduce(self, phase: str) -> None:
        pending = self._pending.pop(phase, [])
        if not pending:
            return
        # Rows of different lengths pad with zero weights, which leave diag(a) - a a^T's spectrum unchanged.
        width = max(rows.shape[-1] for _, rows, _ in pending)
        rows = torch.cat([F.pad(r.to(torch.float64), (0, width - r.shape[-1])) for _, r, _ in pending])
        inv_t = torch.cat([rows.new_full((r.shape[0],), 1.0 / t) for _, r, t in pending])
        sizes = [r.shape[0] for _, r, _ in pending]
        norms = (softmax_jacobian_norm(rows, 1.0) * inv_t).split(sizes)
        saturated = (rows.amax(-1) > SATURATED).to(torch.float64).split(sizes)
        one = torch.ones(1, dtype=torch.float64, device=rows.device)
        for (layer, _, temperature), layer_norms, layer_sat in zip(pending, norms, saturated):
            self.accumulate(
                phase,
                layer,
                {
                    "jacobian": layer_norms.sum().reshape(1),
                    "rows": one * layer_norms.numel(),
                    "above_quarter": (layer_norms > 1.0 / (4.0 * temperature)).sum().reshape(1).to(torch.float64),
                    "above_sqrt2": (layer_norms > math.sqrt(2.0)).sum().reshape(1).to(torch.float64),
                    "saturated": layer_sat.sum().reshape(1),
                    "jacobian_max": layer_norms.max().reshape(1) if layer_norms.numel() else one * 0.0,
                    "inv_temperature_max": one / temperature,
                },
            )

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if phase == TRAIN:
            out.update(self._gradient_metrics(trainer))
        if sums:
            rows = {layer: s["rows"] for layer, s in sums.items()}
            for layer in sorted(sums):
                out[tags.jacobian(f"layer_{layer}")] = (sums[layer]["jacobian"] / rows[layer]).squeeze()
            total_rows = torch.stack([r.squeeze() for r in rows.values()]).sum()
            out[tags.jacobian("mean")] = torch.stack([s["jacobian"].squeeze() for s in sums.values()]).sum() / total_rows
            out[tags.jacobian("max")] = torch.stack([s["jacobian_max"].squeeze() for s in sums.values()]).max()
            above = torch.stack([s["above_quarter"].squeeze() for s in sums.values()]).sum()
            out[tags.jacobian("frac_above_quarter_T")] = above / total_rows
            for key, tag in (("above_sqrt2", "frac_above_sqrt2"), ("saturated", "frac_saturated")):
                out[tags.jacobian(tag)] = torch.stack([s[key].squeeze() for s in sums.values()]).sum() / total_rows
            inv_t = torch.stack([s["inv_temperature_max"].squeeze() for s in sums.values()]).max()
            out[tags.jacobian("bound_quarter_T")] = inv_t / 4
            out[tags.jacobian("bound_half_T")] = inv_t / 2
        return out

    # ----- gradients ---------------------------------------------------------------------------------------

    def _grad_due(self, trainer: L.Trainer) -> bool:
        return trainer.global_step % self.every_n_steps == 0

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_start(trainer, pl_module)
        self._val_generator.manual_seed(self.seed + 1 + 7919 * trainer.global_rank + 104729 * trainer.global_step)

    @override
    def state_dict(self) -> dict[str, Any]:
        # The row sampler's state: a resumed run samples the rows the uninterrupted run would have.
        return {**super().state_dict(), "generator": self._generator.get_state()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._restored = state_dict.get("generator")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._module = pl_module
        restored, self._restored = self._restored, None
        if restored is not None and trainer.global_rank == 0:
            # Lightning restores callbacks before `on_fit_start`; the checkpoint holds rank zero's sampler.
            self._generator.set_state(restored)
        else:
            # Different rows on each rank (under DDP the other ranks restart theirs from the step on resume).
            self._generator.manual_seed(self.seed + 7919 * trainer.global_rank + 104729 * trainer.global_step)
        for optimizer in trainer.optimizers:
            self._hooks.append(optimizer.register_step_post_hook(self._after_optimizer_step))

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer) -> None:
        # Before clipping. With several optimizers the first call of a step measures every parameter once.
        if not self._grad_due(trainer) or self._pre is not None:
            return
        named = [(n, p) for n, p in pl_module.named_parameters() if p.grad is not None]
        pre = {tags.grad_norm(k): v for k, v in grouped_grad_norms(named, by=self.by).items()}
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
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        # Gradients are logged on the same steps even when the Jacobian tap is off (jacobian_rows=0).
        if self._grad_due(trainer) and self._window_step is None:
            self._window_step = trainer.global_step


__all__ = ["GradientNormMonitor"]
