"""Attention monitors: row entropy, distance to uniform and selection statistics (maps: `study.callbacks.maps`).

All of them are model-agnostic: they see attention through `study.attention` taps, so they work on any
transformers model after `apply_attention_spec` and on any model that calls `study.attention.attend`.
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch
from torch import Tensor

from study import tags
from study.attention import AttentionSpec
from study.attention.rowstats import RowStatistics
from study.callbacks.base import (
    Sums,
    TapMonitor,
    call_entropy_sums,
    known_row_entropy,
    layer_spread,
    nanmean,
    row_distribution,
    tensorboard_writers,
)
from study.callbacks.layers import LayerChoice
from study.metrics import VISIBLE_BINS, finalize, row_entropy_sums, summarize_row_values, summarize_rows


def _layer_and_mean(name: str, per_layer: dict[int, Tensor], per_head: bool) -> dict[str, Tensor]:
    """`attention/{name}/layer_{l}` (mean over heads), optional `.../head_{h}`, and `attention/{name}/mean`."""
    out: dict[str, Tensor] = {}
    for layer, heads in sorted(per_layer.items()):
        out[tags.attention(name, layer)] = nanmean(heads)
        if per_head:
            for h, value in enumerate(heads):
                out[tags.attention(name, layer, h)] = value
    if per_layer:
        out[tags.attention(name)] = nanmean(torch.cat([per_layer[k].reshape(-1) for k in sorted(per_layer)]))
        # the spread over layers (of the layer values), the band around the mean in the custom-scalars charts
        # (NaN = a layer with no counted row is left out, without a host sync; NaN if every layer is)
        out.update(layer_spread(name, torch.stack([nanmean(heads) for _, heads in sorted(per_layer.items())])))
    return out


def _by_visible_means(binned: Sums) -> dict[str, Tensor]:
    """Mean over every layer, head and row of each visible-count bin: ``attention/by_visible/{stat}/n{2^b}``."""
    if not binned or not all(binned.values()):
        return {}
    total = {key: sum(s[key].sum(0) for s in binned.values()) for key in next(iter(binned.values()))}
    rows = total["by_n/rows"]
    out: dict[str, Tensor] = {}
    # Which bins hold rows is fixed by the sequence length; this one host read happens on logging steps only.
    counts = rows.tolist()
    for b in range(VISIBLE_BINS):
        if counts[b] <= 0:
            continue
        out[tags.by_visible("max_weight", 2**b)] = total["by_n/max_weight"][b] / rows[b]
        if b >= 1:
            out[tags.by_visible("normalized_entropy", 2**b)] = total["by_n/normalized_entropy"][b] / rows[b]
    return out


class AttentionEntropyMonitor(TapMonitor):
    """Log the row entropy of attention per layer, its normalised value, and a histogram over heads.

    Per head, the mean over rows of H = -sum a log a (nats) and of H / log(n), where n is the number of keys
    the query may see (1 = uniform over them, 0 = one key; rows with n = 1 are left out of the normalised
    mean). A layer's value is the mean over its heads; ``mean`` is the mean over all layers and heads.
    Sparse normalisers (sparsemax, entmax) put exact zeros in rows: 0 log 0 = 0. For a normaliser whose rows do
    not sum to 1 (Self-Adjust Softmax) the statistics describe |w| / sum |w|.

    Tags (``val/`` prefixed for validation epochs):
        ``attention/entropy/layer_{l}``, ``attention/entropy/mean``,
        ``attention/normalized_entropy/layer_{l}``, ``attention/normalized_entropy/mean``,
        with ``per_head``: ``attention/entropy/layer_{l}/head_{h}`` (and normalized),
        histogram (TensorBoard, rank 0): ``attention/normalized_entropy/heads`` over every (layer, head).

    Args:
        every_n_steps: tap and log every this many optimizer steps.
        validation: also aggregate over each validation epoch and log ``val/...``.
        per_head: also log one scalar per head.
        histogram: write the histogram over heads.
        layers: the layers to log (indices, negative from the end, and "mid"); None (default) every layer.

    Example::

        from study.callbacks import AttentionEntropyMonitor
        trainer = L.Trainer(callbacks=[AttentionEntropyMonitor(every_n_steps=100)], logger=TensorBoardLogger("logs"))
    """

    def __init__(
        self, every_n_steps: int = 50, validation: bool = True, per_head: bool = False, histogram: bool = True,
        layers: LayerChoice = None,
    ) -> None:
        super().__init__(every_n_steps, validation, layers)
        self.per_head = per_head
        self.histogram = histogram

    row_statistics = frozenset({"entropy"})

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        return call_entropy_sums(weights, allowed, spec)

    def summarize_row_statistics(self, layer: int, rows: RowStatistics, spec: AttentionSpec) -> dict[str, Tensor]:
        return row_entropy_sums(rows.entropy, rows.visible)

    def _per_head(self, sums: Sums) -> dict[str, dict[int, Tensor]]:
        means = {layer: finalize(s) for layer, s in sums.items()}
        return {name: {layer: m[name] for layer, m in means.items()} for name in ("entropy", "normalized_entropy")}

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, per_layer in self._per_head(sums).items():
            out.update(_layer_and_mean(name, per_layer, self.per_head))
        return out

    def write_rank_zero(self, trainer: L.Trainer, sums: Sums, prefix: str, step: int) -> None:
        if not self.histogram or not sums:
            return
        per_layer = self._per_head(sums)["normalized_entropy"]
        heads = torch.cat([per_layer[k].reshape(-1) for k in sorted(per_layer)]).cpu()
        heads = heads[~heads.isnan()]
        if heads.numel():
            for writer in tensorboard_writers(trainer):
                writer.add_histogram(prefix + tags.ENTROPY_HEADS_HISTOGRAM, heads, step)


class SelectionUniformityMonitor(TapMonitor):
    """Log how far attention rows are from uniform, how concentrated they are, and how uniform the top-k is.

    Per layer (mean over heads of per-head means over rows) and overall:
        ``kl_uniform``         KL(a || uniform over the visible keys) = log n - H (0 = uniform);
        ``tv_uniform``         total variation to that uniform distribution;
        ``max_weight``         the largest weight of the row;
        ``effective_support``  exp(H), the number of keys a uniform row with the same entropy covers;
        ``nonzero``            weights that are not exactly zero (the support of sparse normalisers / top-k);
        ``saturated``          fraction of rows whose max weight exceeds 0.99 (their Jacobian is ~0 at any T);
        ``topk_mass_k{k}``     weight on the k largest entries, for each k in ``selection_ks``;
        ``selection_tv_k{k}``  TV between the renormalised top-k weights and uniform over k (0 = the selected
                               keys are weighted equally: the paper's "selection tends to uniform");
        ``selection_entropy_k{k}``  entropy (nats) of the renormalised top-k weights (log k = uniform). Within a
                               run it is non-decreasing in k by construction; across T and over training it
                               is a real measurement.

    Tags: ``attention/{statistic}/layer_{l}``, ``attention/{statistic}/mean`` and the smallest and largest layer
    value ``attention/{statistic}/layer_min``, ``.../layer_max`` (``val/`` prefixed for
    validation epochs; ``.../layer_{l}/head_{h}`` with ``per_head``).

    With ``by_visible`` (Lemma 1 in training), rows are also binned by their visible count n (bin 2^b holds
    2^b <= n < 2^(b+1)) and the mean over all layers, heads and rows of each bin is logged:
        ``attention/by_visible/max_weight/n{2^b}``, ``attention/by_visible/normalized_entropy/n{2^b}``
    (bins without rows are not logged; n = 1 has no normalised entropy). Every scalar's x axis is a step: the curve
    over n (Lemma 1) is the report's figure `dilution_vs_n.png` (and its TensorBoard image), not a series whose step
    is n, which TensorBoard's default smoothing would bend.

    Not logged: the geometric separability N_s/N of the paper's Theorem 2. It needs each key's value vector
    x_i and the attention output s = sum a_i x_i, and a tap only sees the weights; measure it offline
    (`study.frozen.analysis`) on a frozen model instead.

    Args:
        every_n_steps: tap and log every this many optimizer steps.
        validation: also aggregate over each validation epoch and log ``val/...``.
        selection_ks: the k of the top-k statistics (what they measure of each row; not the spec's `top_k`,
            which selects keys).
        per_head: also log one scalar per head.
        by_visible: also log max weight and H / log n per bin of the visible count n.
        layers: the layers to log (indices, negative from the end, and "mid"); None (default) every layer.

    Example::

        trainer = L.Trainer(callbacks=[SelectionUniformityMonitor(every_n_steps=100, selection_ks=(1, 8))])
    """

    STATISTICS = ("kl_uniform", "tv_uniform", "max_weight", "effective_support", "nonzero", "saturated")

    def __init__(
        self,
        every_n_steps: int = 50,
        validation: bool = True,
        selection_ks: Sequence[int] = (1, 4, 16),
        per_head: bool = False,
        by_visible: bool = True,
        layers: LayerChoice = None,
    ) -> None:
        super().__init__(every_n_steps, validation, layers)
        selection_ks = tuple(selection_ks)
        if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in selection_ks):
            raise ValueError(f"selection_ks must be integers >= 1, got {selection_ks!r}")
        self.selection_ks = selection_ks
        self.per_head = per_head
        self.by_visible = by_visible

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        rows = row_distribution(weights, spec)
        sums = summarize_rows(rows, allowed, selection_ks=self.selection_ks, by_visible=self.by_visible,
                              entropy=known_row_entropy(weights, allowed, spec))  # fmt: skip
        sums.pop("entropy")  # the entropy monitor's
        sums.pop("normalized_entropy")
        return sums

    row_statistics = frozenset({"entropy", "top", "tv_uniform", "nonzero"})

    @property
    def row_top_k(self) -> int:
        return max(self.selection_ks, default=1)

    def summarize_row_statistics(self, layer: int, rows: RowStatistics, spec: AttentionSpec) -> dict[str, Tensor]:
        top = rows.top_weights[..., : min(self.row_top_k, rows.top_weights.shape[-1])]
        sums = summarize_row_values(rows.entropy, rows.tv_uniform, rows.nonzero, top, rows.visible,
                                    selection_ks=self.selection_ks, by_visible=self.by_visible)
        sums.pop("entropy")  # the entropy monitor's
        sums.pop("normalized_entropy")
        return sums

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        binned = {layer: {k: s.pop(k) for k in list(s) if k.startswith("by_n/")} for layer, s in sums.items()}
        means = {layer: finalize(s) for layer, s in sums.items()}
        names = list(self.STATISTICS)
        for k in self.selection_ks:
            names += [f"topk_mass/{k}", f"selection_tv/{k}", f"selection_entropy/{k}"]
        out: dict[str, Tensor] = {}
        for name in names:
            stat, _, k = name.partition("/")
            tag = tags.topk_statistic(stat, int(k)) if k else stat  # topk_mass/4 -> topk_mass_k4
            out.update(_layer_and_mean(tag, {layer: m[name] for layer, m in means.items()}, self.per_head))
        out.update(_by_visible_means(binned))
        return out


__all__ = ["AttentionEntropyMonitor", "SelectionUniformityMonitor"]
