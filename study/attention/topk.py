"""Top-k softmax attention by selection, then gather (Gupta et al. 2021): scores formed for L x k pairs, not L x L.

1. Select, without gradient: the k largest visible logits of each row, a block of keys at a time (a running top-k
   merged with each block's scores), ranked by `study.attention.select.top_k_indices` so that ties pick the lowest
   positions, as on the explicit path. Memory: a (B, H, Lq, block) score tensor and the (B, H, Lq, k) picks.
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


def select_top_k(query: Tensor, key: Tensor, k: int, logits_of: Callable[[Tensor, Tensor, slice], Tensor],
                 visible_of: Callable[[slice], Tensor | None], block_keys: int | None = None) -> Tensor:
    """Indices (B, H, Lq, k) of the k largest visible logits of each row, descending, ties to the lowest position
    (hidden keys rank after every visible one, in position order), computed over blocks of keys without gradient.

    ``logits_of(query, key_block, keys)`` gives the logits the normaliser sees for the key columns ``keys``;
    ``visible_of(keys)`` their bool visibility (None: all visible).
    """
    batch, heads, q_len, kv_len = query.shape[0], query.shape[1], query.shape[-2], key.shape[-2]
    per_block = (max(min(block_keys, kv_len), 1) if block_keys
                 else blockwise.keys_per_block(batch * heads, q_len, kv_len))
    values = index = None
    with torch.no_grad():
        for start in range(0, kv_len, per_block):
            keys = slice(start, min(start + per_block, kv_len))
            z = logits_of(query, key[..., keys, :], keys)
            seen = visible_of(keys)
            if seen is not None:
                z = z.masked_fill(~seen, MASK_VALUE)
            positions = torch.arange(keys.start, keys.stop, device=query.device).expand(z.shape)
            if values is not None:
                # The running picks come first, in rank order: among equal values their positions are lower than
                # the block's and ascending, so the tie rule of one call over the whole row holds across blocks.
                z, positions = torch.cat([values, z], dim=-1), torch.cat([index, positions], dim=-1)
            picked = top_k_indices(z, min(k, z.shape[-1]))
            values, index = z.gather(-1, picked), positions.gather(-1, picked)
    return index


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


__all__ = ["gathered_attention", "select_top_k"]
