"""Gradient norms of a frozen model, per layer and parameter type, and of the residual stream.

The kinds come from `study.metrics.parameter_kind` (GPT-2's fused c_attn split into its q/k/v blocks): W_q and W_k
(the attention logits, whose gradient the paper's claim is about) beside the controls W_v, W_o, the MLP, the
embeddings and the gradient of the residual stream entering each layer (if those grow alike with 1/T, nothing is
specific to the attention logits).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

LAYER_KINDS = ("attn_qk", "attn_v", "attn_out", "mlp", "residual")  # per layer, in the report's order


class ProbeError(ValueError):
    """Input the probe cannot use; raised before the model is loaded (or, for the model's shape, right after)."""


def qk_masks(model: nn.Module, layers: tuple[int, ...] | None = None) -> list[tuple[nn.Parameter, Tensor]]:
    """(parameter, 0/1 mask of its W_q / W_k entries) for every parameter holding attention-logit weights (of
    ``layers`` only, when given)."""
    from study.metrics import block_index, fused_qkv_split, parameter_kind

    out = []
    for name, p in model.named_parameters():
        if layers is not None and block_index(name) not in layers:
            continue
        kind = parameter_kind(name)
        if kind in ("attn_q", "attn_k"):
            out.append((p, torch.ones_like(p)))
        elif kind == "attn_qkv":
            mask = torch.zeros_like(p)
            q, k, _ = fused_qkv_split(name, mask)  # views into mask
            q.fill_(1.0)
            k.fill_(1.0)
            out.append((p, mask))
    if not out:
        where = "" if layers is None else f" in layer(s) {list(layers)}"
        raise ProbeError(f"{type(model).__name__}: no W_q / W_k parameters found by name{where}")
    return out


def masked_norm(masks: list[tuple[nn.Parameter, Tensor]]) -> float:
    """The L2 norm of the masked entries of the parameters' gradients."""
    sq = sum(float(torch.linalg.vector_norm(p.grad * m, dtype=torch.float64)) ** 2 for p, m in masks if p.grad is not None)
    return math.sqrt(sq)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the modules holding each self-attention layer, in layer order."""
    from study.attention.hf import attention_modules

    parents = {id(child): module for module in model.modules() for child in module.children()}
    return [parents[id(attn)] for attn in attention_modules(model)]


@contextmanager
def only_grad_for(masks: list[tuple[nn.Parameter, Tensor]], model: nn.Module) -> Iterator[None]:
    """While open, only the masked parameters require a gradient (backward stops at the lowest of them)."""
    before = {p: p.requires_grad for p in model.parameters()}
    keep = {id(p) for p, _ in masks}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    try:
        yield
    finally:
        for p, flag in before.items():
            p.requires_grad_(flag)
