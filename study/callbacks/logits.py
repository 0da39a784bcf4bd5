"""`AttentionLogitMonitor`: the largest attention logit per layer (and head), the instability signal of the
stability literature, beside the mean and spread of the visible logits.

Wortsman et al. 2023 (arXiv 2309.14322) and Dehghani et al. 2023 (ViT-22B) watch the largest attention logit grow
until attention is one-hot and the loss diverges; Kimi K2's QK-Clip, Megatron's ``log_max_attention_logit``,
torchtitan and maxtext log it per head, reduced across ranks with a MAX. A temperature is a scale on exactly
those logits, so both are logged: the logit the normaliser sees, z = q.k / (T sqrt(d)), and the model's own
q.k / sqrt(d) before T, whose ratio is T in every layer (T's share of a large logit against the weights' share).
"""

from __future__ import annotations

import math

import lightning as L
import torch
from torch import Tensor

from study import tags
from study.attention import AttentionLogits, AttentionSpec
from study.attention.rowstats import RowStatistics
from study.callbacks.base import Sums, TapMonitor, layer_spread, nanmean
from study.callbacks.layers import LayerChoice

MAXIMA = {"max_logit": "scaled_max", "max_logit_raw": "raw_max"}
"""Statistic (tag name) -> the key of its per-head maximum in the sums (``*_max``: reduced with a MAX)."""


def logit_sums(logits: AttentionLogits) -> dict[str, Tensor]:
    """Per-head sums of one call's (or block's) visible logits: their count, sum and sum of squares (float64,
    from rows centred on their own mean, so a large common offset at small T loses no precision), and the
    largest scaled and raw logit (-inf for a head that sees no key)."""
    z, raw = logits.scaled, logits.raw
    visible = logits.visible.expand(z.shape)
    hidden = ~visible
    heads = (0, 2)  # (B, H, rows): sum over batch and rows, one value per head
    count = visible.sum(-1)
    centred = z.masked_fill(hidden, 0.0)  # one working copy, reused in place (a logging step's cost)
    row_sum = centred.sum(-1)
    row_mean = row_sum / count.clamp(min=1)
    row_m2 = centred.sub_(row_mean[..., None]).masked_fill_(hidden, 0.0).square_().sum(-1)
    row_mean64 = row_mean.to(torch.float64)
    return {
        "logits": count.sum(heads).to(torch.float64),
        "logit_sum": row_sum.to(torch.float64).sum(heads),
        "logit_square_sum": (row_m2.to(torch.float64) + count * row_mean64.square()).sum(heads),
        "scaled_max": z.masked_fill(hidden, -math.inf).amax(dim=(0, 2, 3)),
        "raw_max": raw.masked_fill(hidden, -math.inf).amax(dim=(0, 2, 3)),
    }


