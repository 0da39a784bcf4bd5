"""Theorem 2 (Algorithm 4): geometric separability of the top-N keys, N_s/N with both bounds, per row and N.

The row conventions (shapes, NaN where undefined, one ranking per row, chunks) are in `study.frozen.analysis.rows`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from study import tags

from . import plots
from .registration import (
    Analysis,
    LayerInput,
    Settings,
    mean_of,
    median_over_heads,
    nan_median,
    per_head_rows,
    plain,
    prefix_means,
    stack_layers,
    window_prefix_means,
)
from .rows import DEFAULT_BUDGET, row_chunk, rows_and_grid, top_chunks


def sphere_radius(x: torch.Tensor) -> torch.Tensor:
    """M: the mean norm of the vectors over positions, per leading index (..., 1, 1)."""
    return x.norm(dim=-1, keepdim=True).mean(dim=-2, keepdim=True)


@torch.no_grad()
def separability_stats(weights: torch.Tensor, x: torch.Tensor, ns: Sequence[int], *,
                       budget: int = DEFAULT_BUDGET) -> dict:
    """Theorem 2 per row and per N on vectors normalised onto a sphere of radius M (M = mean norm per head).

    For a row: s = sum_{i in I_N} alpha_i x_i; r = min_{i not in I_N} |s - alpha_i x_i|;
    N_s = #{i in I_N : |s - alpha_i x_i| < r}; delta = min pairwise distance among the visible x.
    Bounds (recon): xi_i^2 = M^2 (sum_{j != i} alpha_j)^2 - (delta^2/2) sum_{j != k; j,k != i} alpha_j alpha_k
    (sums over I_N), clamped at 0; lower = 1 - sum_{I_N} xi_i / (N r);
    upper = (1/N) sum_{I_N} exp(-(xi_i - r)_+^2 / (2 M^2)).
    Returns (..., L, G) tensors ratio (N_s/N), n_s, lower, upper, r, delta, xi_clamped (some xi^2 < 0 was
    clamped: the bound's assumption fails there), plus "radius" (..., ) and "valid" (n_t > N: a key outside
    I_N exists).
    """
    lead, w, xs, ns, nt = rows_and_grid(weights, x, ns)
    P, L, _ = w.shape
    G = len(ns)
    dev, dt = w.device, w.dtype
    names = ["ratio", "n_s", "lower", "upper", "r", "delta", "xi_clamped"]
    out = {k: torch.full((P, L, G), math.nan, dtype=dt, device=dev) for k in names}
    radii = torch.empty(P, dtype=dt, device=dev)
    C = row_chunk(L, max(3 * G, xs.shape[-1]), budget)
    pos = torch.arange(L, device=dev)
    for p in range(P):
        raw = xs[p]
        M = raw.norm(dim=-1).mean()
        radii[p] = M
        xp = M * raw / raw.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(dt).tiny)
        xn2 = (xp * xp).sum(-1)
        # delta_t = min pairwise distance among keys 0..t: column minima of the strict upper triangle, then
        # a running minimum over t.
        pair = torch.cdist(xp, xp, compute_mode="donot_use_mm_for_euclid_dist")
        pair = pair.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=dev).triu(1), math.inf)
        delta_rows = torch.cummin(pair.amin(dim=0), dim=0).values  # (L,), inf for t = 0
        for ch in top_chunks(w[p], xp, xn2, nt, C):
            t0, t1, a, member, aw, dist, n = ch.t0, ch.t1, ch.a, ch.member, ch.aw, ch.dist, ch.n
            outside = ch.outside
            r = dist.masked_fill(~outside, math.inf).amin(-1)  # (C, G)
            n_s = ((dist < r[..., None]) & member).sum(-1).to(dt)
            ratio = n_s / nt[None, :].to(dt)

            delta = delta_rows[t0:t1][:, None]
            A = aw.sum(-1, keepdim=True)
            Q = (aw * aw).sum(-1, keepdim=True)
            rest = A - a[:, None, :]  # sum_{j in I_N, j != i} alpha_j
            pairs = rest * rest - (Q - (a * a)[:, None, :])  # sum_{j != k; j,k in I_N \ {i}} alpha_j alpha_k
            xi2 = M * M * rest * rest - 0.5 * (delta[..., None] ** 2) * pairs
            clamped = ((xi2 < 0) & member).any(-1).to(dt)
            xi = xi2.clamp_min(0).sqrt() * member
            N_f = nt[None, :].to(dt)
            lower = 1 - xi.sum(-1) / (N_f * r)
            gap = (xi - r[..., None]).clamp_min(0)
            upper = (torch.exp(-gap * gap / (2 * M * M)) * member).sum(-1) / N_f

            valid = n[:, None] > nt[None, :]
            res = {"ratio": ratio, "n_s": n_s, "lower": lower, "upper": upper, "r": r,
                   "delta": delta.expand_as(r), "xi_clamped": clamped}
            for k, v in res.items():
                out[k][p, t0:t1] = torch.where(valid, v, math.nan)
    result = {k: v.reshape(*lead, L, G) for k, v in out.items()}
    result["radius"] = radii.reshape(lead)
    result["ns"] = ns
    result["valid"] = (pos[:, None] + 1 > nt[None, :]).expand(*lead, L, G)
    return result


# ----------------------------------------------------------------------------------------------------------
# Registration: N_s/N and both bounds per N at the longest L, per head.


def _layer(settings: Settings, layer: LayerInput) -> dict:
    max_len = settings.grids.max_len
    s = separability_stats(layer.weights, layer.vectors, settings.grids.separability_ns)
    out = {k: prefix_means(s[k], [max_len])[0] for k in ("ratio", "lower", "upper", "xi_clamped")}  # (G, H)
    within = ((s["ratio"] >= s["lower"] - 1e-6) & (s["ratio"] <= s["upper"] + 1e-6)).to(layer.dtype)
    above = (s["ratio"] >= s["lower"] - 1e-6).to(layer.dtype)
    out["within_bounds"] = prefix_means(within.masked_fill(~s["valid"], math.nan), [max_len])[0]
    out["above_lower"] = prefix_means(above.masked_fill(~s["valid"], math.nan), [max_len])[0]
    out["radius"] = s["radius"].mean(0)  # (H,)
    out["ratio_windows"] = window_prefix_means(s["ratio"], [max_len])[:, 0]  # (B, G, H): each text window apart
    return out


def _results(settings: Settings, per_layer: list[dict]) -> dict:
    """Per-head arrays [layer][N][head]; radius [layer][head]."""
    order = ("ratio", "lower", "upper", "within_bounds", "above_lower", "xi_clamped", "radius")
    windows = torch.cat([layer["ratio_windows"] for layer in per_layer], dim=-1)  # (B, G, layers * heads)
    return {"alg4_separability": stack_layers([{k: layer[k] for k in order} for layer in per_layer]),
            # per text window: the median over every analysed head of N_s/N, [window][N]
            "alg4_separability_by_window": {"ns": settings.grids.separability_ns,
                                            "median_over_heads": plain(nan_median(windows.double().numpy()))}}


def _csv_rows(results: dict, layer_ids: list[int]):
    ch = results["choices"]
    yield from per_head_rows("alg4", results["alg4_separability"], layer_ids,
                             [(ch["lengths"][-1], n, "", "") for n in ch["separability_ns"]], skip=("radius",))


def _figures(results: dict, out: Path) -> dict[str, Path]:
    plt, ch = plots.pyplot(), results["choices"]
    a4 = results["alg4_separability"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    plots.box(ax, [plots.heads(a4["ratio"], i) for i in range(len(ch["separability_ns"]))], ch["separability_ns"],
              "Fig. 3: geometric separability N_s/N (box over heads)", "N_s / N")
    for key, style in (("lower", "r--"), ("upper", "g--")):
        med = plots.medians(a4[key])
        ax.plot(range(1, len(med) + 1), med, style, label=f"median {key} bound")
    ax.axhspan(0.70, 0.85, color="grey", alpha=0.2, label="paper: 0.70-0.85")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("N")
    ax.legend()
    return {"fig3": plots.save(fig, out / "fig3_separability.png")}


def _scalars(results: dict):
    """Mean over heads of N_s/N per N, step = layer."""
    ch = results["choices"]
    for layer, rows in zip(ch["layers"], results["alg4_separability"]["ratio"]):
        for n, heads in zip(ch["separability_ns"], rows):
            yield tags.analysis("separability", "N", n), mean_of(heads), layer


def _claims(results: dict) -> list[dict]:
    """N_s/N saturates at 0.70-0.85 for N >= 16."""
    sep = results["alg4_separability"]["ratio"]
    meds = {n: median_over_heads(sep, i) for i, n in enumerate(results["choices"]["separability_ns"]) if n >= 16}
    meds = {n: m for n, m in meds.items() if m is not None}
    if meds:
        measured = "median over heads " + ", ".join(f"N={n}: {m:.2f}" for n, m in meds.items())
    else:
        measured = "not measured (no N >= 16 below L)"
    return [{"claim": "N_s/N saturates at 0.70-0.85 for N >= 16", "paper": "0.70-0.85", "measured": measured}]


SEPARABILITY = Analysis(name="alg4_separability", layer=_layer, results=_results, csv_rows=_csv_rows,
                        figures=_figures, scalars=_scalars, claims=_claims)
