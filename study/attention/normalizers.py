"""Row normalisers: fp32 scores over allowed keys -> attention weights.

Every normaliser is an `nn.Module` so that learnable parameters (a later normaliser's scale or alpha) live in the
model's state dict. The contract:

    weights = normalizer(scores, allowed)

- ``scores``: fp32, shaped (B, H, Lq, Lk), already multiplied by ``scaling / T``.
- ``allowed``: bool, broadcastable to ``scores``; True where the query may attend (causal, padding and top-k
  selection folded in). A row may have no allowed key at all (a padded query): its weights must be all zero,
  never NaN.
- ``weights``: same shape as ``scores``, zero wherever ``allowed`` is False.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from study.attention.spec import AttentionSpec

# Finite stand-in for -inf: -inf gives NaN on rows with no allowed key (exp(-inf - -inf)).
MASK_VALUE = torch.finfo(torch.float32).min


class Normalizer(nn.Module):
    """Base class; subclasses set `name` and implement `forward`."""

    name: ClassVar[str]

    @classmethod
    def check_spec(cls, spec: AttentionSpec) -> None:
        """Reject spec combinations this normaliser cannot take (raise ValueError naming the value)."""

    @classmethod
    def from_spec(cls, spec: AttentionSpec, num_heads: int) -> Normalizer:
        return cls()

    def forward(self, scores: Tensor, allowed: Tensor) -> Tensor:
        raise NotImplementedError


class Softmax(Normalizer):
    """exp(score) / sum exp(score) over allowed keys: the stock normaliser."""

    name = "softmax"

    def forward(self, scores: Tensor, allowed: Tensor) -> Tensor:
        weights = scores.masked_fill(~allowed, MASK_VALUE).softmax(dim=-1)
        # A row with no allowed key softmaxes to uniform over masked keys: zero it instead.
        return weights.masked_fill(~allowed, 0.0)


NORMALIZERS: dict[str, type[Normalizer]] = {cls.name: cls for cls in (Softmax,)}


def top_k_allowed(scores: Tensor, allowed: Tensor, k: int) -> Tensor:
    """Restrict ``allowed`` to exactly the k largest allowed scores of each row.

    `torch.topk` picks exactly k indices (a threshold on the k-th value would keep every tied score). Rows that
    see fewer than k keys keep them all: the extra picks land on masked keys and are dropped by the final `&`.
    """
    if k >= scores.shape[-1]:
        return allowed.expand_as(scores)
    masked = scores.masked_fill(~allowed, MASK_VALUE)
    index = masked.topk(k, dim=-1, sorted=False).indices
    selected = torch.zeros_like(masked, dtype=torch.bool).scatter_(-1, index, True)
    return selected & allowed
