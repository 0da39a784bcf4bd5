"""`attend`: scaled dot-product attention under an `AttentionSpec`, for any model.

Two paths compute the same function:
- fast: stock softmax with no top-k and no open tap runs PyTorch's fused SDPA with ``scale = scaling / T``
  (temperature costs nothing there);
- explicit: fp32 scores, finite mask values, optional top-k selection, any normaliser, and the taps that
  monitors use to read the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from study.attention import tap
from study.attention.normalizers import MASK_VALUE, NORMALIZERS, Normalizer, Softmax, top_k_allowed
from study.attention.spec import AttentionSpec


def causal_allowed(q_len: int, kv_len: int, device: torch.device) -> Tensor:
    """Bool (q_len, kv_len) mask: query i (the last q_len positions of kv_len) sees keys 0..i+offset."""
    offset = kv_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    return torch.arange(kv_len, device=device)[None, :] <= rows


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    spec: AttentionSpec,
    mask: Tensor | None = None,
    causal: bool = True,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    normalizer: Normalizer | None = None,
    layer: int | None = None,
) -> Tensor:
    """Attention output for queries (B, H, Lq, D) over keys/values (B, Hkv, Lk, D); returns (B, H, Lq, Dv).

    Args:
        spec: normaliser, temperature and top-k selection.
        mask: optional bool mask broadcastable to (B, H, Lq, Lk), True = may attend (e.g. padding); combined
            with the causal mask when ``causal``. A float mask is treated as an additive bias (finite values below
            half the dtype's minimum count as masked).
        causal: apply a causal mask (query i sees keys up to i, aligned to the end when Lk > Lq).
        scaling: the model's score scale; default 1/sqrt(D). The temperature divides it.
        dropout: attention dropout probability (pass 0 in eval).
        normalizer: the module holding the normaliser's parameters; built from the spec when omitted.
            Transformers models get one per layer from `apply_attention_spec`.
        layer: layer index reported to taps.

    The normaliser gets the allowed keys after top-k selection and, as ``visible``, the causal/padding mask
    before it (SSMax's n counts the visible keys).

    Key/value heads fewer than query heads (grouped-query attention) are shared across query groups.
    """
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scale = scaling / spec.temperature
    q_len, kv_len = query.shape[-2], key.shape[-2]

    bias = None
    if mask is not None and mask.dtype != torch.bool:
        bias = mask
        mask = mask > torch.finfo(mask.dtype).min / 2

    if spec.is_stock_softmax and not tap.active_taps():
        attn_mask = bias if bias is not None else mask
        is_causal = causal and attn_mask is None and q_len > 1
        if causal and attn_mask is not None:
            causal_mask = causal_allowed(q_len, kv_len, query.device)
            attn_mask = mask & causal_mask if bias is None else bias.masked_fill(~causal_mask, torch.finfo(bias.dtype).min)
        elif is_causal and kv_len != q_len:
            attn_mask, is_causal = causal_allowed(q_len, kv_len, query.device), False
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=key.shape[1] != query.shape[1],
        )

    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)

    allowed = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=query.device)
    if causal:
        allowed = allowed & causal_allowed(q_len, kv_len, query.device)
    if mask is not None:
        allowed = allowed & mask
    if normalizer is None:
        normalizer = NORMALIZERS[spec.normalizer].from_spec(spec, num_heads=query.shape[1]).to(query.device)

    # Scores and normalisation in fp32 even under bf16 autocast: at T = 0.01 bf16 scores flip top-k choices and
    # the output error reaches 0.5. Scale before masking so that dividing by a small T never overflows the mask.
    with torch.autocast(device_type=query.device.type, enabled=False):
        scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
        if bias is not None:
            scores = scores + bias.float().masked_fill(~mask, 0.0)
        if spec.top_k is not None and spec.top_k < kv_len and type(normalizer) is Softmax:
            weights = _top_k_softmax(scores, allowed, spec.top_k)
        else:
            selected = allowed if spec.top_k is None else top_k_allowed(scores, allowed, spec.top_k)
            weights = normalizer(scores, selected, visible=allowed)

    if tap.active_taps():
        tap.notify(layer, weights, allowed, spec)
    if dropout > 0.0:
        weights = F.dropout(weights, p=dropout, training=True)
    return torch.matmul(weights.to(value.dtype), value)


def _top_k_softmax(scores: Tensor, allowed: Tensor, k: int) -> Tensor:
    """Softmax over exactly the k largest allowed scores of each row, as dense weights (same as `Softmax` over
    `top_k_allowed`, with the same picks).

    The softmax runs on the k picked values only and is scattered back: no (B, H, Lq, Lk) selection mask, no
    second masked fill, and a backward pass that only gathers. Picks on keys the query cannot see (rows that see
    fewer than k keys) carry the finite mask value, whose exp underflows to exactly 0 next to any visible key;
    rows with no visible key at all are zeroed.
    """
    values, index = scores.masked_fill(~allowed, MASK_VALUE).topk(k, dim=-1, sorted=False)
    picked = values.softmax(dim=-1) * allowed.any(dim=-1, keepdim=True)
    return torch.zeros_like(scores).scatter(-1, index, picked)
