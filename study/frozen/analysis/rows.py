"""Row helpers shared by the analyses: grid validation, flattening, row chunks, top-N ranks, distances.

Conventions (shared by every analysis):
- `weights` is (..., L, L): causal attention rows, row t sees keys 0..t (visible count n_t = t + 1) and is
  zero above the diagonal. `logits` is the same shape, unmasked (the analysis applies the mask).
- `x` is (..., L, D), broadcastable to the leading dims of `weights`: the vectors x_i the theorems talk
  about (per-head values by default; hidden states broadcast over heads as an option).
- Per-row outputs are (..., L, G) for a grid of G values of N, NaN where the statistic is undefined
  (N > n_t, or no key outside the top N where one is needed).
- Everything is computed from ONE descending ranking per row (`top_ranks`, the project's one tie rule: among
  equal weights the lowest position ranks first): the rank of each key gives membership of the top-N set for
  every N at once, and |alpha_i x_i - s|^2 = |alpha_i x_i|^2 - 2 alpha_i x_i.s + |s|^2 turns the per-key
  distances into a matrix product (no (rows, L, D) tensor is ever formed).
- Rows are processed in chunks sized by `budget` (elements per temporary) so L = 1024 with 12 heads stays
  well under 2 GB; a chunk ending at row t1 only touches key columns 0..t1-1 (the causal triangle).
- Row statistics that are not specific to the paper (entropy, the distribution of a row that does not sum to
  1, the softmax Jacobian's norm) come from `study.metrics`, so the analyses and the training monitors give the
  same number for the same weights.

Reconstructed formulas (the paper's display equations were lost; see docs/paper.md) are named
`(recon)` in the analyses and in the result dictionaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from study.attention.select import top_k_indices

DEFAULT_BUDGET = 1 << 23  # elements per chunk temporary (32 MB in fp32)
ROW_BLOCKS = 6  # row chunks are at most L / ROW_BLOCKS rows: chunk k only needs key columns 0..t1 (the triangle)


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
    """Validate temperatures (finite, > 0); returns them as floats in the order given."""
    temperatures = [float(t) for t in temperatures]
    if not temperatures:
        raise ValueError("temperatures is empty")
    for t in temperatures:
        if not (t > 0 and math.isfinite(t)):
            raise ValueError(f"temperature must be finite and > 0, got T={t}")
    return temperatures


def flatten_rows(weights: torch.Tensor, x: torch.Tensor | None = None):
    """(..., L, L) and (..., L, D) -> lead, (P, L, L), (P, L, D) with x broadcast over the leading dims."""
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


def rows_and_grid(weights: torch.Tensor, x: torch.Tensor | None, ns: Sequence[int]):
    """`flatten_rows`, then the grid of N checked against L (`check_ns`) and as a tensor on the rows' device:
    lead, (P, L, L), (P, L, D), the sorted N, their tensor."""
    lead, w, xs = flatten_rows(weights, x)
    ns = check_ns(ns, w.shape[-1])
    return lead, w, xs, ns, torch.tensor(ns, device=w.device)


def row_chunk(length: int, width: int, budget: int) -> int:
    """Rows per chunk: within `budget` elements per (rows, width, L) temporary, and at most L / ROW_BLOCKS (at
    least 64) so that truncating each chunk's columns at its last row skips most of the masked upper triangle."""
    cap = max(64, -(-length // ROW_BLOCKS))
    return max(1, min(length, cap, budget // max(1, length * width)))


def top_ranks(a: torch.Tensor, visible: torch.Tensor, k: int):
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


def distances_to(a: torch.Tensor, x: torch.Tensor, xn2: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """|alpha_i x_i - s_g| for rows a (C, L), vectors x (L, D), centres s (C, ..., D) -> (C, ..., L)."""
    shape = (a.shape[0],) + (1,) * (s.ndim - 2) + (a.shape[1],)
    # |a x - s|^2 = a^2 |x|^2 - 2 a x.s + |s|^2, with x.s from one matrix product; in place after that.
    sq = (s @ x.T).mul_((-2 * a).reshape(shape))
    sq.add_(((a * a) * xn2).reshape(shape)).add_((s * s).sum(-1, keepdim=True))
    return sq.clamp_min_(0).sqrt_()


@dataclass(frozen=True)
class TopChunk:
    """Query rows t0..t1-1 of one head against keys 0..t1-1 (the keys after the chunk's last row are invisible to
    all its rows), split into each row's top-N set for every N of the grid at once."""

    t0: int
    t1: int
    x: torch.Tensor  # (Lc, D) keys 0..t1-1
    xn2: torch.Tensor  # (Lc,) their squared norms
    n: torch.Tensor  # (C,) visible count of each row
    visible: torch.Tensor  # (C, Lc)
    a: torch.Tensor  # (C, Lc) weights, zero where invisible
    order: torch.Tensor  # (C, k) top keys in rank order, k = min(max N, Lc)
    member: torch.Tensor  # (C, G, Lc) key i is in I_N
    outside: torch.Tensor  # (C, G, Lc) key i is visible and not in I_N
    aw: torch.Tensor  # (C, G, Lc) weights of the top-N keys only
    s: torch.Tensor  # (C, G, D) top-N context vectors
    dist: torch.Tensor  # (C, G, Lc) |alpha_i x_i - s_N|


def top_chunks(w: torch.Tensor, x: torch.Tensor, xn2: torch.Tensor, nt: torch.Tensor, chunk: int):
    """The `TopChunk`s of one head's rows w (L, L) with vectors x (L, D), squared norms xn2 (L,), grid nt (G,)."""
    L = w.shape[0]
    pos = torch.arange(L, device=w.device)
    k_max = int(nt.max())
    for t0 in range(0, L, chunk):
        t1 = min(L, t0 + chunk)
        xc, x2c = x[:t1], xn2[:t1]
        n = pos[t0:t1] + 1
        visible = pos[None, :t1] < n[:, None]
        a = w[t0:t1, :t1].masked_fill(~visible, 0.0)
        order, rank = top_ranks(a, visible, min(k_max, t1))
        member = rank[:, None, :] < nt[None, :, None]
        aw = a[:, None, :] * member
        s = aw @ xc
        yield TopChunk(t0, t1, xc, x2c, n, visible, a, order, member, ~member & visible[:, None, :], aw, s,
                       distances_to(a, xc, x2c, s))
