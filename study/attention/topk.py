"""Top-k softmax attention by selection, then gather (Gupta et al. 2021): scores formed for L x k pairs, not L x L.

1. Select, without gradient: the k largest visible logits of each row, a block of query rows at a time over the
   keys those rows can reach (causality and a window leave the rest out, as on the explicit path), ranked by
   `study.attention.select.top_k_indices`'s rule: ties pick the lowest positions. `torch.topk` on the float
   logits finds the picks; only rows with a tie at the k-th value (exact ties: a zeroed query, a saturated row, a
   row that sees fewer than k keys) are ranked again by the exact rule. Memory: one block's (B, H, rows, keys)
   scores and the (B, H, Lq, k) picks.
2. Attend over the gathered keys only: the k picked keys and values of each row, their logits recomputed with
   gradient, the softmax over those k, the weighted sum. The backward pass differentiates through the gather, so it
   touches L x k scores.

The function is the explicit path's `_top_k_softmax` followed by the weighted values: picks on keys the row cannot
see (rows that see fewer than k keys) carry the finite mask value, whose weight underflows to 0 next to any visible
key, and rows that see no key output zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from study.attention import blockwise
from study.attention.registry import MASK_VALUE
from study.attention.select import top_k_indices

ALL = slice(None)


def select_top_k(q_len: int, kv_len: int, batch_heads: int, k: int, logits_of: Callable[[slice, slice], Tensor],
                 visible_of: Callable[[slice, slice], Tensor | None],
                 reach_of: Callable[[slice], slice] = lambda rows: ALL, rows_per_block: int | None = None) -> Tensor:
    """Indices (B, H, Lq, k) of the k largest visible logits of each row, descending, ties to the lowest position,
    computed a block of query rows at a time without gradient (``batch_heads`` = B * H sets the block size).

    ``logits_of(rows, keys)`` gives the logits the normaliser sees for the query rows ``rows`` and key columns
    ``keys``; ``visible_of(rows, keys)`` their bool visibility (None: all visible); ``reach_of(rows)`` the key
    columns those rows can see at all (the others are hidden from every row of the block). A row that sees fewer
    than k keys gets its visible keys first, then hidden ones (their weights are zero on every path).
    """
    rows_per_block = rows_per_block or blockwise.rows_per_block(batch_heads, kv_len)
    picks = []
    with torch.no_grad():
        for start in range(0, q_len, rows_per_block):
            rows = slice(start, min(start + rows_per_block, q_len))
            keys = _widened(reach_of(rows), kv_len, k)
            z = logits_of(rows, keys)
            seen = visible_of(rows, keys)
            if seen is not None:
                z = z.masked_fill(~seen, MASK_VALUE)
            picks.append(ranked_top_k(z, k) + (keys.start or 0))
    return torch.cat(picks, dim=-2)


def ranked_top_k(values: Tensor, k: int) -> Tensor:
    """`top_k_indices(values, k)` (descending, ties to the lowest position) through `torch.topk` on the floats:
    the exact rule reruns only on rows whose k-th value is tied with a value left out, and the picks are put in
    (value, position) order, which `torch.topk` leaves open among equal values."""
    picked, index = values.topk(k, dim=-1, sorted=True)
    tied = (values >= picked[..., -1:]).sum(dim=-1) > k
    if bool(tied.any()):
        flat = index.reshape(-1, k).clone()
        rows = tied.reshape(-1)
        flat[rows] = top_k_indices(values.reshape(-1, values.shape[-1])[rows], k)
        index = flat.view(index.shape)
    # among equal picked values, ascending position: stable sorts by position, then by value
    index = index.sort(dim=-1).values
    order = values.gather(-1, index).sort(dim=-1, descending=True, stable=True).indices
    return index.gather(-1, order)


def _widened(keys: slice, kv_len: int, k: int) -> slice:
    """``keys`` (a slice of 0..kv_len) holding at least k columns, so that a row can make k picks."""
    start, stop = keys.start or 0, kv_len if keys.stop is None else keys.stop
    if stop - start >= k:
        return keys
    stop = min(max(stop, start + k), kv_len)
    return slice(max(stop - k, 0), stop)


def gathered_attention(query: Tensor, key: Tensor, value: Tensor, index: Tensor,
                       logits_of_gathered: Callable[[Tensor, Tensor, Tensor], Tensor],
                       visible_of_gathered: Callable[[Tensor], Tensor | None]) -> Tensor:
    """Softmax attention of each row over its picked keys ``index`` (B, H, Lq, k) only; differentiable in q, k, v.

    ``logits_of_gathered(query, picked_keys, index)`` gives the (B, H, Lq, k) logits the normaliser sees from the
    picked keys (B, H, Lq, k, D); ``visible_of_gathered(index)`` whether each pick is visible (None: all are).
    """
    picked_keys = _gather_rows(key, index)
    z = logits_of_gathered(query, picked_keys, index)
    seen = visible_of_gathered(index)
    if seen is not None:
        z = z.masked_fill(~seen, MASK_VALUE)
    weights = z.softmax(dim=-1)
    if seen is not None:
        weights = weights * seen.any(dim=-1, keepdim=True)
    picked_values = _gather_rows(value, index)
    return torch.matmul(weights.to(value.dtype).unsqueeze(-2), picked_values).squeeze(-2)


def _gather_rows(tensor: Tensor, index: Tensor) -> Tensor:
    """(B, H, Lq, k, D): for each query row, the rows ``index`` (B, H, Lq, k) of ``tensor`` (B, H, Lk, D). One flat
    gather along the key axis, so the backward pass scatters into a (B, H, Lk, D) gradient, never (Lq, Lk, D)."""
    batch, heads, q_len, k = index.shape
    flat = index.reshape(batch, heads, q_len * k, 1).expand(-1, -1, -1, tensor.shape[-1])
    return tensor.gather(2, flat).reshape(batch, heads, q_len, k, tensor.shape[-1])


__all__ = ["gathered_attention", "ranked_top_k", "select_top_k"]
