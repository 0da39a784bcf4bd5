"""Lemma 1: dilution. Per causal row, the max weight and n * min / n * max weight over the n visible keys.

A length-independent normaliser keeps C1 <= n alpha_i <= C2; the max weight then decays like 1/n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from study import tags
from study.metrics import as_distribution, row_entropy

from . import plots
from .registration import (
    Analysis,
    LayerInput,
    Settings,
    mean_of,
    nan_median,
    per_head_rows,
    plain,
    stack_layers,
)
from .rows import causal_visible, flatten_rows


@torch.no_grad()
def dilution_stats(weights: torch.Tensor, rows: Sequence[int] | None = None) -> dict:
    """Lemma 1 per causal row of `weights` (..., L, L).

    Returns (..., L) tensors max_weight, scaled_min, scaled_max (n times the min / max weight over the n visible
    keys), entropy (nats, of the row as a distribution: `study.metrics.as_distribution` then
    `study.metrics.row_entropy`, the monitors' convention, see `study.metrics.attention`: 0 log 0 = 0, rows that
    do not sum to 1 such as self_adjust's become |w| / sum |w|), and "visible" (n per row). `rows`: only those
    rows (positions 0..L-1), each statistic then (..., len(rows)), with no copy of the whole map.
    """
    lead, w, _ = flatten_rows(weights)
    L = w.shape[-1]
    pos = torch.arange(L, device=w.device)
    visible = causal_visible(L, w.device)
    if rows is not None:
        bad = [r for r in rows if not 0 <= int(r) < L]
        if bad:
            raise ValueError(f"rows must lie in 0..{L - 1}, got row {bad[0]}")
        pos = torch.tensor([int(r) for r in rows], device=w.device, dtype=torch.long)
        w, visible = w[:, pos], visible[pos]
        L = len(pos)
    n = (pos + 1).to(w.dtype)
    wmax = w.masked_fill(~visible, -math.inf).amax(-1)  # (P, L)
    wmin = w.masked_fill(~visible, math.inf).amin(-1)
    entropy = row_entropy(as_distribution(w.masked_fill(~visible, 0.0)))
    return {"entropy": entropy.reshape(*lead, L),
            "max_weight": wmax.reshape(*lead, L), "scaled_min": (n * wmin).reshape(*lead, L),
            "scaled_max": (n * wmax).reshape(*lead, L), "visible": (pos + 1).tolist()}


@torch.no_grad()
def fixed_query_dilution(logits: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, scaling: float,
                         counts: Sequence[int], temperature: float = 1.0) -> dict:
    """Lemma 1 for fixed queries: the last query of each (..., head) attends by softmax(l / T) to its n most
    recent keys only, for each n in `counts` (the same query, a context of n keys ending at it).

    logits (..., L, L) scaled q.k (or its last row, (..., 1, L)); queries, keys (..., L, Dh) with `scaling` the model's factor on q.k. Returns
    (..., len(counts)) float64 tensors:
      max_weight, entropy (nats), normalized_entropy (H / log n; 1 = uniform), scaled_max (n * max weight),
      scaled_min (n * min weight);
      log10_range_bound: log10 exp(Delta_n / T), Delta_n = max - min of the n logits: n * max weight is at most
        this (and n * min weight at least its inverse) for any softmax row with that spread;
      log10_paper_bound: log10 exp(2 D / T), D = |q| max_i |k_i| * scaling (Cauchy-Schwarz bounds every logit by
        D): the constant of Lemma 1 as the paper states it.
    """
    L = logits.shape[-1]  # the last row alone, (..., 1, L), is enough
    counts = [int(n) for n in counts]
    bad = [n for n in counts if not 1 <= n <= L]
    if bad:
        raise ValueError(f"key counts must lie in 1..{L} (the last query's visible keys), got n={bad[0]}")
    row = logits[..., -1, :].double() / temperature  # (..., L): the last query sees every key
    q_norm = queries[..., -1, :].double().norm(dim=-1)  # (...,)
    k_norm = keys.double().norm(dim=-1)  # (..., L)
    names = ("max_weight", "entropy", "normalized_entropy", "scaled_max", "scaled_min", "log10_range_bound",
             "log10_paper_bound")
    out: dict[str, list[torch.Tensor]] = {k: [] for k in names}
    for n in counts:
        z = row[..., L - n:]
        w = torch.softmax(z, dim=-1)
        entropy = row_entropy(w)
        out["max_weight"].append(w.amax(-1))
        out["entropy"].append(entropy)
        out["normalized_entropy"].append(entropy / math.log(n) if n > 1 else torch.full_like(entropy, math.nan))
        out["scaled_max"].append(n * w.amax(-1))
        out["scaled_min"].append(n * w.amin(-1))
        out["log10_range_bound"].append((z.amax(-1) - z.amin(-1)) / math.log(10))
        d = q_norm * k_norm[..., L - n:].amax(-1) * abs(scaling)
        out["log10_paper_bound"].append(2 * d / temperature / math.log(10))
    return {k: torch.stack(v, -1) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------
# Registration: the statistics at visible count n = each L of the grid, averaged over the batch, per head; and
# the fixed-query measurement per text window.

STATISTICS = ("max_weight", "scaled_min", "scaled_max", "entropy")
FIXED_QUERY = ("max_weight", "normalized_entropy", "scaled_max", "log10_range_bound", "log10_paper_bound")


def _layer(settings: Settings, layer: LayerInput) -> dict:
    dl = dilution_stats(layer.weights, rows=[n - 1 for n in settings.grids.lengths])  # the rows at n = each L
    out = {k: dl[k].double().mean(0) for k in STATISTICS}  # (H, nL)
    cap, index = layer.capture, layer.index
    if cap.is_softmax(index):  # the lemma's closed form is softmax's; other maps get NaN
        last = cap.logits(index, dtype=layer.dtype, rows=slice(-1, None))  # the last query's row alone (B, H, 1, L)
        fixed = fixed_query_dilution(last, cap.queries[index], cap.keys[index], cap.scalings[index],
                                     settings.grids.lengths, cap.spec(index).temperature)
    else:
        shape = (*layer.weights.shape[:2], len(settings.grids.lengths))
        fixed = {k: torch.full(shape, math.nan, dtype=torch.float64) for k in FIXED_QUERY}
    out["fixed_query"] = {k: fixed[k] for k in FIXED_QUERY}  # (B, H, nL)
    return out


def _results(settings: Settings, per_layer: list[dict]) -> dict:
    """Per-head arrays [layer][head][length]; the fixed-query measurement per text window [window][length] (mean
    over every analysed head of max weight, H / log n and n * max weight; median over heads of the log10 bounds)."""
    fixed = {k: torch.cat([layer["fixed_query"][k] for layer in per_layer], dim=1) for k in FIXED_QUERY}
    by_window = {"lengths": settings.grids.lengths,
                 **{k: plain(fixed[k].nanmean(1)) for k in ("max_weight", "normalized_entropy", "scaled_max")},
                 **{k: plain(nan_median(fixed[k].transpose(1, 2).numpy()))
                    for k in ("log10_range_bound", "log10_paper_bound")}}
    return {"lemma1_dilution": stack_layers([{k: layer[k] for k in STATISTICS} for layer in per_layer]),
            "lemma1_fixed_query_by_window": by_window}


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


def _claims(results: dict) -> list[dict]:
    """Lemma 1 is a bound, not a rate: its row says what the data show and how far the constant lies above them."""
    block = results["lemma1_fixed_query_by_window"]
    n = block["lengths"]

    def median(key: str, index: int) -> float | None:
        values = [row[index] for row in block[key] if row[index] is not None]
        return float(np.median(values)) if values else None

    first, last = median("max_weight", 0), median("max_weight", -1)
    scaled, paper = median("scaled_max", -1), median("log10_paper_bound", -1)
    spread, entropy = median("log10_range_bound", -1), median("normalized_entropy", -1)
    if None in (first, last, scaled, paper, spread) or first <= 0 or last <= 0 or len(n) < 2:
        measured = None
    else:
        slope = math.log(last / first) / math.log(n[-1] / n[0])
        measured = (f"fixed queries: max weight {first:.3g} at n={n[0]}, {last:.3g} at n={n[-1]} (slope {slope:.2f}: it "
                    f"{'rises' if slope > 0 else 'falls'} with n; 1/n is -1); H/log n {entropy:.2f} at n={n[-1]}; n x max weight {scaled:.3g}, below "
                    f"exp(2D/T) = 10^{paper:.3g} and exp(Delta/T) = 10^{spread:.3g}")
    return [{"claim": "Lemma 1: C1/n <= alpha_i <= C2/n (a bound, softmax: C2 = exp(2D/T))",
             "paper": "a bound, not a rate", "measured": measured}]


DILUTION = Analysis(name="lemma1_dilution", layer=_layer, results=_results, csv_rows=_csv_rows,
                    figures=_figures, scalars=_scalars, claims=_claims, window_keys=("fixed_query",))
