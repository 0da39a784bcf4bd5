"""`AttentionSinkMonitor`: how much attention goes to the first visible key (the attention sink), per layer, and the
sink rate of Gu et al. 2025 ("When attention sink emerges in language models", ICLR): the share of (layer, head)
pairs whose mean weight on the first token exceeds a threshold (0.3 there; 70% of GPT-2-XL's heads, 91% of
Llama-3-8B's on random tokens). Low temperatures and top-k move mass between keys: this says how much of it lands
on the first one.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from study import tags
from study.attention import AttentionSpec
from study.attention.rowstats import RowStatistics
from study.callbacks.base import Sums, TapMonitor, layer_spread, nanmean, row_distribution
from study.callbacks.layers import LayerChoice

SINK_THRESHOLD = 0.3
"""Gu et al. 2025's threshold on a head's mean first-token weight."""


def first_key_sums(weights: Tensor, allowed: Tensor) -> dict[str, Tensor]:
    """Per head: the rows that see at least one key, and the sum over them of the weight on their first visible key
    (key 0 for causal attention without padding; the first key the mask leaves with left padding)."""
    allowed = allowed.expand(*allowed.shape[:-1], weights.shape[-1])
    first = allowed.to(torch.uint8).argmax(dim=-1, keepdim=True)  # the first True of each row (argmax takes the first)
    seen = allowed.any(dim=-1)
    index = first.expand(*weights.shape[:-1], 1)
    on_first = weights.gather(-1, index).squeeze(-1) * seen
    heads = (0, 2)
    return {
        "first_key_rows": seen.expand(on_first.shape).sum(heads).to(torch.float64),
        "first_key_weight": on_first.to(torch.float64).sum(heads),
    }


class AttentionSinkMonitor(TapMonitor):
    """Log the mean weight on the first visible key per layer and the sink rate.

    Per head, the mean over every row that sees a key (every query position of every tapped batch, as Gu et al.'s
    mean over tokens t of A[t, 1]; the first query sees only the first key and puts all its weight there) of the
    row's weight on its first visible key. A head is a sink head when that mean exceeds ``threshold``.

    Tags (``val/`` prefixed for validation epochs):
        ``attention/first_key_weight/layer_{l}``  mean over the layer's heads (``.../head_{h}`` with ``per_head``),
        ``attention/first_key_weight/mean``, ``.../layer_min``, ``.../layer_max``  over the logged layers;
        ``attention/sink_rate/layer_{l}``  the share of the layer's heads that are sink heads;
        ``attention/sink_rate/mean``  the sink rate: the share of every logged (layer, head) pair.

    For a normaliser whose rows do not sum to 1 (Self-Adjust Softmax) the weights are read as |w| / sum |w|.

    Args:
        every_n_steps: tap and log every this many optimizer steps.
        validation: also aggregate over each validation epoch and log ``val/...``.
        threshold: a head's mean first-key weight above which it counts as a sink (default 0.3, as Gu et al.).
        per_head: also log each head's first-key weight.
        layers: the layers to log (indices, negative from the end, and "mid"); None (default) every layer.

    Example::

        trainer = L.Trainer(callbacks=[AttentionSinkMonitor(every_n_steps=50)])
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        validation: bool = True,
        threshold: float = SINK_THRESHOLD,
        per_head: bool = False,
        layers: LayerChoice = None,
    ) -> None:
        super().__init__(every_n_steps, validation, layers)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold < 1:
            raise ValueError(f"threshold must be a number in [0, 1), got {threshold!r}")
        self.threshold = float(threshold)
        self.per_head = per_head

    row_statistics = frozenset({"first_key"})

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        return first_key_sums(row_distribution(weights, spec), allowed)

    def summarize_row_statistics(self, layer: int, rows: RowStatistics, spec: AttentionSpec) -> dict[str, Tensor]:
        seen = rows.visible > 0
        heads = (0, 2)
        return {
            "first_key_rows": seen.sum(heads).to(torch.float64),
            "first_key_weight": torch.where(seen, rows.first_key_weight, 0.0).to(torch.float64).sum(heads),
        }

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        per_head = {layer: s["first_key_weight"] / s["first_key_rows"] for layer, s in sorted(sums.items()) if s}
        if not per_head:
            return {}
        out: dict[str, Tensor] = {}
        sinks = {layer: (heads > self.threshold).to(torch.float64) for layer, heads in per_head.items()}
        for layer, heads in per_head.items():
            out[tags.attention("first_key_weight", layer)] = nanmean(heads)
            if self.per_head:
                for h, value in enumerate(heads):
                    out[tags.attention("first_key_weight", layer, h)] = value
            out[tags.attention("sink_rate", layer)] = sinks[layer].mean()
        out[tags.attention("first_key_weight")] = nanmean(torch.cat(list(per_head.values())))
        out.update(layer_spread("first_key_weight", torch.stack([nanmean(h) for h in per_head.values()])))
        out[tags.attention("sink_rate")] = torch.cat(list(sinks.values())).mean()
        return out


__all__ = ["SINK_THRESHOLD", "AttentionSinkMonitor", "first_key_sums"]
