"""Statistics of attention rows: entropy, distance to uniform, top-k mass, Jacobian norm.

All functions take attention weights shaped (..., Lk) whose rows sum to 1 over the keys the query may see.
`allowed` is a bool tensor broadcastable to the weights (True = key visible to this query). A causal row t
sees t + 1 keys, and a padded query row sees none, so every statistic is taken against the VISIBLE count
n = allowed.sum(-1), never against Lk.

Conventions (used by the elementwise functions and by the reductions alike):

* Weights outside `allowed` are expected to be zero; `summarize_rows` zeroes them itself so that a model
  that masks with a large negative number instead of -inf (or gives padded rows some weights) is measured
  the same way.
* 0 log 0 = 0, so exact zeros (top-k, sparsemax, entmax) never produce NaN.
* Rows that do not sum to 1 (Self-Adjust Softmax, whose "plain" variant has negative weights) become
  distributions by `as_distribution`, |w| / sum |w|: the weight's magnitude says where the row looks. This is the
  project's one convention: the monitors apply it to such normalisers before every distribution statistic
  (`study.callbacks.base.row_distribution`), and the analyses' entropy (`study.frozen.analysis.dilution`) applies it
  to every row (for rows that already sum to 1 it changes nothing but rounding). A row of zeros stays zero
  (entropy 0). Each statistic is then computed by one function here (`row_entropy` for the entropy, also
  inside the reductions), so the same weights give the same number in training and in the analyses.
* A row with n = 0 (fully masked, padding) is *invalid*: every per-row function returns 0 there and the
  reductions leave it out of every sum and count.
* A row with n = 1 is *degenerate* for the normalised entropy: H / log(n) is 0 / 0. `normalized_entropy`
  returns 0 there and the reductions sum it over rows with n >= 2 only and divide by
  `rows_nondegenerate`. All other statistics are well defined at n = 1 (KL = TV = 0, max weight 1) and are
  averaged over every row with n >= 1 (`rows`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# ---------------------------------------------------------------------------------------------------------
# Per-row statistics
# ---------------------------------------------------------------------------------------------------------


def visible_count(allowed: Tensor) -> Tensor:
    """Number of keys each query may see, shaped (...)."""
    return allowed.sum(-1)


def as_distribution(weights: Tensor) -> Tensor:
    """|w| / sum |w| per row, for normalisers whose rows do not sum to 1 (Self-Adjust Softmax): the project's one
    convention for such rows (module docstring).

    Distribution statistics (entropy, KL/TV to uniform, top-k mass) then describe where the row puts its
    magnitude. Rows of all zeros stay zero.
    """
    magnitude = weights.abs()
    total = magnitude.sum(dim=-1, keepdim=True)
    return magnitude / torch.where(total > 0, total, torch.ones_like(total))


def row_entropy(weights: Tensor) -> Tensor:
    """Shannon entropy H = -sum a log a of each row, in nats, with 0 log 0 = 0."""
    return -torch.xlogy(weights, weights).sum(-1)


def _log_visible(n: Tensor) -> Tensor:
    # log n with log 0 replaced by 0: an empty row then gives 0 for every statistic built on it.
    return torch.log(n.clamp(min=1).to(torch.float32))


def normalized_entropy(weights: Tensor, allowed: Tensor) -> Tensor:
    """H / log(n), 1 for uniform attention over the visible keys and 0 for one-hot.

    Rows with n <= 1 are degenerate (0 / 0) and get 0; reductions exclude them (see module docstring).
    """
    n = visible_count(allowed)
    log_n = _log_visible(n)
    return torch.where(n >= 2, row_entropy(weights) / log_n.clamp(min=math.log(2)), 0.0)


def kl_to_uniform(weights: Tensor, allowed: Tensor) -> Tensor:
    """KL(a || uniform over the n visible keys) = log n - H. Zero for rows with n = 0."""
    n = visible_count(allowed)
    return torch.where(n >= 1, _log_visible(n) - row_entropy(weights), 0.0)


def tv_to_uniform(weights: Tensor, allowed: Tensor) -> Tensor:
    """Total variation 0.5 * sum over visible keys |a_i - 1/n|. Zero for rows with n = 0."""
    n = visible_count(allowed)
    inv_n = 1.0 / n.clamp(min=1).to(weights.dtype)
    dist = torch.where(allowed, (weights - inv_n.unsqueeze(-1)).abs(), 0.0).sum(-1)
    return torch.where(n >= 1, 0.5 * dist, 0.0)


def max_weight(weights: Tensor) -> Tensor:
    """The largest weight of each row."""
    return weights.amax(-1)


def effective_support(weights: Tensor) -> Tensor:
    """exp(H): the number of keys a uniform row with the same entropy would spread over."""
    return row_entropy(weights).exp()


def nonzero_count(weights: Tensor) -> Tensor:
    """Number of weights that are not exactly zero (the support of sparsemax / entmax rows)."""
    return (weights != 0).sum(-1)


def topk_mass(weights: Tensor, k: int) -> Tensor:
    """Total weight of the k largest entries of each row; 1 when k >= the number of visible keys."""
    k = min(k, weights.shape[-1])
    return weights.topk(k, dim=-1).values.sum(-1)


def _renormalised_top(top: Tensor, cum: Tensor, n: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The selected keys of each row, renormalised: (p, selected, m, kept).

    `top` holds each row's largest weights in descending order (at least k columns if Lk allows), `cum` their
    cumulative sum, `n` the visible count. Only the first m = min(k, n) columns count as selected (`selected`,
    bool); p is top / (their mass). `kept` is False for rows with n = 0 or no selected mass (all-zero padding):
    the statistics below give 0 there and the caller drops them.
    """
    kk = min(k, top.shape[-1])
    m = n.clamp(min=1, max=kk)
    mass = cum.gather(-1, (m - 1).unsqueeze(-1)).squeeze(-1)
    p = top[..., :kk] / mass.clamp(min=torch.finfo(top.dtype).tiny).unsqueeze(-1)
    selected = torch.arange(kk, device=top.device) < m.unsqueeze(-1)
    return p, selected, m, (n >= 1) & (mass > 0)


