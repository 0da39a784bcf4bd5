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


def gradient_norms(model: nn.Module) -> dict[str, float]:
    """`grouped_grad_norms` by kind and by block and kind, in one pass over the gradients."""
    from study.metrics import grouped_grad_norms

    return {k: float(v) for k, v in grouped_grad_norms(model.named_parameters(), by=("kind", "block_kind")).items()}


def model_norms(norms: dict[str, float]) -> dict[str, float]:
    """Whole-model norms from `gradient_norms`: W_q, W_k, both, the rest, the total, the embeddings."""
    q, k, total = norms.get("attn_q", 0.0), norms.get("attn_k", 0.0), norms["total"]
    qk = math.hypot(q, k)
    return {"attn_q": q, "attn_k": k, "attn_qk": qk, "rest": math.sqrt(max(total**2 - qk**2, 0.0)), "total": total,
            "embedding": norms.get("embedding", 0.0)}  # fmt: skip


def layer_norms(norms: dict[str, float], layers: int) -> dict[str, list[float]]:
    """Per layer (0 .. layers - 1) from `gradient_norms`: W_q and W_k together, W_v, W_o and the MLP."""

    def get(layer: int, kind: str) -> float:
        return norms.get(f"block_{layer}/{kind}", 0.0)

    return {
        "attn_qk": [math.hypot(get(i, "attn_q"), get(i, "attn_k")) for i in range(layers)],
        "attn_v": [get(i, "attn_v") for i in range(layers)],
        "attn_out": [get(i, "attn_out") for i in range(layers)],
        "mlp": [get(i, "mlp") for i in range(layers)],
    }


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the modules holding each self-attention layer, in layer order."""
    from study.attention.hf import attention_modules

    parents = {id(child): module for module in model.modules() for child in module.children()}
    return [parents[id(attn)] for attn in attention_modules(model)]


@contextmanager
def residual_gradients(model: nn.Module) -> Iterator[list[float]]:
    """While open, each forward records the gradient norm of the hidden state entering each block (the residual
    stream) as the backward pass reaches it; the yielded list holds one value per block after backward."""
    found: list[float] = []
    handles = []
    layers = blocks(model)
    found.extend([math.nan] * len(layers))

    def hook(index: int):
        def pre(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states")
            if isinstance(hidden, Tensor) and hidden.requires_grad:
                hidden.register_hook(lambda g: found.__setitem__(
                    index, float(torch.linalg.vector_norm(g, dtype=torch.float64))))  # fmt: skip

        return pre

    for index, block in enumerate(layers):
        handles.append(block.register_forward_pre_hook(hook(index), with_kwargs=True))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


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
