"""Lemma 1: dilution. Per causal row, the max weight and n * min / n * max weight over the n visible keys.

A length-independent normaliser keeps C1 <= n alpha_i <= C2; the max weight then decays like 1/n.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from study import tags
from study.metrics import as_distribution, row_entropy

from . import plots
from .registration import Analysis, LayerInput, Settings, mean_of, per_head_rows, stack_layers
from .rows import causal_visible, flatten_rows


@torch.no_grad()
def dilution_stats(weights: torch.Tensor) -> dict:
    """Lemma 1 per causal row of `weights` (..., L, L).

    Returns (..., L) tensors max_weight, scaled_min, scaled_max (n times the min / max weight over the n visible
    keys), entropy (nats, of the row as a distribution: `study.metrics.as_distribution` then
    `study.metrics.row_entropy`, the monitors' convention, see `study.metrics.attention`: 0 log 0 = 0, rows that
    do not sum to 1 such as self_adjust's become |w| / sum |w|), and "visible" (n per row).
    """
    lead, w, _ = flatten_rows(weights)
    L = w.shape[-1]
    pos = torch.arange(L, device=w.device)
    visible = causal_visible(L, w.device)
    n = (pos + 1).to(w.dtype)
    wmax = w.masked_fill(~visible, -math.inf).amax(-1)  # (P, L)
    wmin = w.masked_fill(~visible, math.inf).amin(-1)
    entropy = row_entropy(as_distribution(w.masked_fill(~visible, 0.0)))
    return {"entropy": entropy.reshape(*lead, L),
            "max_weight": wmax.reshape(*lead, L), "scaled_min": (n * wmin).reshape(*lead, L),
            "scaled_max": (n * wmax).reshape(*lead, L), "visible": (pos + 1).tolist()}


# ----------------------------------------------------------------------------------------------------------
# Registration: the statistics at visible count n = each L of the grid, averaged over the batch, per head.

STATISTICS = ("max_weight", "scaled_min", "scaled_max", "entropy")


def _layer(settings: Settings, layer: LayerInput) -> dict:
    dl = dilution_stats(layer.weights)
    rows = [n - 1 for n in settings.grids.lengths]
    return {k: dl[k][:, :, rows].double().mean(0) for k in STATISTICS}  # (H, nL)


def _results(settings: Settings, per_layer: list[dict]) -> dict:
    """Per-head arrays [layer][head][length]."""
    return {"lemma1_dilution": stack_layers(per_layer)}


def _csv_rows(results: dict, layer_ids: list[int]):
    lengths = results["choices"]["lengths"]
    yield from per_head_rows("lemma1", results["lemma1_dilution"], layer_ids, [(n, "", "", "") for n in lengths],
                             heads_first=True)


def _figures(results: dict, out: Path) -> dict[str, Path]:
    plt, ch = plots.pyplot(), results["choices"]
    dl = results["lemma1_dilution"]["max_weight"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    per_len = [[heads[li] for layer in dl for heads in layer] for li in range(len(ch["lengths"]))]
    plots.box(ax, per_len, ch["lengths"], "Lemma 1: max attention weight at visible count L", "max weight")
    ax.plot(range(1, len(ch["lengths"]) + 1), 1 / np.array(ch["lengths"], dtype=float), "k--", label="1/L")
    ax.set_yscale("log")
    ax.legend()
    return {"dilution": plots.save(fig, out / "lemma1_dilution.png")}


def _scalars(results: dict):
    """Mean over heads of the max weight per L, step = layer."""
    ch = results["choices"]
    for layer, heads in zip(ch["layers"], results["lemma1_dilution"]["max_weight"]):
        for li, length in enumerate(ch["lengths"]):
            yield tags.analysis("max_weight", "L", length), mean_of([h[li] for h in heads]), layer


DILUTION = Analysis(name="lemma1_dilution", layer=_layer, results=_results, csv_rows=_csv_rows,
                    figures=_figures, scalars=_scalars)