def _pooled(count: Tensor, total: Tensor, squares: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation from a count, a sum and a sum of squares (NaN with no logit)."""
    count = count.to(torch.float64)
    mean = total / count
    return mean, (squares / count - mean.square()).clamp(min=0).sqrt()


def _no_data(value: Tensor) -> Tensor:
    """-inf (a maximum over nothing) as NaN: no data, as the other monitors write it."""
    value = value.to(torch.float64)
    return torch.where(value.isneginf(), math.nan, value)


class AttentionLogitMonitor(TapMonitor):
    """Log the largest attention logit per layer (the stability literature's MaxLogit), raw and scaled by T, and
    the mean and standard deviation of the visible logits.

    Over the visible keys of every row (causal, padding and window masks; before top-k selection, which picks
    among these logits and keeps the largest) of the tapped batches:
        ``max_logit``      the largest logit the normaliser sees, q.k / (T sqrt(d)) (``scaling / T`` for a model
                           with its own scale; after its soft-capping and biases, if any);
        ``max_logit_raw``  the largest q.k / sqrt(d), before T: in every layer ``max_logit = max_logit_raw / T``;
        ``logit_mean``, ``logit_std``  mean and standard deviation of the visible scaled logits, pooled over the
                           layer's heads, rows and keys.

    Tags (``val/`` prefixed for validation epochs): ``attention/{statistic}/layer_{l}``; for the maxima the layer
    value is the maximum over its heads, ``.../layer_max`` the maximum over the logged layers (the run's MaxLogit),
    ``.../layer_min`` the smallest layer maximum and ``.../mean`` the mean of the layer maxima; for the mean and
    std, ``.../mean`` pools every logged layer and ``layer_min``, ``layer_max`` are the extreme layer values. With
    ``per_head``: ``.../layer_{l}/head_{h}``. Maxima are reduced across DDP ranks with a MAX, the sums with a SUM.

    On the fused SDPA path the statistics come from the call's row statistics (`study.attention.rowstats`: the
    maxima and the moments merged over blocks of keys, no map) while every open tap reads those; otherwise from the
    logits the explicit path hands the taps (`study.attention.AttentionLogits`), a block of rows at a time on the
    blockwise path (maxima and sums merge exactly). A sink logit (gpt-oss) is not a key's logit and is left out.

    Args:
        every_n_steps: tap and log every this many optimizer steps.
        validation: also aggregate over each validation epoch and log ``val/...``.
        per_head: also log one scalar per head.
        layers: the layers to log (indices, negative from the end, and "mid"); None (default) every layer.

    Example::

        trainer = L.Trainer(callbacks=[AttentionLogitMonitor(every_n_steps=50, layers=[0, 1, "mid", -2, -1])])
    """

    def __init__(
        self, every_n_steps: int = 50, validation: bool = True, per_head: bool = False, layers: LayerChoice = None
    ) -> None:
        super().__init__(every_n_steps, validation, layers)
        self.per_head = per_head

    def observe_logits(self, layer: int, logits: AttentionLogits) -> None:
        if self._phase is None or not self.selects(layer):
            return
        self.accumulate(self._phase, layer, logit_sums(logits))

    row_statistics = frozenset({"max_logit", "logit_moments"})

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        return {}  # everything comes from the logits (`observe_logits`)

    def summarize_row_statistics(self, layer: int, rows: RowStatistics, spec: AttentionSpec) -> dict[str, Tensor]:
        heads = (0, 2)
        return {
            "logits": rows.logit_count.sum(heads),
            "logit_sum": rows.logit_sum.sum(heads),
            "logit_square_sum": (rows.logit_m2 + rows.logit_count * (rows.logit_sum / rows.logit_count.clamp(min=1))
                                 .square()).sum(heads),
            "scaled_max": rows.scaled_max.amax(dim=(0, 2)),
            "raw_max": rows.raw_max.amax(dim=(0, 2)),
        }

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        sums = {layer: s for layer, s in sorted(sums.items()) if s}
        if not sums:
            return {}
        out: dict[str, Tensor] = {}
        for statistic, key in MAXIMA.items():
            layer_values = {}
            for layer, s in sums.items():
                heads = _no_data(s[key])
                layer_values[layer] = _no_data(s[key].max())
                out[tags.attention(statistic, layer)] = layer_values[layer]
                if self.per_head:
                    for h, value in enumerate(heads):
                        out[tags.attention(statistic, layer, h)] = value
            values = torch.stack(list(layer_values.values()))
            out[tags.attention(statistic)] = nanmean(values)
            out.update(layer_spread(statistic, values))
        pooled = {layer: _pooled(s["logits"].sum(), s["logit_sum"].sum(), s["logit_square_sum"].sum())
                  for layer, s in sums.items()}
        everything = _pooled(*(sum(s[k].sum() for s in sums.values()) for k in ("logits", "logit_sum", "logit_square_sum")))
        for index, statistic in enumerate(("logit_mean", "logit_std")):
            for layer, s in sums.items():
                out[tags.attention(statistic, layer)] = pooled[layer][index]
                if self.per_head:
                    for h, value in enumerate(_pooled(s["logits"], s["logit_sum"], s["logit_square_sum"])[index]):
                        out[tags.attention(statistic, layer, h)] = value
            out[tags.attention(statistic)] = everything[index]
            out.update(layer_spread(statistic, torch.stack([pooled[layer][index] for layer in sums])))
        return out


__all__ = ["AttentionLogitMonitor", "logit_sums"]