def _selection_tv_from_sorted(top: Tensor, cum: Tensor, n: Tensor, k: int) -> Tensor:
    """TV between the renormalised top-min(k, n) weights and uniform over those keys (see `_renormalised_top`)."""
    p, selected, m, kept = _renormalised_top(top, cum, n, k)
    inv_m = 1.0 / m.to(top.dtype)
    tv = 0.5 * torch.where(selected, (p - inv_m.unsqueeze(-1)).abs(), 0.0).sum(-1)
    return torch.where(kept, tv, 0.0)


def _selection_entropy_from_sorted(top: Tensor, cum: Tensor, n: Tensor, k: int) -> Tensor:
    """Entropy (nats) of the renormalised top-min(k, n) weights; 0 for rows with n = 0 or no selected mass.

    For one fixed row this is non-decreasing in k (adding a key changes H by h(w) - (1 - w) H_k >= 0), so
    comparing k within a run is a sanity check; comparing the same k across T or over training is not.
    """
    p, selected, _, kept = _renormalised_top(top, cum, n, k)
    return torch.where(kept, row_entropy(torch.where(selected, p, 0.0)), 0.0)


def selection_entropy(weights: Tensor, allowed: Tensor, k: int) -> Tensor:
    """Entropy (nats) of the renormalised top-k weights of each row (over min(k, n) keys); log k = uniform."""
    kk = min(k, weights.shape[-1])
    top = weights.topk(kk, dim=-1).values
    n = visible_count(allowed).expand(weights.shape[:-1])
    return _selection_entropy_from_sorted(top, top.cumsum(-1), n, k)


def selection_uniformity(weights: Tensor, allowed: Tensor, k: int) -> Tensor:
    """How uniform the selected set is: TV between the renormalised top-k weights and uniform over
    min(k, n) keys. 0 means the k selected keys carry equal weight (always so for k = 1); values near 1
    mean one key dominates the selection. Zero for rows with n = 0.
    """
    kk = min(k, weights.shape[-1])
    top = weights.topk(kk, dim=-1).values
    n = visible_count(allowed).expand(weights.shape[:-1])
    return _selection_tv_from_sorted(top, top.cumsum(-1), n, k)


SATURATED = 0.99  # a row is saturated when its largest weight exceeds this: its Jacobian is nearly 0 at any T
VISIBLE_BINS = 16  # bins of the visible count n: bin b holds 2**b <= n < 2**(b+1) (up to 65535 keys)


def visible_bin(n: Tensor) -> Tensor:
    """Bin index floor(log2 n) of each visible count (n >= 1), clamped to VISIBLE_BINS - 1; n = 0 gives 0."""
    return torch.log2(n.clamp(min=1).to(torch.float32)).floor().long().clamp(max=VISIBLE_BINS - 1)


