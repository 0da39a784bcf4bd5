"""Loop reference implementations, written the paper's way: per row, per N, per token.

Used as oracles by the tests and as the baseline of `benchmark_against_oracle`. Plain numpy, float64.
Every function takes one causal head: weights (L, L) (row t sees keys 0..t) and vectors x (L, D).
"""

from __future__ import annotations

import math

import numpy as np


def _top(a: np.ndarray, n_top: int):
    order = np.argsort(-a, kind="stable")  # same tie-break as the vectorised stable sort
    return order[:n_top], order[n_top:]


def distance_row(a: np.ndarray, x: np.ndarray, n_top: int) -> dict:
    """Theorem 1 quantities for one row a (n,) over its visible vectors x (n, D)."""
    n = len(a)
    top, rest = _top(a, n_top)
    s = np.zeros(x.shape[1])
    for j in top:
        s += a[j] * x[j]
    d_out = 0.0
    inner = np.zeros(x.shape[1])
    for i in rest:
        d_out += np.linalg.norm(a[i] * x[i] - s)
        inner += a[i] * x[i] - s
    mass = sum(a[j] for j in top)
    d1 = 0.0
    for i in rest:
        for j in top:
            d1 = max(d1, np.linalg.norm(x[i] - x[j]))
    max_top = max(np.linalg.norm(x[j]) for j in top)
    bound = (1 - mass) * d1 + ((n - n_top) * mass - (1 - mass)) * max_top
    c = n_top / (n - 1) if n > 1 else 0.0
    total = np.zeros(x.shape[1])
    for j in range(n):
        total += a[j] * x[j]
    e = 0.0
    for i in range(n):
        others = total - a[i] * x[i]  # sum_{j != i} alpha_j x_j
        e += np.linalg.norm(a[i] * x[i] - c * others)
    e *= (n - n_top) / n
    return {"d_sum_outside": d_out, "d_norm_of_sum": float(np.linalg.norm(inner)), "bound": bound,
            "expectation": e, "top_mass": mass, "d1": d1, "max_top_norm": max_top}


def distance_head(weights: np.ndarray, x: np.ndarray, ns) -> dict:
    """distance_row for every row t (visible t + 1) and every N; NaN where N > t + 1. Arrays (L, G)."""
    L = weights.shape[0]
    keys = ["d_sum_outside", "d_norm_of_sum", "bound", "expectation", "top_mass", "d1", "max_top_norm"]
    out = {k: np.full((L, len(ns)), math.nan) for k in keys}
    for t in range(L):
        for g, n_top in enumerate(ns):
            if n_top > t + 1:
                continue
            row = distance_row(weights[t, : t + 1], x[: t + 1], n_top)
            for k in keys:
                out[k][t, g] = row[k]
    return out


def exact_expected_distance(a: np.ndarray, x: np.ndarray, n_top: int) -> float:
    """E[d] over ALL uniformly random N-subsets (enumerated): the quantity Monte Carlo estimates."""
    from itertools import combinations

    n = len(a)
    total, count = 0.0, 0
    for subset in combinations(range(n), n_top):
        s = sum(a[j] * x[j] for j in subset)
        chosen = set(subset)
        total += sum(np.linalg.norm(a[i] * x[i] - s) for i in range(n) if i not in chosen)
        count += 1
    return total / count


def separability_head(weights: np.ndarray, x: np.ndarray, ns) -> dict:
    """Theorem 2 per row and N for one head (vectors normalised to the sphere of radius M = mean norm)."""
    L = weights.shape[0]
    M = np.linalg.norm(x, axis=1).mean()
    xs = M * x / np.linalg.norm(x, axis=1, keepdims=True)
    keys = ["ratio", "n_s", "lower", "upper", "r", "delta", "xi_clamped"]
    out = {k: np.full((L, len(ns)), math.nan) for k in keys}
    for t in range(L):
        n = t + 1
        a = weights[t, :n]
        delta = math.inf
        for i in range(n):
            for j in range(i + 1, n):
                delta = min(delta, np.linalg.norm(xs[i] - xs[j]))
        for g, n_top in enumerate(ns):
            if n_top >= n:
                continue
            top, rest = _top(a, n_top)
            s = sum(a[j] * xs[j] for j in top)
            r = min(np.linalg.norm(s - a[i] * xs[i]) for i in rest)
            n_s = sum(1 for i in top if np.linalg.norm(s - a[i] * xs[i]) < r)
            xis, clamped = [], False
            for i in top:
                others = [j for j in top if j != i]
                pair_sum = sum(a[j] * a[k] for j in others for k in others if j != k)
                xi2 = M**2 * sum(a[j] for j in others) ** 2 - 0.5 * delta**2 * pair_sum
                clamped = clamped or xi2 < 0
                xis.append(math.sqrt(max(xi2, 0.0)))
            lower = 1 - sum(xis) / (n_top * r)
            upper = sum(math.exp(-max(xi - r, 0.0) ** 2 / (2 * M**2)) for xi in xis) / n_top
            row = {"ratio": n_s / n_top, "n_s": n_s, "lower": lower, "upper": upper, "r": r,
                   "delta": delta, "xi_clamped": float(clamped)}
            for k, v in row.items():
                out[k][t, g] = v
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def gradient_row(logits: np.ndarray, v: np.ndarray, temperature: float, eps: float) -> float:
    """g(T, eps) for one row's visible logits and unit direction v."""
    return float(np.linalg.norm(softmax((logits + eps * v) / temperature) - softmax(logits / temperature)) / eps)
