"""Corollary 3 (Algorithm 5): gradient sensitivity g(T, eps) of the attention map against temperature, with the
exact spectral norm of the softmax Jacobian on sampled rows beside it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from study import tags
from study.attention import causal_allowed
from study.attention.normalizers import masked_softmax
from study.metrics import SATURATED, softmax_jacobian_norm

from . import plots
from .registration import Analysis, LayerInput, Settings, plain
from .rows import ROW_BLOCKS, check_temperatures, flatten_rows

# Bisection steps of the exact Jacobian norm. The monitors' 60 reach float64 resolution unless the row is near
# one-hot; the lowest temperatures give such rows, whose norm (~ 1 - a_max) is tiny, and 80 halvings keep
# its relative accuracy there.
JACOBIAN_ITERATIONS = 80


@torch.no_grad()
def gradient_sensitivity(logits: torch.Tensor, temperatures: Sequence[float],
                         epsilons: Sequence[float] = (1e-3, 1e-1, 10.0), *, seed: int = 0,
                         dtype: torch.dtype = torch.float64, normalize=None) -> dict:
    """Algorithm 5: g(T, eps) = |f((l + eps v)/T) - f(l/T)|_2 / eps per causal row, f = softmax by default.

    v is a random unit vector over each row's visible keys (seeded). Computed in float64 by default
    because the differences are tiny at small eps. `normalize`, if given, is the map f: it takes causal
    scores (B', H, L, L) (already divided by T) and returns weights; then `logits` must be (B, H, L, L) and f
    sees one batch item with all heads at once (per-head normaliser parameters broadcast). Finite differences
    work for any map (sparsemax, entmax, ssmax, ...). Returns "g" (..., L, nT, nE), "temperatures", "epsilons".
    """
    temperatures = check_temperatures(temperatures)
    epsilons = [float(e) for e in epsilons]
    for e in epsilons:
        if not e > 0:
            raise ValueError(f"epsilon must be > 0, got eps={e}")
    lead, w, _ = flatten_rows(logits)
    P, L, _ = w.shape
    if normalize is not None:
        if logits.ndim != 4:
            raise ValueError(f"with a normaliser, logits must be (B, H, L, L), got shape {tuple(logits.shape)}")
        heads = logits.shape[1]
    else:
        heads = 1
    gen = torch.Generator(device=w.device).manual_seed(seed)
    visible = causal_allowed(L, L, w.device)
    g = torch.empty(P, L, len(temperatures), len(epsilons), dtype=dtype, device=w.device)
    # Heads are processed together (one batch item's worth when a normaliser needs the head axis), in chunks
    # that keep each float64 (L, L) stack near 64 MB.
    step = heads if normalize is not None else max(1, min(P, (1 << 23) // (L * L)))
    pos = torch.arange(L, device=w.device)
    for p0 in range(0, P, step):
        p1 = min(P, p0 + step)
        lp = w[p0:p1].to(dtype)
        # One (L, L) draw per head in order: the same directions as drawing head by head.
        v = torch.stack([torch.randn(L, L, generator=gen, device=w.device, dtype=dtype) for _ in range(p1 - p0)])
        v = v.masked_fill(~visible, 0.0)
        v = v / v.norm(dim=-1, keepdim=True)
        if normalize is not None:
            # A normaliser sees whole causal rows (its mask is the (L, L) triangle).
            for i, T in enumerate(temperatures):
                a = normalize((lp / T)[None])[0]
                for j, eps in enumerate(epsilons):
                    b = normalize(((lp + eps * v) / T)[None])[0]
                    g[p0:p1, :, i, j] = (b - a).norm(dim=-1) / eps
            continue
        # Softmax: row blocks, each over key columns 0..t1-1 only (the causal triangle, about half the work).
        rows = max(64, -(-L // ROW_BLOCKS))
        for t0 in range(0, L, rows):
            t1 = min(L, t0 + rows)
            vis = pos[t0:t1, None] >= pos[None, :t1]
            # -inf on masked keys once, not `masked_softmax` at every (T, eps): every causal row keeps its
            # diagonal key, so no row is fully masked, v is 0 there (-inf + eps * 0 = -inf) and dividing -inf by
            # T cannot overflow. Softmax gives exact zeros, as masked_softmax's re-zeroing would.
            lb = lp[:, t0:t1, :t1].masked_fill(~vis, -math.inf)
            vb = v[:, t0:t1, :t1]
            for i, T in enumerate(temperatures):
                a = torch.softmax(lb / T, dim=-1)
                for j, eps in enumerate(epsilons):
                    b = torch.softmax(torch.add(lb, vb, alpha=eps).div_(T), dim=-1)
                    g[p0:p1, t0:t1, i, j] = torch.linalg.vector_norm(b.sub_(a), dim=-1).div_(eps)
    return {"g": g.reshape(*lead, L, len(temperatures), len(epsilons)),
            "temperatures": temperatures, "epsilons": epsilons}


# ----------------------------------------------------------------------------------------------------------
# Registration: g(T, eps) over a log grid of T, token-averaged per head; exact Jacobian norm on sampled rows.


def _layer(settings: Settings, layer: LayerInput) -> dict:
    g = settings.grids
    logits = layer.logits()  # (B, H, L, L)
    # Softmax layers: the paper's perturbation. Other normalisers: the same finite difference through the
    # layer's own map (normaliser and top-k) at each temperature.
    cap, index = layer.capture, layer.index
    normalize = None if cap.is_softmax(index) else (lambda z: cap.normalize(index, z))
    probe = gradient_sensitivity(logits, g.temperatures, g.epsilons, seed=settings.seed + index, normalize=normalize)
    causal = causal_allowed(g.max_len, g.max_len, logits.device)[g.spectral_rows]  # (rows, L)
    rows = logits[:, :, g.spectral_rows].double()  # (B, H, rows, L)
    norms = torch.stack([softmax_jacobian_norm(masked_softmax(rows / T, causal), T, iterations=JACOBIAN_ITERATIONS)
                         for T in g.temperatures], -1)  # (B, H, rows, nT)
    return {"g": probe["g"].mean(dim=(0, 2)),  # (H, nT, nE)
            "spectral_mean": norms.mean(dim=(0, 2)), "spectral_max": norms.amax(dim=(0, 2)),  # (H, nT)
            "g_windows": probe["g"].mean(dim=2),  # (B, H, nT, nE): each text window apart
            "saturated_windows": saturated_rows(logits, g.temperatures)}  # (B, H, nT)


@torch.no_grad()
def saturated_rows(logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """Per (batch item, head) and T: the fraction of causal rows whose softmax(l / T) has a weight above
    `study.metrics.SATURATED`: such rows have a Jacobian near 0 whatever T, which flattens a 1/T law.
    logits (B, H, L, L) -> (B, H, nT)."""
    L = logits.shape[-1]
    masked = logits.double().masked_fill(~causal_allowed(L, L, logits.device), -math.inf)
    gap = masked - masked.amax(-1, keepdim=True)  # <= 0; the row's largest weight is 1 / sum exp(gap / T)
    return torch.stack([(torch.exp(gap / T).sum(-1) < 1 / SATURATED).double().mean(-1) for T in temperatures], -1)


def _results(settings: Settings, per_layer: list[dict]) -> dict:
    tt = torch.tensor(settings.grids.temperatures, dtype=torch.float64)
    g_all = torch.stack([layer["g"] for layer in per_layer])  # (layers, H, nT, nE)
    spec_max = torch.stack([layer["spectral_max"] for layer in per_layer])
    windows = torch.cat([layer["g_windows"] for layer in per_layer], dim=1)  # (B, layers * heads, nT, nE)
    saturated = torch.cat([layer["saturated_windows"] for layer in per_layer], dim=1)
    return {"alg5_gradient": {
        "g_per_head": plain(g_all),  # [layer][head][T][eps]
        "g_max_over_heads": plain(g_all.flatten(0, 1).amax(0)),  # [T][eps]: max over heads
        "spectral_mean_per_head": plain(torch.stack([layer["spectral_mean"] for layer in per_layer])),
        "spectral_max_over_heads": plain(spec_max.flatten(0, 1).amax(0)),  # [T]
        "bound_min_quarter_over_t_sqrt2": plain(torch.clamp(0.25 / tt, max=math.sqrt(2))),
        "half_over_t": plain(0.5 / tt),
    }, "alg5_gradient_by_window": {  # per text window, over every analysed head: [window][T][eps]
        "g_max_over_heads": plain(windows.amax(1)),
        "g_mean_over_heads": plain(windows.mean(1)),
        "saturated_fraction": plain(saturated.mean(1)),  # [window][T]: rows with a weight above SATURATED
    }}


def _csv_rows(results: dict, layer_ids: list[int]):
    ch = results["choices"]
    for layer, heads in zip(layer_ids, results["alg5_gradient"]["g_per_head"]):
        for head, per_t in enumerate(heads):
            for ti, per_e in enumerate(per_t):
                for ei, v in enumerate(per_e):
                    yield ["alg5", "g", layer, head, ch["lengths"][-1], "", ch["temperatures"][ti], ch["epsilons"][ei], v]


def _figures(results: dict, out: Path) -> dict[str, Path]:
    plt, ch = plots.pyplot(), results["choices"]
    a5 = results["alg5_gradient"]
    temps = np.array(ch["temperatures"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for ei, eps in enumerate(ch["epsilons"]):
        ax.loglog(temps, [row[ei] for row in a5["g_max_over_heads"]], "o-", label=f"g, eps={eps:g} (max heads)")
    ax.loglog(temps, a5["spectral_max_over_heads"], "k-", label="spectral norm (max)")
    ax.loglog(temps, a5["bound_min_quarter_over_t_sqrt2"], "r--", label="min(1/(4T), sqrt 2)")
    ax.loglog(temps, a5["half_over_t"], "r:", label="1/(2T)")
    ax.set_xlabel("T")
    ax.set_ylabel("sensitivity")
    ax.set_title("Fig. 4: gradient sensitivity vs temperature")
    ax.legend(fontsize=8)
    return {"fig4": plots.save(fig, out / "fig4_gradient_sensitivity.png")}


def _scalars(results: dict):
    """Max over heads of g at the smallest eps per T, step = layer."""
    ch = results["choices"]
    for layer, heads in zip(ch["layers"], results["alg5_gradient"]["g_per_head"]):
        for ti, t in enumerate(ch["temperatures"]):
            yield tags.analysis("gradient", "T", f"{t:g}"), max(h[ti][0] for h in heads), layer


def _claims(results: dict) -> list[dict]:
    """g follows 1/T for T < 0.1, and drops ~100x by T >= 1."""
    ch = results["choices"]
    temps = np.array(ch["temperatures"])
    g = np.array([[np.nan if v is None else v for v in row] for row in results["alg5_gradient"]["g_max_over_heads"]])
    g_small = g[:, 0]  # smallest eps
    low = (temps < 0.1) & np.isfinite(g_small) & (g_small > 0)
    if low.sum() >= 2:
        slope = float(np.polyfit(np.log(temps[low]), np.log(g_small[low]), 1)[0])
        tight = ", ".join(f"{t:g}: {v * 4 * t:.3g}" for t, v in zip(temps[low], g_small[low]))
        measured = (f"slope of log g vs log T = {slope:.2f} (eps={ch['epsilons'][0]}, max over heads); "
                    f"g x 4T (1 = the bound 1/(4T)) at T = {tight}")  # fmt: skip
    else:
        measured = "not measured (fewer than 2 temperatures below 0.1)"
    claims = [{"claim": "g follows 1/T for T < 0.1", "paper": "slope -1, close to the theoretical limit",
               "measured": measured}]
    high = temps >= 1
    if low.any() and high.any():
        drop = float(np.nanmax(g_small[low]) / g_small[high][0])
        measured = f"max g(T<0.1) / g(T={temps[high][0]:g}) = {drop:.1f}"
    else:
        measured = "not measured (T grid does not span 0.1 and 1)"
    claims.append({"claim": "g drops ~100x by T >= 1", "paper": "about 100x", "measured": measured})
    return claims


GRADIENT = Analysis(name="alg5_gradient", layer=_layer, results=_results, csv_rows=_csv_rows, figures=_figures,
                    scalars=_scalars, claims=_claims)