def by_visible_sums(weights: Tensor, allowed: Tensor) -> dict[str, Tensor]:
    """Per-head sums of max weight and H / log n over rows binned by their visible count n (Lemma 1 in training).

    Row t of causal attention sees t + 1 keys, so one forward pass holds every n from 1 to L: how the max weight
    and the normalised entropy change with n is the dilution of the paper's Lemma 1 (max weight ~ 1/n for a
    length-independent normaliser), measured on the trained model's own rows. Returns float64 tensors shaped
    (H, VISIBLE_BINS): ``by_n/rows``, ``by_n/max_weight`` and ``by_n/normalized_entropy`` (bin 0 holds the n = 1
    rows, whose normalised entropy is 0 / 0 and is left at 0). Bins are powers of two; each statistic is one
    scatter-add of the rows into their bins.
    """
    w, n, valid, nondegenerate, log_n = _rows(weights, allowed)
    return _by_visible(n, valid, w.amax(-1), row_entropy(w) / log_n.clamp(min=math.log(2)), nondegenerate)


def _by_visible(n: Tensor, valid: Tensor, max_weight: Tensor, h_norm: Tensor, nondegenerate: Tensor) -> dict[str, Tensor]:
    """`by_visible_sums` from per-row values already computed (`summarize_rows` has them)."""
    bins = visible_bin(n).transpose(0, 1).reshape(n.shape[1], -1)  # (H, B * Lq): each row's bin, head first

    def per_bin(values: Tensor) -> Tensor:
        # A scatter-add into (H, bins), not a one-hot product: a (B, H, Lq, bins) float64 temporary per
        # statistic cost more than every other selection statistic of a logging step.
        values = values.to(torch.float64).transpose(0, 1).reshape(bins.shape)
        return torch.zeros(bins.shape[0], VISIBLE_BINS, dtype=torch.float64, device=values.device).scatter_add_(1, bins, values)

    return {
        "by_n/rows": per_bin(valid),
        # where, not multiply: a padded row's value may be NaN and 0 * NaN is NaN.
        "by_n/max_weight": per_bin(torch.where(valid, max_weight, 0.0)),
        "by_n/normalized_entropy": per_bin(torch.where(nondegenerate & valid, h_norm, 0.0)),
    }


# ---------------------------------------------------------------------------------------------------------
# Jacobian of softmax, on sampled rows
# ---------------------------------------------------------------------------------------------------------


def softmax_jacobian_norm(weights: Tensor, temperature: float, iterations: int = 60) -> Tensor:
    """Spectral norm of d softmax(l / T) / d l = (1/T) (diag(a) - a a^T) for each row of `weights` (..., Lk).

    The matrix is symmetric positive semi-definite, so its spectral norm is its largest eigenvalue; it lies
    in [0, 1/(2T)] (the paper's Corollary 3 states 1/(4T), which a two-key row at a = (1/2, 1/2) already
    exceeds). diag(a) - a a^T is a rank-one downdate of a diagonal matrix, so that eigenvalue is the root of the
    secular equation 1 = sum_i a_i^2 / (a_i - lambda) between the two largest weights, where the left side is
    monotone: bisection in float64 finds it with O(Lk) work per step. (`torch.linalg.eigvalsh` costs O(Lk^3) and
    fails to converge on the near-one-hot rows of low temperatures.) Ties at the top give lambda = a_(1).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    a = weights.to(torch.float64)
    if a.shape[-1] == 1:
        return torch.zeros(a.shape[:-1], dtype=torch.float64, device=a.device)
    top2 = a.topk(2, dim=-1).values
    hi, lo = top2[..., 0].clone(), top2[..., 1].clone()
    tied = hi <= lo
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        f = 1 - (a * a / (a - mid.unsqueeze(-1))).sum(-1)
        # f decreases on (a_(2), a_(1)): f > 0 means the root lies to the right of mid.
        right = f > 0
        lo, hi = torch.where(right, mid, lo), torch.where(right, hi, mid)
    return torch.where(tied, top2[..., 0], 0.5 * (lo + hi)) / temperature


def softmax_jacobian_max_entry(weights: Tensor, temperature: float) -> Tensor:
    """Largest |entry| of d softmax(l / T) / d l = (1/T) (diag(a) - a a^T) for each row of `weights` (..., Lk).

    The diagonal entries are a_i (1 - a_i) / T and the off-diagonal ones -a_i a_j / T, so the largest is
    max(max_i a_i (1 - a_i), a_(1) a_(2)) / T with a_(1) >= a_(2) the two largest weights. Both terms are at most
    1/4 (a_i + (1 - a_i) = 1 and a_(1) + a_(2) <= 1), so every entry is at most 1/(4T): the paper's Corollary 3
    read entrywise, which holds by mathematics. How close a row comes to it is the empirical question.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    a = weights.to(torch.float64)
    diagonal = (a * (1 - a)).amax(-1)
    if a.shape[-1] == 1:
        return diagonal / temperature
    top2 = a.topk(2, dim=-1).values
    return torch.maximum(diagonal, top2[..., 0] * top2[..., 1]) / temperature


