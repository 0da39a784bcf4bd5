"""Top-k selection with one tie rule for the whole project: among equal values the lowest position wins.

`torch.topk` leaves the order of tied values unspecified (it picked keys 3 and 5 of the tied keys 1, 2, 3, 5),
so both attention paths and the analyses rank through `top_k_indices`, which makes the position part of the
key: exact ties, such as the equal scores of a zeroed query or of a saturated low-temperature row, pick the same
keys on every path and device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def top_k_indices(values: Tensor, k: int, allowed: Tensor | None = None) -> Tensor:
    """Indices (..., k) of the k largest entries of the last dimension, in descending order.

    Ties are broken by position: the lower index ranks first. Keys outside ``allowed`` (bool, broadcastable)
    rank after every allowed key, again in position order, so a row that allows fewer than k keys gets its
    allowed keys first and then the lowest disallowed positions.

    float32 (the attention scores, the analyses' weights) runs `topk` on an exact int64 key: the float's bits
    made monotone in its value, shifted up, minus the position. That costs far less than a sort when k << L.
    Other dtypes use one stable sort.
    """
    length = values.shape[-1]
    if not 1 <= k <= length:
        raise ValueError(f"k must be in 1..{length}, got {k!r}")
    if allowed is not None:
        values = values.masked_fill(~allowed, -math.inf)
    if values.dtype != torch.float32:
        return torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]
    bits = (values + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # monotone in the float value (negative floats flipped)
    key = (bits.to(torch.int64) << 32) - torch.arange(length, device=values.device)
    return key.topk(k, dim=-1, sorted=True).indices


def top_k_allowed(scores: Tensor, allowed: Tensor, k: int) -> Tensor:
    """Restrict ``allowed`` to exactly the k largest allowed scores of each row (ties: lowest position).

    Exactly k indices are picked (a threshold on the k-th value would keep every tied score). Rows that see fewer
    than k keys keep them all: the extra picks land on masked keys and are dropped by the final `&`.
    """
    if k >= scores.shape[-1]:
        return allowed.expand_as(scores)
    index = top_k_indices(scores, k, allowed)
    selected = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, index, True)
    return selected & allowed


__all__ = ["top_k_allowed", "top_k_indices"]
