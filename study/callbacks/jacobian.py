"""`AttentionJacobianMonitor`: the softmax Jacobian d a / d l of sampled attention rows, per layer.

Corollary 3 of the paper bounds it by 1/(4T). Read entrywise, that holds for every row by mathematics (each entry
of (1/T)(diag(a) - a a^T) is a_i (1 - a_i) / T or -a_i a_j / T, both at most 1/(4T)); read as a spectral norm it
is false (a = (1/2, 1/2) gives 1/(2T), the exact maximum). So the monitor logs both norms as what they are: the
spectral norm (how strongly the row responds to a logit perturbation), and the largest entry relative to 1/(4T)
(how close real rows come to the entrywise bound, the empirical question), beside the saturated rows whose
Jacobian is ~0 at any T.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from typing_extensions import override

from study import tags
from study.attention import AttentionSpec
from study.callbacks.base import VAL, Sums, TapMonitor
from study.callbacks.layers import LayerChoice
from study.metrics import SATURATED, sample_rows, softmax_jacobian_max_entry, softmax_jacobian_norm

NEAR_BOUND = 0.9  # a row "comes close" to the entrywise bound when its largest entry is >= this x 1/(4T)


class AttentionJacobianMonitor(TapMonitor):
    """Log the attention Jacobian of ``rows`` random rows of every attention call of a logging step (and of every
    validation batch), with T the layer's temperature (top-k rows: the Jacobian with respect to the selected
    keys' logits):

        ``attention/jacobian/layer_{l}``, ``.../mean``, ``.../max``  spectral norm of (1/T)(diag(a) - a a^T): mean
                                              per layer, mean and maximum over every sampled row;
        ``.../entry_ratio_mean``, ``.../entry_ratio_max``  the largest |entry| x 4T (Corollary 3 read entrywise:
                                              at most 1 by mathematics, so the maximum is a check of the code);
        ``.../frac_near_quarter_T``           rows whose largest entry is at least NEAR_BOUND x 1/(4T);
        ``.../frac_saturated``                rows whose max weight exceeds 0.99 (their Jacobian is ~0 at any T);
        ``.../bound_quarter_T``, ``.../bound_half_T``  1/(4T) (the entrywise bound) and 1/(2T) (the spectral
                                              norm's exact maximum), with T the smallest temperature seen.

    Validation epochs log the same tags under ``val/``. Only softmax layers contribute (top-k included): the
    closed form is softmax's (sparsemax's Jacobian is (1/T)(diag(s) - s s^T / |S|) on its support S, of spectral
    norm exactly 1/T). Sums and counts are added across DDP ranks, maxima maxed.

    Args:
        every_n_steps: measure every this many optimizer steps.
        validation: also measure each validation epoch.
        rows: rows sampled per attention call (each costs a bisection over its keys at log time).
        seed: seed of the row sampler (offset by the global rank, so ranks sample different rows).
        layers: the layers to measure and log (indices, negative from the end, and "mid"); None (default) every
            layer; mean and max are then over the chosen layers' rows.

    Example::

        trainer = L.Trainer(callbacks=[AttentionJacobianMonitor(every_n_steps=10, rows=16)])
    """

    # It samples ``rows`` rows per attention call: blocks of rows would multiply the sample and favour the last,
    # shorter block, so its calls keep the dense explicit path.
    row_blocks = False

    def __init__(self, every_n_steps: int = 50, validation: bool = True, rows: int = 16, seed: int = 0,
                 layers: LayerChoice = None) -> None:
        super().__init__(every_n_steps, validation, layers)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an integer >= 1, got {rows!r}")
        self.rows = rows
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)  # training rows; its state is saved in checkpoints
        # Validation rows come from their own sampler, reseeded from (seed, rank, step) at each validation: a
        # validation leaves the training sampler as it was, so a run resumed from a checkpoint written just before
        # a validation samples the training rows the uninterrupted run does.
        self._val_generator = torch.Generator().manual_seed(seed)
        self._restored: Tensor | None = None  # the sampler's state from a checkpoint, applied at fit start
        self._pending: dict[str, list[tuple[int, Tensor, float]]] = {}  # phase -> sampled rows awaiting norms

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        restored, self._restored = self._restored, None
        if restored is not None and trainer.global_rank == 0:
            # Lightning restores callbacks before `on_fit_start`; the checkpoint holds rank zero's sampler.
            self._generator.set_state(restored)
        else:
            # Different rows on each rank (under DDP the other ranks restart theirs from the step on resume).
            self._generator.manual_seed(self.seed + 7919 * trainer.global_rank + 104729 * trainer.global_step)

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

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        if spec.normalizer != "softmax":  # the closed form is softmax's Jacobian
            return {}
        # Only sample here; the norms of every layer's rows come from one batched bisection at log time.
        generator = self._val_generator if self._phase == VAL else self._generator
        rows = sample_rows(weights, allowed, self.rows, generator=generator)
        self._pending.setdefault(self._phase, []).append((layer, rows, spec.temperature))
        return {}

    def before_reduce(self, phase: str) -> None:
        pending = self._pending.pop(phase, [])
        if not pending:
            return
        # Rows of different lengths pad with zero weights, which change neither the spectrum of diag(a) - a a^T
        # nor its largest entry.
        width = max(rows.shape[-1] for _, rows, _ in pending)
        rows = torch.cat([F.pad(r.to(torch.float64), (0, width - r.shape[-1])) for _, r, _ in pending])
        inv_t = torch.cat([rows.new_full((r.shape[0],), 1.0 / t) for _, r, t in pending])
        sizes = [r.shape[0] for _, r, _ in pending]
        norms = (softmax_jacobian_norm(rows, 1.0) * inv_t).split(sizes)
        ratios = (4.0 * softmax_jacobian_max_entry(rows, 1.0)).split(sizes)  # largest entry / (1/(4T))
        saturated = (rows.amax(-1) > SATURATED).to(torch.float64).split(sizes)
        one = torch.ones(1, dtype=torch.float64, device=rows.device)
        for (layer, _, temperature), layer_norms, layer_ratios, layer_sat in zip(pending, norms, ratios, saturated):
            empty = layer_norms.numel() == 0
            self.accumulate(
                phase,
                layer,
                {
                    "jacobian": layer_norms.sum().reshape(1),
                    "rows": one * layer_norms.numel(),
                    "entry_ratio": layer_ratios.sum().reshape(1),
                    "near_quarter": (layer_ratios >= NEAR_BOUND).sum().reshape(1).to(torch.float64),
                    "saturated": layer_sat.sum().reshape(1),
                    "jacobian_max": one * 0.0 if empty else layer_norms.max().reshape(1),
                    "entry_ratio_max": one * 0.0 if empty else layer_ratios.max().reshape(1),
                    "inv_temperature_max": one / temperature,
                },
            )

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        if not sums:
            return {}

        def total(key: str) -> Tensor:
            return torch.stack([s[key].squeeze() for s in sums.values()]).sum()

        def largest(key: str) -> Tensor:
            return torch.stack([s[key].squeeze() for s in sums.values()]).max()

        out: dict[str, Tensor] = {}
        for layer in sorted(sums):
            out[tags.jacobian(f"layer_{layer}")] = (sums[layer]["jacobian"] / sums[layer]["rows"]).squeeze()
        rows = total("rows")
        out[tags.jacobian("mean")] = total("jacobian") / rows
        out[tags.jacobian("max")] = largest("jacobian_max")
        out[tags.jacobian("entry_ratio_mean")] = total("entry_ratio") / rows
        out[tags.jacobian("entry_ratio_max")] = largest("entry_ratio_max")
        out[tags.jacobian("frac_near_quarter_T")] = total("near_quarter") / rows
        out[tags.jacobian("frac_saturated")] = total("saturated") / rows
        inv_t = largest("inv_temperature_max")
        out[tags.jacobian("bound_quarter_T")] = inv_t / 4
        out[tags.jacobian("bound_half_T")] = inv_t / 2
        return out


__all__ = ["NEAR_BOUND", "AttentionJacobianMonitor"]