def sample_rows(
    weights: Tensor, allowed: Tensor, n_rows: int, generator: torch.Generator | None = None
) -> Tensor:
    """Up to `n_rows` random non-degenerate rows (n >= 2) of `weights`, flattened to (n_rows, Lk).

    Deterministic for a given generator state. Weights outside `allowed` are zeroed. Returns fewer rows when
    fewer are valid. Uses boolean indexing (one host sync): meant for logging steps only.
    """
    lk = weights.shape[-1]
    # Counts from the mask as given (often (1, 1, Lq, Lk)), broadcast afterwards: no full-size temporaries.
    n = visible_count(allowed).expand(weights.shape[:-1])
    valid = (n.reshape(-1) >= 2).nonzero().squeeze(-1)
    device = generator.device if generator is not None else torch.device("cpu")
    perm = torch.randperm(valid.numel(), generator=generator, device=device)[:n_rows]
    pick = valid[perm.to(valid.device)]
    rows = weights.reshape(-1, lk)[pick]
    return rows.masked_fill(~allowed.expand(weights.shape).reshape(-1, lk)[pick], 0.0)


# ---------------------------------------------------------------------------------------------------------
# Reductions used during training
# ---------------------------------------------------------------------------------------------------------


def _rows(weights: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The one full-size copy (fp32, zero outside the visible keys), visible counts, validity masks, log n."""
    w = weights.to(torch.float32).masked_fill(~allowed, 0.0)
    return (w, *_counts(weights, allowed))


def _head_sums(per_row: dict[str, tuple[Tensor, Tensor]], valid: Tensor, nondegenerate: Tensor) -> dict[str, Tensor]:
    """Per-head float64 sums over batch and query positions of each (statistic, rows to keep) pair."""
    sums = {
        "rows": valid.sum((0, 2)).to(torch.float64),
        "rows_nondegenerate": nondegenerate.sum((0, 2)).to(torch.float64),
    }
    for key, (value, keep) in per_row.items():
        # where, not multiply: a padded row's statistic may be NaN and 0 * NaN is NaN.
        sums[key] = torch.where(keep, value.to(torch.float64), 0.0).sum((0, 2))
    return sums


def visible_row_entropy(weights: Tensor, allowed: Tensor) -> Tensor:
    """(B, H, Lq) entropy of each row over its visible keys, exactly as `entropy_sums` and `summarize_rows`
    compute it (from the same masked fp32 copy): pass it to them as ``entropy`` to skip computing it again."""
    return row_entropy(_rows(weights, allowed)[0])


def _counts(weights: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Visible counts (B, H, Lq), the validity masks n >= 1 and n >= 2, and log n, from the mask alone."""
    # Counts from the mask as given (often (1, 1, Lq, Lk)), then broadcast: summing the expanded mask would
    # cost as much as a pass over the weights.
    n = visible_count(allowed).expand(weights.shape[:-1])
    return n, n >= 1, n >= 2, _log_visible(n)


def entropy_sums(weights: Tensor, allowed: Tensor, entropy: Tensor | None = None) -> dict[str, Tensor]:
    """`summarize_rows` restricted to rows, rows_nondegenerate, entropy and normalized_entropy: no top-k, so it
    costs about a third of the full summary (the entropy monitor needs nothing else). With ``entropy`` (the rows'
    `visible_row_entropy`, already computed for this call) no pass over the weights at all."""
    if entropy is None:
        w, n, _, _, _ = _rows(weights, allowed)
        entropy = row_entropy(w)
    else:
        n = _counts(weights, allowed)[0]
    return row_entropy_sums(entropy, n)


def row_entropy_sums(entropy: Tensor, n: Tensor) -> dict[str, Tensor]:
    """`entropy_sums` from each row's entropy and visible count n (B, H, Lq): rows without a map
    (`study.attention.rowstats`)."""
    valid, nondegenerate, log_n = n >= 1, n >= 2, _log_visible(n)
    per_row = {
        "entropy": (entropy, valid),
        "normalized_entropy": (entropy / log_n.clamp(min=math.log(2)), nondegenerate),
    }
    return _head_sums(per_row, valid, nondegenerate)


def summarize_rows(
    weights: Tensor, allowed: Tensor, selection_ks: tuple[int, ...] = (1, 4, 16), by_visible: bool = False,
    entropy: Tensor | None = None,
) -> dict[str, Tensor]:
    """Per-head SUMS of row statistics over every valid row of `weights` (B, H, Lq, Lk).

    Sums (not means) so that calls over several batches, layers or processes can be added and divided once
    by `finalize`. Each value is a float64 tensor shaped (H,):

    rows                  rows with n >= 1 (the divisor of every statistic below but one)
    rows_nondegenerate    rows with n >= 2 (the divisor of normalized_entropy)
    entropy, normalized_entropy, kl_uniform, tv_uniform, max_weight, effective_support, nonzero,
    saturated             1 for rows whose max weight exceeds SATURATED (0.99), so its mean is a fraction,
    topk_mass/{k}, selection_tv/{k}, selection_entropy/{k}  for each k in `selection_ks`;
    with ``by_visible``, also `by_visible_sums`'s ``by_n/...`` (from the same copy, entropy and maxima).

    Memory: one masked fp32 copy of the weights plus one elementwise temporary at a time, and a single
    topk with the largest k whose values serve every k. ``entropy``: the rows' `visible_row_entropy` if another
    statistic of the same call has computed it (the same values; one pass over the weights fewer).
    """
    Lk = weights.shape[-1]
    w, n, _, _, _ = _rows(weights, allowed)
    entropy = row_entropy(w) if entropy is None else entropy
    # TV to uniform = sum_i (a_i - 1/n)_+ because both distributions sum to 1 over the visible keys; masked
    # keys hold 0 < 1/n and drop out of the positive part, so no mask is needed here.
    inv_n = 1.0 / n.clamp(min=1).to(torch.float32)
    tv = (w - inv_n.unsqueeze(-1)).clamp_(min=0.0).sum(-1)
    nonzero = (w != 0).sum(-1)

    # One topk with the largest k; every smaller k reads a prefix of it.
    kmax = min(max(selection_ks), Lk) if selection_ks else 1
    top = w.topk(kmax, dim=-1).values  # (B, H, Lq, kmax), descending
    return summarize_row_values(entropy, tv, nonzero, top, n, selection_ks, by_visible)


def summarize_row_values(
    entropy: Tensor, tv: Tensor, nonzero: Tensor, top: Tensor, n: Tensor, selection_ks: tuple[int, ...] = (1, 4, 16),
    by_visible: bool = False,
) -> dict[str, Tensor]:
    """`summarize_rows` from per-row values (B, H, Lq): entropy, TV to uniform, nonzero count, visible count n, and
    ``top`` (B, H, Lq, k), the row's largest weights in descending order with k = min(max(selection_ks), Lk).
    Rows without a map (`study.attention.rowstats`) are summarised here as the weights are."""
    valid, nondegenerate, log_n = n >= 1, n >= 2, _log_visible(n)
    kmax = top.shape[-1]
    cum = top.cumsum(-1)

    per_row: dict[str, tuple[Tensor, Tensor]] = {
        "entropy": (entropy, valid),
        "normalized_entropy": (entropy / log_n.clamp(min=math.log(2)), nondegenerate),
        "kl_uniform": (log_n - entropy, valid),
        "tv_uniform": (tv, valid),
        "max_weight": (top[..., 0], valid),
        "effective_support": (entropy.exp(), valid),
        "nonzero": (nonzero, valid),
        "saturated": (top[..., 0] > SATURATED, valid),
    }
    for k in selection_ks:
        per_row[f"topk_mass/{k}"] = (cum[..., min(k, kmax) - 1], valid)
        per_row[f"selection_tv/{k}"] = (_selection_tv_from_sorted(top, cum, n, k), valid)
        per_row[f"selection_entropy/{k}"] = (_selection_entropy_from_sorted(top, cum, n, k), valid)

    sums = _head_sums(per_row, valid, nondegenerate)
    if by_visible:
        sums.update(_by_visible(n, valid, top[..., 0], per_row["normalized_entropy"][0], nondegenerate))
    return sums


def finalize(sums: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per-head means from (accumulated) `summarize_rows` sums.

    normalized_entropy is divided by `rows_nondegenerate`, everything else by `rows`. A head with no
    counted row gets NaN, which says "no data" rather than a fake 0. The count keys are passed through.
    """
    out = {"rows": sums["rows"], "rows_nondegenerate": sums["rows_nondegenerate"]}
    for key, value in sums.items():
        if key in out:
            continue
        count = sums["rows_nondegenerate"] if key == "normalized_entropy" else sums["rows"]
        out[key] = torch.where(count > 0, value / count.clamp(min=1), float("nan"))
    return out
