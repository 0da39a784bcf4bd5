"""The paper's analyses (Algorithms 1-5), vectorised over batch, heads, query rows and every N.

Conventions (shared by every function here):
- `weights` is (..., L, L): causal attention rows, row t sees keys 0..t (visible count n_t = t + 1) and is
  zero above the diagonal. `logits` is the same shape, unmasked (the mask is applied here).
- `x` is (..., L, D), broadcastable to the leading dims of `weights`: the vectors x_i the theorems talk
  about (per-head values by default; hidden states broadcast over heads as an option).
- Per-row outputs are (..., L, G) for a grid of G values of N, NaN where the statistic is undefined
  (N > n_t, or no key outside the top N where one is needed).
- Everything is computed from ONE descending ranking per row (`topk` of the largest N on an exact
  integer key, ties broken by position as a stable sort would): the rank of each key gives membership of the
  top-N set for every N at once, and |alpha_i x_i - s|^2 = |alpha_i x_i|^2 - 2 alpha_i x_i.s + |s|^2 turns the
  per-key distances into a matrix product (no (rows, L, D) tensor is ever formed).
- Rows are processed in chunks sized by `budget` (elements per temporary) so L = 1024 with 12 heads stays
  well under 2 GB; a chunk ending at row t1 only touches key columns 0..t1-1 (the causal triangle).

Reconstructed formulas (the paper's display equations were lost; see shared/paper.md) are named
`(recon)` below and in the result dictionaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from study.attention.select import top_k_indices
from study.metrics import attention as metrics

DISTANCE_READINGS = ("sum_outside", "norm_of_sum")
DEFAULT_BUDGET = 1 << 23  # elements per chunk temporary (32 MB in fp32)


# ----------------------------------------------------------------------------------------------------------
# validation helpers


def check_ns(ns: Sequence[int], length: int) -> list[int]:
    """Validate a grid of N (top-N sizes) against the row length; returns sorted unique ints."""
    if length < 1:
        raise ValueError(f"empty rows: sequence length must be >= 1, got {length}")
    ns = [int(n) for n in ns]
    if not ns:
        raise ValueError("ns is empty: give at least one N")
    for n in ns:
        if n < 1:
            raise ValueError(f"N must be >= 1, got N={n}")
        if n > length:
            raise ValueError(f"N={n} exceeds the sequence length L={length}")
    return sorted(set(ns))


def check_temperatures(temperatures: Sequence[float]) -> list[float]:
    temperatures = [float(t) for t in temperatures]
    if not temperatures:
        raise ValueError("temperatures is empty")
    for t in temperatures:
        if not (t > 0 and math.isfinite(t)):
            raise ValueError(f"temperature must be finite and > 0, got T={t}")
    return temperatures


def _flatten(weights: torch.Tensor, x: torch.Tensor | None = None):
    """(..., L, L) and (..., L, D) -> (P, L, L), (P, L, D) with x broadcast over the leading dims."""
    if weights.ndim < 2 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be (..., L, L), got shape {tuple(weights.shape)}")
    length = weights.shape[-1]
    if length == 0:
        raise ValueError("empty rows: L = 0")
    lead = weights.shape[:-2]
    w = weights.reshape(-1, length, length)
    if x is None:
        return lead, w, None
    if x.shape[-2] != length:
        raise ValueError(f"x has {x.shape[-2]} positions but weights have L={length}")
    xs = x.expand(*lead, length, x.shape[-1]).reshape(-1, length, x.shape[-1])
    return lead, w, xs


ROW_BLOCKS = 6  # row chunks are at most L / ROW_BLOCKS rows: chunk k only needs key columns 0..t1 (the triangle)


def _chunk(length: int, width: int, budget: int) -> int:
    """Rows per chunk: within `budget` elements per (rows, width, L) temporary, and at most L / ROW_BLOCKS (at
    least 64) so that truncating each chunk's columns at its last row skips most of the masked upper triangle."""
    cap = max(64, -(-length // ROW_BLOCKS))
    return max(1, min(length, cap, budget // max(1, length * width)))


def _top_ranks(a: torch.Tensor, visible: torch.Tensor, k: int):
    """The k largest visible weights of each row in descending order, ties broken by position (the project's one
    rule, `study.attention.select.top_k_indices`, shared with attention's top-k).

    Returns (top, rank): top (C, k) key indices in rank order, and rank (C, L) with each top key's rank and L
    for every other key.
    """
    C, L = a.shape
    top = top_k_indices(a, k, visible)
    rank = torch.full((C, L), L, dtype=torch.long, device=a.device)
    rank.scatter_(-1, top, torch.arange(k, device=a.device).expand(C, k))
    return top, rank


def _distances_to(a: torch.Tensor, x: torch.Tensor, xn2: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """|alpha_i x_i - s_g| for rows a (C, L), vectors x (L, D), centres s (C, ..., D) -> (C, ..., L)."""
    shape = (a.shape[0],) + (1,) * (s.ndim - 2) + (a.shape[1],)
    # |a x - s|^2 = a^2 |x|^2 - 2 a x.s + |s|^2, with x.s from one matrix product; in place after that.
    sq = (s @ x.T).mul_((-2 * a).reshape(shape))
    sq.add_(((a * a) * xn2).reshape(shape)).add_((s * s).sum(-1, keepdim=True))
    return sq.clamp_min_(0).sqrt_()


# ----------------------------------------------------------------------------------------------------------
# Theorem 1: distance between the full and the top-N context vector (Algorithms 1-3)


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
    """
    lead, w, xs = _flatten(weights, x)
    P, L, _ = w.shape
    ns = check_ns(ns, L)
    G = len(ns)
    dev, dt = w.device, w.dtype
    nt = torch.tensor(ns, device=dev)
    names = ["d_sum_outside", "d_norm_of_sum", "expectation", "top_mass"]
    if bound:
        names += ["bound", "d1", "max_top_norm"]
    if mc_samples > 0:
        names.append("mc_expectation")
    out = {k: torch.full((P, L, G), math.nan, dtype=dt, device=dev) for k in names}
    gen = torch.Generator(device=dev).manual_seed(seed)
    # d1 needs the top-n_max keys' squared distances to every key (for every N at once, see below).
    n_max = max([n for n in ns if n < L], default=0) if bound else 0
    width = G * (mc_samples + 4) + 2 * n_max + 4
    C = _chunk(L, width, budget)
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
        for t0 in range(0, L, C):
            t1 = min(L, t0 + C)
            # Keys after the chunk's last row are invisible to all its rows: work on columns 0..t1-1 only
            # (the causal triangle, about half the work of full rows).
            Lc = t1
            xc, x2c = xp[:Lc], xn2[:Lc]
            n = pos[t0:t1] + 1  # visible count of each row
            visible = pos[None, :Lc] < n[:, None]
            a = w[p, t0:t1, :Lc].masked_fill(~visible, 0.0)
            k = min(max(ns), Lc)
            order, rank = _top_ranks(a, visible, k)
            rk = rank[:, None, :]
            member = rk < nt[None, :, None]  # (C, G, L): i in I_N
            outside = ~member & visible[:, None, :]
            aw = a[:, None, :] * member
            s = aw @ xc  # (C, G, D) top-N context vectors
            dist = _distances_to(a, xc, x2c, s)
            d_out = (dist * outside).sum(-1)
            total = a @ xc  # full context vector (C, D)
            n_f = n.to(dt)[:, None]
            n_out = n_f - nt_f[None, :]
            # sum_{i not in I_N} (alpha_i x_i - s) = (total - s) - (n - N) s
            d_in = (total[:, None, :] - s - n_out[..., None] * s).norm(dim=-1)
            A = aw.sum(-1)
            valid = n[:, None] >= nt[None, :]

            # Closed-form expectation over a uniformly random I_N (recon): with c = N/(n-1),
            # alpha_i x_i - c sum_{j != i} alpha_j x_j = (1 + c) alpha_i x_i - c * total, and
            # |(1 + c) a_i x_i - c total|^2 = (1+c)^2 a_i^2 |x_i|^2 - 2 c (1+c) a_i x_i.total + c^2 |total|^2.
            c = (nt_f[None, :] / (n_f - 1).clamp_min(1))[..., None]  # (C, G, 1)
            xt = total @ xc.T  # (C, L): x_i . total
            axx = a * a * x2c  # zero on invisible keys
            sq = torch.addcmul((c * c) * (total * total).sum(-1)[:, None, None], (1 + c) ** 2, axx[:, None, :])
            sq = sq.addcmul_(-2 * c * (1 + c), (a * xt)[:, None, :])
            e_terms = (sq.clamp_min_(0).sqrt_() * visible[:, None, :]).sum(-1)
            expectation = n_out / n_f * e_terms

            res = {"d_sum_outside": d_out, "d_norm_of_sum": d_in, "expectation": expectation, "top_mass": A}
            if bound:
                # max_{j in I_N} |x_j|: running max of the norms in rank order.
                max_top = torch.cummax(xnorm[order], dim=-1).values[:, (nt - 1).clamp_max(k - 1)]
                if n_max > 0:
                    # d1(N) = max over j in I_N, i outside I_N of |x_i - x_j|, for every N at once: the rows of
                    # the squared pairwise matrix for the top-n_max keys in rank order, maxima over the segments
                    # between consecutive N of the grid, a running max over segments (row N = max over the top N
                    # keys' rows), then a max over the keys outside I_N.
                    rows = sqpair[:, :Lc][order[:, :n_max]]  # (C, <= n_max, Lc)
                    segs, lo = [], 0
                    for N in ns:
                        hi = min(N, rows.shape[1])
                        seg = rows[:, lo:hi].amax(1) if hi > lo else segs[-1]
                        segs.append(seg if not segs else torch.maximum(segs[-1], seg))
                        lo = hi
                    q = torch.stack(segs, 1)  # (C, G, L)
                    d1 = q.masked_fill_(~outside, -1.0).amax(-1).clamp_min_(0).sqrt_()  # none outside: d1 = 0
                else:
                    d1 = torch.zeros_like(A)
                res["bound"] = (1 - A) * d1 + (n_out * A - (1 - A)) * max_top
                res["d1"] = d1
                res["max_top_norm"] = max_top
            if mc_samples > 0:
                # Uniform random subsets: a random permutation of the visible keys per (row, sample); its
                # first N keys are a uniform N-subset for every N at once.
                noise = torch.rand(len(n), mc_samples, Lc, generator=gen, device=dev, dtype=dt)
                noise = noise.masked_fill(~visible[:, None, :], 2.0)
                rrank = torch.empty(len(n), mc_samples, Lc, dtype=torch.long, device=dev)
                rrank.scatter_(-1, noise.argsort(-1), pos[:Lc].expand_as(rrank))  # rank of each key in the permutation
                mmember = rrank[:, :, None, :] < nt[None, None, :, None]  # (C, K, G, L)
                ms = (a[:, None, None, :] * mmember) @ xc
                mdist = _distances_to(a, xc, x2c, ms)
                mout = visible[:, None, None, :] & ~mmember
                res["mc_expectation"] = (mdist * mout).sum(-1).mean(1)
            for key, v in res.items():
                out[key][p, t0:t1] = v.masked_fill_(~valid, math.nan)
    result = {k: v.reshape(*lead, L, G) for k, v in out.items()}
    result["ns"] = ns
    result["valid"] = (pos[:, None] + 1 >= nt[None, :]).expand(*lead, L, G)
    return result


def critical_n(d_heads: torch.Tensor, e_heads: torch.Tensor, ns: Sequence[int],
               alphas: Sequence[float] = (0.01, 0.05)) -> dict:
    """Algorithm 3: the first N whose per-head distances d and expectations E are KS-indistinguishable.

    d_heads, e_heads: (G, heads) token-averaged d and E per head (NaN heads are dropped). For each N in
    increasing order a two-sample KS test (scipy.stats.ks_2samp) compares the two samples over heads;
    N* = first N with p >= alpha. Returns p-values per N and N* per alpha (None if never reached).
    """
    from scipy.stats import ks_2samp

    ns = [int(n) for n in ns]
    if d_heads.shape != e_heads.shape or d_heads.shape[0] != len(ns):
        raise ValueError(f"d_heads {tuple(d_heads.shape)} and e_heads {tuple(e_heads.shape)} must be (len(ns), heads)")
    pvalues, stats = [], []
    for g in range(len(ns)):
        d = d_heads[g][~torch.isnan(d_heads[g])].double().cpu().numpy()
        e = e_heads[g][~torch.isnan(e_heads[g])].double().cpu().numpy()
        if len(d) == 0 or len(e) == 0:
            pvalues.append(None)
            stats.append(None)
            continue
        test = ks_2samp(d, e)
        pvalues.append(float(test.pvalue))
        stats.append(float(test.statistic))
    star = {}
    for alpha in alphas:
        hit = [n for n, p in zip(ns, pvalues) if p is not None and p >= alpha]
        star[str(alpha)] = hit[0] if hit else None
    return {"ns": ns, "pvalues": pvalues, "ks_statistics": stats, "n_star": star, "alphas": list(alphas)}


# ----------------------------------------------------------------------------------------------------------
# Theorem 2: geometric separability (Algorithm 4)


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
    lead, w, xs = _flatten(weights, x)
    P, L, _ = w.shape
    ns = check_ns(ns, L)
    G = len(ns)
    dev, dt = w.device, w.dtype
    nt = torch.tensor(ns, device=dev)
    names = ["ratio", "n_s", "lower", "upper", "r", "delta", "xi_clamped"]
    out = {k: torch.full((P, L, G), math.nan, dtype=dt, device=dev) for k in names}
    radii = torch.empty(P, dtype=dt, device=dev)
    C = _chunk(L, max(3 * G, xs.shape[-1]), budget)
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
        for t0 in range(0, L, C):
            t1 = min(L, t0 + C)
            Lc = t1  # columns after the chunk's last row are invisible to all its rows
            xc, x2c = xp[:Lc], xn2[:Lc]
            n = pos[t0:t1] + 1
            visible = pos[None, :Lc] < n[:, None]
            a = w[p, t0:t1, :Lc].masked_fill(~visible, 0.0)
            _, rank = _top_ranks(a, visible, min(max(ns), Lc))
            member = rank[:, None, :] < nt[None, :, None]
            aw = a[:, None, :] * member
            s = aw @ xc
            dist = _distances_to(a, xc, x2c, s)  # (C, G, Lc)
            outside = visible[:, None, :] & ~member
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
# Corollary 3: gradient sensitivity (Algorithm 5)


def _causal_softmax(logits: torch.Tensor, visible: torch.Tensor, temperature: float) -> torch.Tensor:
    # Scale first, then mask with the dtype's min (not -inf): no NaN, no overflow at T < 1.
    z = (logits / temperature).masked_fill(~visible, torch.finfo(logits.dtype).min)
    return torch.softmax(z, dim=-1).masked_fill(~visible, 0.0)


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
    lead, w, _ = _flatten(logits)
    P, L, _ = w.shape
    if normalize is not None:
        if logits.ndim != 4:
            raise ValueError(f"with a normaliser, logits must be (B, H, L, L), got shape {tuple(logits.shape)}")
        heads = logits.shape[1]
    else:
        heads = 1
    gen = torch.Generator(device=w.device).manual_seed(seed)
    visible = torch.ones(L, L, dtype=torch.bool, device=w.device).tril()
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
            # -inf on masked keys once: every causal row keeps its diagonal key, so no row is fully masked, v is
            # 0 there (-inf + eps * 0 = -inf) and dividing -inf by T cannot overflow. Softmax gives exact zeros.
            lb = lp[:, t0:t1, :t1].masked_fill(~vis, -math.inf)
            vb = v[:, t0:t1, :t1]
            for i, T in enumerate(temperatures):
                a = torch.softmax(lb / T, dim=-1)
                for j, eps in enumerate(epsilons):
                    b = torch.softmax(torch.add(lb, vb, alpha=eps).div_(T), dim=-1)
                    g[p0:p1, t0:t1, i, j] = torch.linalg.vector_norm(b.sub_(a), dim=-1).div_(eps)
    return {"g": g.reshape(*lead, L, len(temperatures), len(epsilons)),
            "temperatures": temperatures, "epsilons": epsilons}


@torch.no_grad()
def softmax_jacobian_norm(probs: torch.Tensor, temperature: float = 1.0, iterations: int = 80) -> torch.Tensor:
    """Exact spectral norm of (1/T)(diag(a) - a a^T) for rows a (..., L) (zeros allowed), in float64.

    The same function the training monitors use (`study.metrics.softmax_jacobian_norm`: the root of the secular
    equation by bisection, O(L) per step instead of eigvalsh's O(L^3)), with this module's validation of T.
    """
    (temperature,) = check_temperatures([temperature])
    return metrics.softmax_jacobian_norm(probs, temperature, iterations=iterations)


# ----------------------------------------------------------------------------------------------------------
# Lemma 1: dilution


@torch.no_grad()
def dilution_stats(weights: torch.Tensor) -> dict:
    """Lemma 1 per causal row: max weight, and n * min / n * max weight over the n visible keys.

    A length-independent normaliser keeps C1 <= n alpha_i <= C2; the max weight then decays like 1/n.
    Returns (..., L) tensors max_weight, scaled_min, scaled_max, entropy (nats, with 0 log 0 = 0, so sparse
    rows with exact zeros are fine; rows that do not sum to 1, e.g. self_adjust, are renormalised over their
    non-negative part first), and "visible" (n per row).
    """
    lead, w, _ = _flatten(weights)
    L = w.shape[-1]
    pos = torch.arange(L, device=w.device)
    visible = pos[None, :] <= pos[:, None]
    n = (pos + 1).to(w.dtype)[:, None]
    wmax = w.masked_fill(~visible, -math.inf).amax(-1)
    wmin = w.masked_fill(~visible, math.inf).amin(-1)
    p = w.masked_fill(~visible, 0.0).clamp_min(0)
    p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    entropy = -torch.special.xlogy(p, p).sum(-1)
    return {"entropy": entropy.reshape(*lead, L),
            "max_weight": wmax.reshape(*lead, L), "scaled_min": (n[:, 0] * wmin).reshape(*lead, L),
            "scaled_max": (n[:, 0] * wmax).reshape(*lead, L), "visible": (pos + 1).tolist()}
