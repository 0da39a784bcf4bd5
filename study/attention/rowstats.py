"""Statistics of softmax attention rows without the attention map: O(L) memory beyond SDPA's own.

For one row with logits s over its visible keys (z = l / T, what the softmax sees) and p = softmax(s):

    entropy          H = lse(s) - sum_j p_j s_j
    first-key weight exp(s_first - lse(s))              the first visible key (the attention sink)
    largest weight   exp(max s - lse(s))
    collision mass   sum_j p_j^2 = exp(lse(2 s) - 2 lse(s))
    max logit        max s, and the same before T (no gradient)
    top-k weights    exp(s_(1..k) - lse(s)), the k largest, descending

Two ways compute them, both without an (Lq, Lk) tensor:

- fused: sum_j p_j s_j = z-scale * q . SDPA(q, k, v = k), and the log-sum-exp the fused kernel returns beside its
  output (``aten._scaled_dot_product_flash_attention_for_cpu`` on CPU, the memory-efficient kernel on CUDA). One
  fused call gives the entropy and, with one gathered key per row, the first-key weight. It needs logits that are
  q.k times a scale (no soft-capping, no additive bias) and a kernel that returns the log-sum-exp;
- key blocks: the scores of a block of keys at a time, merged online as flash attention merges them (a running
  maximum m, sum exp(s - m), sum exp(2 (s - m)), sum exp(s - m) (s - m), the running top-k, the first visible key,
  the logits' count, mean and centred sum of squares by Chan's merge), each sum only when a statistic asked for
  needs it. Entropy from this pass is lse - sum p s computed on logits shifted by the row maximum, so large logits
  (T = 0.01) lose no precision. A second pass, only for the total variation to uniform over the visible keys and
  the count of weights that are not exactly zero, reads exp(s - m) again once m is final; with one key block m is
  final after the first, whose exp(s - m) it reuses.

Memory: a few (B, H, Lq, block) score tensors, the block sized by `study.attention.blockwise`'s ``block_scores``,
and per-row accumulators. Nothing here builds an autograd graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from study.attention import blockwise

ALL = slice(None)

FUSED_ONLY = frozenset({"entropy", "first_key"})
"""What the fused way gives on its own; any other statistic takes the key-block pass."""
SECOND_PASS = frozenset({"tv_uniform", "nonzero"})
"""What needs the final log-sum-exp of every key: a second pass over the key blocks."""

STATISTICS = frozenset({"entropy", "first_key", "max_weight", "collision", "max_logit", "top", "logit_moments",
                        "tv_uniform", "nonzero"})


@dataclass(frozen=True)
class RowStatistics:
    """Per-row statistics of one softmax attention call, each (B, H, Lq) unless said; fields not asked for are
    None. Rows that see no key (n = 0) hold meaningless values: consumers leave them out by ``visible``.

    visible: the number of keys each row sees (int64). entropy: H in nats. first_key_weight: the weight of the row's
    first visible key. max_weight, collision: the largest weight and sum_j p_j^2. scaled_max / raw_max: the largest
    logit the softmax sees (z = l / T) and the same before T (-inf on an empty row). top_weights: (B, H, Lq, k), the
    k largest weights in descending order (0 past a row's visible keys). logit_count, logit_sum, logit_m2: float64
    count, sum and sum of squared deviations from the row's own mean of the visible z. tv_uniform: total variation to
    the uniform row over the visible keys. nonzero: weights that are not exactly zero.
    """

    visible: Tensor
    entropy: Tensor | None = None
    first_key_weight: Tensor | None = None
    max_weight: Tensor | None = None
    collision: Tensor | None = None
    scaled_max: Tensor | None = None
    raw_max: Tensor | None = None
    top_weights: Tensor | None = None
    logit_count: Tensor | None = None
    logit_sum: Tensor | None = None
    logit_m2: Tensor | None = None
    tv_uniform: Tensor | None = None
    nonzero: Tensor | None = None


def fused_logsumexp(query: Tensor, key: Tensor, attn_mask: Tensor | None, is_causal: bool,
                    scale: float) -> tuple[Tensor, Tensor] | None:
    """(SDPA(q, k, v = k), log-sum-exp of q.k * scale per row) from one fused kernel that returns both, or None
    where PyTorch exposes no such kernel for these tensors (then the caller takes the key-block pass).

    ``attn_mask``: bool (True = visible) broadcastable to (B, H, Lq, Lk), or None. Heads already shared out.
    A row that sees no key gets a log-sum-exp of 0 and a zero output from these kernels: callers mask it.
    """
    float_mask = None
    if attn_mask is not None:
        float_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~attn_mask, -math.inf)
    if query.device.type == "cpu":
        output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, key, 0.0, is_causal, attn_mask=float_mask, scale=scale)
        return output, lse
    if query.device.type == "cuda" and query.dtype in (torch.float32, torch.float16, torch.bfloat16):
        if float_mask is not None:  # the efficient kernel wants a full-size bias with aligned strides
            float_mask = float_mask.expand(query.shape[0], query.shape[1], query.shape[-2], key.shape[-2])
        output, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, key, float_mask, True, 0.0, is_causal, scale=scale)
        return output, lse[..., : query.shape[-2]]
    return None


def row_statistics(
    query: Tensor,
    key: Tensor,
    *,
    scaling: float,
    temperature: float = 1.0,
    visible_of: Callable[[slice], Tensor | None] = lambda keys: None,
    rows_of: Callable[[slice], slice] = lambda keys: ALL,
    mask: Tensor | None = None,
    is_causal: bool = False,
    logit_transform: Callable[[Tensor, slice, slice], Tensor] | None = None,
    needs: frozenset[str] = STATISTICS,
    top_k: int = 1,
    block_keys: int | None = None,
) -> RowStatistics:
    """The statistics ``needs`` (names from `STATISTICS`) of softmax rows over logits z = l / T, l = q.k * scaling
    (then ``logit_transform(l, rows, keys)``: the model's soft-capping and biases for the query rows ``rows`` and
    key columns ``keys``).

    Args:
        query: (B, H, Lq, D); key: (B, H, Lk, D) with heads already shared out (grouped-query attention).
        visible_of: the bool visibility of the key columns ``keys`` (a slice), broadcastable to
            (B, H, Lq, block), or None when all are visible: the mask, causality and the sliding window.
        rows_of: the query rows that can see any of the key columns ``keys`` (a slice; causality and a window
            leave the others out, which the key-block pass then skips: a row's statistics over keys it cannot see
            are unchanged by them). Default: every row.
        mask, is_causal: the same visibility as one whole mask (or None) and SDPA's causal flag, handed to the
            fused kernel; used only without ``logit_transform``.
        top_k: how many of the largest weights ``top`` keeps (at most Lk).
        block_keys: keys per block; default from ``block_scores`` (`study.attention.blockwise`).

    Computed in ``torch.promote_types(query.dtype, float32)`` without autograd and outside autocast.
    """
    unknown = needs - STATISTICS
    if unknown:
        raise ValueError(f"unknown row statistics {sorted(unknown)}; known: {sorted(STATISTICS)}")
    exact = torch.promote_types(query.dtype, torch.float32)
    with torch.no_grad(), torch.autocast(device_type=query.device.type, enabled=False):
        query, key = query.detach().to(exact), key.detach().to(exact)
        scale = scaling / temperature
        fused = None
        if needs <= FUSED_ONLY and logit_transform is None:
            fused = fused_logsumexp(query, key, mask, is_causal, scale)
        return _statistics(query, key, scaling, temperature, visible_of, rows_of, logit_transform, needs, top_k,
                           block_keys, fused)


def _rows(tensor: Tensor, rows: slice) -> Tensor:
    """The query rows ``rows`` of a (..., Lq, block) tensor, or the tensor itself where it broadcasts over rows."""
    return tensor if rows == ALL or tensor.shape[-2] == 1 else tensor[..., rows, :]


def _no_rows(rows: slice, q_len: int) -> bool:
    """Whether the slice ``rows`` of 0..q_len is empty."""
    return len(range(q_len)[rows]) == 0


def _statistics(query, key, scaling, temperature, visible_of, rows_of, logit_transform, needs, top_k, block_keys,
                fused) -> RowStatistics:
    batch, heads, q_len = query.shape[0], query.shape[1], query.shape[-2]
    kv_len = key.shape[-2]
    rows = (batch, heads, q_len)
    device, dtype = query.device, query.dtype
    per_block = (max(min(block_keys, kv_len), 1) if block_keys
                 else blockwise.keys_per_block(batch * heads, q_len, kv_len))
    full_pass = fused is None
    top_k = min(top_k, kv_len)
    # with one key block m is final after it: the second pass reads its exp(z - m) instead of forming them again
    keep_block = per_block >= kv_len and bool(needs & SECOND_PASS)
    kept: tuple[slice, Tensor] | None = None  # (rows, exp(z - m)) of that block

    count = torch.zeros(rows, dtype=torch.int64, device=device)
    first = torch.full(rows, kv_len, dtype=torch.int64, device=device)
    if full_pass:
        m = torch.full(rows, -math.inf, dtype=dtype, device=device)
        total = torch.zeros(rows, dtype=dtype, device=device)  # sum exp(z - m)
        total2 = torch.zeros(rows, dtype=dtype, device=device)  # sum exp(2 (z - m))
        shifted = torch.zeros(rows, dtype=dtype, device=device)  # sum exp(z - m) (z - m)
        raw_max = torch.full(rows, -math.inf, dtype=dtype, device=device)
        top = torch.full((*rows, top_k), -math.inf, dtype=dtype, device=device) if "top" in needs else None
        moments = [torch.zeros(rows, dtype=torch.float64, device=device) for _ in range(3)]  # count, mean, m2
        first_z = torch.zeros(rows, dtype=dtype, device=device)  # z of the first visible key

    def block_logits(rows: slice, keys: slice) -> tuple[Tensor, Tensor, Tensor]:
        """(raw logits, z, visible) of the query rows ``rows`` and key columns ``keys``, masked entries -inf in
        both (-inf / T is -inf: z is the same as masking after the division)."""
        raw = torch.matmul(query[..., rows, :], key[..., keys, :].transpose(-1, -2)) * scaling
        if logit_transform is not None:
            raw = logit_transform(raw, rows, keys)
        seen = visible_of(keys)
        seen = torch.ones((), dtype=torch.bool, device=device) if seen is None else _rows(seen, rows)
        seen = seen.expand(raw.shape)
        # in place on the product this function made; a transform's result may be a view of the model's tensors
        raw = raw.masked_fill_(~seen, -math.inf) if logit_transform is None else raw.masked_fill(~seen, -math.inf)
        return raw, raw / temperature, seen

    for start in range(0, kv_len, per_block):
        keys = slice(start, min(start + per_block, kv_len))
        if not full_pass:  # the fused way needs the counts and first visible keys only: masks, no scores
            at = ALL
            seen = visible_of(keys)
            seen = torch.ones((), dtype=torch.bool, device=device) if seen is None else seen
            seen = seen.expand(*rows, keys.stop - keys.start)
        else:
            at = rows_of(keys)  # the rows that see any of these keys; the block changes no other row
            if _no_rows(at, q_len):
                continue
            raw, z, seen = block_logits(at, keys)
        block_count = seen.sum(-1)
        if "first_key" in needs:
            local = seen.to(torch.uint8).argmax(-1, keepdim=True)  # the block's first visible key (argmax: the first)
            found = (first[..., at] == kv_len) & (block_count > 0)
            first[..., at] = torch.where(found, local[..., 0] + start, first[..., at])
            if full_pass:
                first_z[..., at] = torch.where(found, z.gather(-1, local)[..., 0], first_z[..., at])
        count[..., at] += block_count
        if not full_pass:
            continue
        if "max_logit" in needs:
            raw_max[..., at] = torch.maximum(raw_max[..., at], raw.amax(-1))
        m_at, total_at = m[..., at], total[..., at]
        new_m = torch.maximum(m_at, z.amax(-1))
        safe_m = torch.where(new_m.isfinite(), new_m, 0.0)
        rescale = torch.exp(m_at - safe_m)  # 0 while m is -inf
        step = torch.where(m_at.isfinite(), m_at - safe_m, 0.0)
        centred = z - safe_m[..., None]
        e = torch.exp(centred)  # 0 on masked keys
        if keep_block:
            kept = (at, e)
        if "entropy" in needs:
            shifted[..., at] = (rescale * (shifted[..., at] + step * total_at)
                                + torch.where(seen, e * centred, 0.0).sum(-1))
        total[..., at] = rescale * total_at + e.sum(-1)
        if "collision" in needs:
            total2[..., at] = rescale.square() * total2[..., at] + e.square().sum(-1)
        m[..., at] = new_m
        if top is not None:
            # the first block's top needs no merge with the -inf it starts from (a block narrower than k does)
            merged = z if start == 0 and z.shape[-1] >= top_k else torch.cat([top[..., at, :], z], dim=-1)
            top[..., at, :] = merged.topk(top_k, dim=-1).values
        if "logit_moments" in needs:
            _merge_moments(moments, at, z, seen, block_count)

    has_keys = count > 0
    out: dict[str, Tensor | None] = {"visible": count}
    if not full_pass:
        output, lse = fused
        lse = lse.to(dtype)
        mean_logit = (query * output.to(dtype)).sum(-1) * (scaling / temperature)
        if "entropy" in needs:
            out["entropy"] = torch.where(has_keys, lse - mean_logit, 0.0)
    else:
        safe_total = torch.where(has_keys, total, 1.0)
        log_total = safe_total.log()
        lse = torch.where(has_keys, m + log_total, 0.0)
        if "entropy" in needs:
            out["entropy"] = torch.where(has_keys, log_total - shifted / safe_total, 0.0)
        if "max_weight" in needs:
            out["max_weight"] = torch.where(has_keys, 1.0 / safe_total, 0.0)
        if "collision" in needs:
            out["collision"] = torch.where(has_keys, total2 / safe_total.square(), 0.0)
        if "max_logit" in needs:
            out["scaled_max"], out["raw_max"] = m, raw_max
        if top is not None:
            out["top_weights"] = torch.exp(top - lse[..., None]) * has_keys[..., None]
        if "logit_moments" in needs:
            out["logit_count"], mean, out["logit_m2"] = moments
            out["logit_sum"] = mean * out["logit_count"]
    if "first_key" in needs:
        if not full_pass:  # one gathered key per row: the fused way has no logit transform
            index = first.clamp(max=kv_len - 1)
            k_first = key.gather(-2, index[..., None].expand(*rows, key.shape[-1]))
            first_z = (query * k_first).sum(-1) * scaling / temperature
        out["first_key_weight"] = torch.where(has_keys, torch.exp(first_z - lse), 0.0)
    if needs & SECOND_PASS:
        out.update(_second_pass(block_logits, rows_of, kv_len, per_block, m, safe_total, count, needs, kept))
    return RowStatistics(**out)


def _merge_moments(moments: list[Tensor], rows: slice, z: Tensor, seen: Tensor, block_count: Tensor) -> None:
    """Chan et al.'s merge of (count, mean, m2) of the query rows ``rows`` with one block's visible logits, per
    row, in float64."""
    n_a, mean_a, m2_a = (moment[..., rows] for moment in moments)
    n_b = block_count.to(torch.float64)
    values = z.masked_fill(~seen, 0.0)
    mean_b32 = values.sum(-1) / block_count.clamp(min=1)
    m2_b = (values - mean_b32[..., None]).masked_fill_(~seen, 0.0).square_().sum(-1).to(torch.float64)
    mean_b = mean_b32.to(torch.float64)
    n = n_a + n_b
    safe_n = n.clamp(min=1)
    delta = mean_b - mean_a
    merged = (n, mean_a + delta * n_b / safe_n, m2_a + m2_b + delta.square() * n_a * n_b / safe_n)
    for moment, value in zip(moments, merged):
        moment[..., rows] = value


def _second_pass(block_logits, rows_of, kv_len: int, per_block: int, m: Tensor, total: Tensor, count: Tensor,
                 needs: frozenset[str], kept: tuple[slice, Tensor] | None = None) -> dict[str, Tensor]:
    """Total variation to uniform and the nonzero count, from p = exp(z - m) / sum exp(z - m) read again (or, with
    one key block, from its exp(z - m) ``kept`` by the first pass: the same numbers)."""
    inv_n = 1.0 / count.clamp(min=1).to(m.dtype)
    safe_m = torch.where(m.isfinite(), m, 0.0)
    tv = torch.zeros_like(m)
    nonzero = torch.zeros_like(count)
    q_len = m.shape[-1]
    for start in range(0, kv_len, per_block):
        keys = slice(start, min(start + per_block, kv_len))
        at = rows_of(keys)
        if _no_rows(at, q_len):
            continue
        if kept is not None:
            at, e = kept
        else:
            _, z, _ = block_logits(at, keys)
            e = torch.exp(z - safe_m[..., at, None])
        p = e / total[..., at, None]
        tv[..., at] += (p - inv_n[..., at, None]).clamp_(min=0.0).sum(-1)
        nonzero[..., at] += (p != 0).sum(-1)
    out = {}
    if "tv_uniform" in needs:
        out["tv_uniform"] = tv
    if "nonzero" in needs:
        out["nonzero"] = nonzero
    return out


__all__ = ["FUSED_ONLY", "STATISTICS", "RowStatistics", "fused_logsumexp", "row_statistics"]
