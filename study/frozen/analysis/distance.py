"""Theorem 1 (Algorithms 1 and 2): the distance between the full and the top-N context vector, per row and N.

The row conventions (shapes, NaN where undefined, one ranking per row, chunks) are in `study.frozen.analysis.rows`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from study import tags

from . import plots
from .registration import Analysis, LayerInput, Settings, mean_of, per_head_rows, prefix_means, stack_layers
from .rows import DEFAULT_BUDGET, distances_to, row_chunk, rows_and_grid, top_chunks

DISTANCE_READINGS = ("sum_outside", "norm_of_sum")


def _expectation(a, xc, x2c, total, visible, n_f, nt_f, n_out) -> torch.Tensor:
    """Closed-form expectation of d over a uniformly random I_N (recon), (C, G).

    With c = N/(n-1), alpha_i x_i - c sum_{j != i} alpha_j x_j = (1 + c) alpha_i x_i - c * total, and
    |(1 + c) a_i x_i - c total|^2 = (1+c)^2 a_i^2 |x_i|^2 - 2 c (1+c) a_i x_i.total + c^2 |total|^2.
    """
    c = (nt_f[None, :] / (n_f - 1).clamp_min(1))[..., None]  # (C, G, 1)
    xt = total @ xc.T  # (C, L): x_i . total
    axx = a * a * x2c  # zero on invisible keys
    sq = torch.addcmul((c * c) * (total * total).sum(-1)[:, None, None], (1 + c) ** 2, axx[:, None, :])
    sq = sq.addcmul_(-2 * c * (1 + c), (a * xt)[:, None, :])
    e_terms = (sq.clamp_min_(0).sqrt_() * visible[:, None, :]).sum(-1)
    return n_out / n_f * e_terms


def _d1(sqpair, order, outside, ns, n_max: int, Lc: int) -> torch.Tensor:
    """d1(N) = max over j in I_N, i outside I_N of |x_i - x_j|, for every N at once, (C, G).

    The rows of the squared pairwise matrix for the top-n_max keys in rank order, maxima over the segments
    between consecutive N of the grid, a running max over segments (row N = max over the top N keys' rows), then
    a max over the keys outside I_N (none outside: d1 = 0).
    """
    rows = sqpair[:, :Lc][order[:, :n_max]]  # (C, <= n_max, Lc)
    segs, lo = [], 0
    for N in ns:
        hi = min(N, rows.shape[1])
        seg = rows[:, lo:hi].amax(1) if hi > lo else segs[-1]
        segs.append(seg if not segs else torch.maximum(segs[-1], seg))
        lo = hi
    q = torch.stack(segs, 1)  # (C, G, L)
    return q.masked_fill_(~outside, -1.0).amax(-1).clamp_min_(0).sqrt_()


def _monte_carlo(a, xc, x2c, visible, nt, pos, mc_samples: int, gen) -> torch.Tensor:
    """Mean of d_sum_outside over `mc_samples` uniformly random I_N per row, (C, G).

    A random permutation of the visible keys per (row, sample): its first N keys are a uniform N-subset for
    every N at once.
    """
    C, Lc = a.shape
    noise = torch.rand(C, mc_samples, Lc, generator=gen, device=a.device, dtype=a.dtype)
    noise = noise.masked_fill(~visible[:, None, :], 2.0)
    rrank = torch.empty(C, mc_samples, Lc, dtype=torch.long, device=a.device)
    rrank.scatter_(-1, noise.argsort(-1), pos[:Lc].expand_as(rrank))  # rank of each key in the permutation
    mmember = rrank[:, :, None, :] < nt[None, None, :, None]  # (C, K, G, L)
    ms = (a[:, None, None, :] * mmember) @ xc
    mdist = distances_to(a, xc, x2c, ms)
    mout = visible[:, None, None, :] & ~mmember
    return (mdist * mout).sum(-1).mean(1)


@torch.no_grad()
def distance_stats(weights: torch.Tensor, x: torch.Tensor, ns: Sequence[int], *, mc_samples: int = 0,
                   seed: int = 0, bound: bool = True, budget: int = DEFAULT_BUDGET) -> dict:
    """Theorem 1 per row and per N: true distance (both readings), bound, expectation, Monte Carlo.

    Returns a dict of (..., L, G) tensors:
      d_sum_outside  sum_{i not in I_N} |alpha_i x_i - s|                       (recon, main reading)
      d_norm_of_sum  |sum_{i not in I_N} (alpha_i x_i - s)|                      (recon, alternative)
      bound          (1 - A_N) d1 + ((n - N) A_N - (1 - A_N)) max_{j in I_N} |x_j|  (recon)
      expectation    ((n-N)/n) sum_i |alpha_i x_i - (N/(n-1)) sum_{j != i} alpha_j x_j|  (recon, closed form)
      mc_expectation mean of d_sum_outside over `mc_samples` uniformly random I_N (if mc_samples > 0)
      top_mass (A_N), d1, max_top_norm
    plus "ns" (the grid) and "valid" (n_t >= N). n is the row's visible count.

    One loop over (leading index, row chunk), about 60 lines: each chunk's statistics share its ranking, its
    top-N context vectors and its distances, so splitting the loop would recompute or pass them all.
    """
    lead, w, xs, ns, nt = rows_and_grid(weights, x, ns)
    P, L, _ = w.shape
    G = len(ns)
    dev, dt = w.device, w.dtype
    names = ["d_sum_outside", "d_norm_of_sum", "expectation", "top_mass"]
    if bound:
        names += ["bound", "d1", "max_top_norm"]
    if mc_samples > 0:
        names.append("mc_expectation")
    out = {k: torch.full((P, L, G), math.nan, dtype=dt, device=dev) for k in names}
    gen = torch.Generator(device=dev).manual_seed(seed)
    # d1 needs the top-n_max keys' squared distances to every key (for every N at once, see _d1).
    n_max = max([n for n in ns if n < L], default=0) if bound else 0
    width = G * (mc_samples + 4) + 2 * n_max + 4
    C = row_chunk(L, width, budget)
    pos = torch.arange(L, device=dev)
    nt_f = nt.to(dt)
    for p in range(P):
        xp = xs[p]
        xn2 = (xp * xp).sum(-1)
        if bound:
            xnorm = xn2.sqrt()
            # Squared pairwise distances from the Gram matrix; only maxima are used (d1 is the largest distance,
            # so the cancellation of |x|^2 + |y|^2 - 2 x.y does not matter there), sqrt of the maxima only.
            sqpair = (xn2[:, None] + xn2[None, :]).sub_(xp @ xp.T, alpha=2).clamp_min_(0)
        for ch in top_chunks(w[p], xp, xn2, nt, C):
            t0, t1, Lc, a, visible, xc, x2c, n = ch.t0, ch.t1, ch.t1, ch.a, ch.visible, ch.x, ch.xn2, ch.n
            order, outside, s, k = ch.order, ch.outside, ch.s, ch.order.shape[-1]
            d_out = (ch.dist * outside).sum(-1)
            total = a @ xc  # full context vector (C, D)
            n_f = n.to(dt)[:, None]
            n_out = n_f - nt_f[None, :]
            # sum_{i not in I_N} (alpha_i x_i - s) = (total - s) - (n - N) s
            d_in = (total[:, None, :] - s - n_out[..., None] * s).norm(dim=-1)
            A = ch.aw.sum(-1)
            valid = n[:, None] >= nt[None, :]
            expectation = _expectation(a, xc, x2c, total, visible, n_f, nt_f, n_out)

            res = {"d_sum_outside": d_out, "d_norm_of_sum": d_in, "expectation": expectation, "top_mass": A}
            if bound:
                # max_{j in I_N} |x_j|: running max of the norms in rank order.
                max_top = torch.cummax(xnorm[order], dim=-1).values[:, (nt - 1).clamp_max(k - 1)]
                d1 = _d1(sqpair, order, outside, ns, n_max, Lc) if n_max > 0 else torch.zeros_like(A)
                res["bound"] = (1 - A) * d1 + (n_out * A - (1 - A)) * max_top
                res["d1"] = d1
                res["max_top_norm"] = max_top
            if mc_samples > 0:
                res["mc_expectation"] = _monte_carlo(a, xc, x2c, visible, nt, pos, mc_samples, gen)
            for key, v in res.items():
                out[key][p, t0:t1] = v.masked_fill_(~valid, math.nan)
    result = {k: v.reshape(*lead, L, G) for k, v in out.items()}
    result["ns"] = ns
    result["valid"] = (pos[:, None] + 1 >= nt[None, :]).expand(*lead, L, G)
    return result


# ----------------------------------------------------------------------------------------------------------
# Registration: Algorithm 1 (d, bound, E at N = n_fixed over the lengths L) and Algorithm 2 (at the longest L
# over N), from one distance_stats call per layer.

DISTANCES = ("d_sum_outside", "d_norm_of_sum", "bound", "expectation", "mc_expectation")


def _layer(settings: Settings, layer: LayerInput) -> dict:
    g = settings.grids
    d = distance_stats(layer.weights, layer.vectors, g.distance_ns, mc_samples=settings.mc_samples,
                       seed=settings.seed + layer.index)
    at_n_fixed = g.distance_ns.index(g.n_fixed)
    alg1, alg2 = {}, {}
    for k in DISTANCES:
        if k == "mc_expectation" and settings.mc_samples == 0:
            continue
        pm = prefix_means(d[k], g.lengths)  # (nL, G, H)
        alg1[k] = pm[:, at_n_fixed]  # (nL, H)
        alg2[k] = pm[-1, [g.distance_ns.index(n) for n in g.ns]]  # (len(ns), H)
    return {"alg1": alg1, "alg2": alg2}


def _results(settings: Settings, per_layer: list[dict]) -> dict:
    """Per-head arrays [layer][L or N][head]."""
    return {
        "alg1_distance_vs_length": stack_layers([layer["alg1"] for layer in per_layer]),
        "alg2_distance_vs_n": stack_layers([layer["alg2"] for layer in per_layer]),
    }


def _csv_rows(results: dict, layer_ids: list[int]):
    ch = results["choices"]
    yield from per_head_rows("alg1", results["alg1_distance_vs_length"], layer_ids,
                             [(length, ch["n_fixed"], "", "") for length in ch["lengths"]])
    yield from per_head_rows("alg2", results["alg2_distance_vs_n"], layer_ids,
                             [(ch["lengths"][-1], n, "", "") for n in ch["ns"]])


def _figures(results: dict, out: Path) -> dict[str, Path]:
    plt, ch = plots.pyplot(), results["choices"]
    a1 = results["alg1_distance_vs_length"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    plots.box(ax, [plots.heads(a1["d_sum_outside"], i) for i in range(len(ch["lengths"]))], ch["lengths"],
              f"Fig. 2a: distance d vs L (N={ch['n_fixed']}, box over heads)", "token-averaged d")
    for key, style in (("bound", "r--"), ("expectation", "g:"), ("mc_expectation", "m-.")):
        if key in a1:
            med = plots.medians(a1[key])
            ax.plot(range(1, len(med) + 1), med, style, label=f"median {key}")
    ax.set_yscale("log")
    ax.set_xlabel("L")
    ax.legend()
    paths = {"fig2a": plots.save(fig, out / "fig2a_distance_vs_length.png")}

    a2 = results["alg2_distance_vs_n"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    plots.box(ax, [plots.heads(a2["d_sum_outside"], i) for i in range(len(ch["ns"]))], ch["ns"],
              f"Fig. 2b: distance d vs N (L={ch['lengths'][-1]})", "token-averaged d")
    ax.set_xlabel("N")
    paths["fig2b"] = plots.save(fig, out / "fig2b_distance_vs_n.png")
    return paths


def _scalars(results: dict):
    """Mean over heads of d per L (Alg. 1) and per N (Alg. 2), step = layer."""
    ch = results["choices"]
    for layer, rows in zip(ch["layers"], results["alg1_distance_vs_length"]["d_sum_outside"]):
        for length, heads in zip(ch["lengths"], rows):
            yield tags.analysis("distance", "L", length), mean_of(heads), layer
    for layer, rows in zip(ch["layers"], results["alg2_distance_vs_n"]["d_sum_outside"]):
        for n, heads in zip(ch["ns"], rows):
            yield tags.analysis("distance_vs_n", "N", n), mean_of(heads), layer


DISTANCE = Analysis(name="alg1_2_distance", layer=_layer, results=_results, csv_rows=_csv_rows,
                    figures=_figures, scalars=_scalars)
