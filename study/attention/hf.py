"""Hugging Face transformers integration: run any `AttentionInterface` model under an `AttentionSpec`.

`apply_attention_spec` gives each attention module its spec and normaliser, and switches the model to the
attention implementation registered here under `IMPLEMENTATION`. Registration happens when this module is
imported (spawned DDP workers import it through the LightningModule, so the name exists in every process).
"""

from __future__ import annotations

import copy

from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from study.attention.core import attend
from study.attention.normalizers import NORMALIZERS
from study.attention.spec import STOCK, AttentionSpec

IMPLEMENTATION = "study"


def _attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    # q, k, v: (B, H, L, D). Transformers wants (B, L, H, D) back, and weights or None.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    output = attend(
        query,
        key,
        value,
        getattr(module, "study_spec", STOCK),
        mask=attention_mask,
        causal=causal,
        scaling=scaling,
        dropout=dropout,
        normalizer=getattr(module, "study_normalizer", None),
        layer=getattr(module, "layer_idx", None),
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(IMPLEMENTATION, _attention_forward)
# The mask function matters: without one the model silently stops being causal. `sdpa_mask` gives a bool mask
# (True = attend) or None when plain causality suffices, which `attend` then applies itself.
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of a transformers model, in layer order (those carrying a `layer_idx`)."""
    found = [
        m
        for m in model.modules()
        if type(m).__name__.endswith("Attention")
        and isinstance(getattr(m, "layer_idx", None), int)
        and not getattr(m, "is_cross_attention", False)
    ]
    return sorted(found, key=lambda m: m.layer_idx)


def _num_heads(module: nn.Module, config) -> int:
    for source, attr in ((module, "num_heads"), (config, "num_attention_heads"), (config, "n_head")):
        value = getattr(source, attr, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"cannot tell the number of heads of {type(module).__name__}")


def apply_attention_spec(model: nn.Module, spec: AttentionSpec) -> nn.Module:
    """Make every self-attention layer of ``model`` that ``spec.layers`` selects use ``spec``; returns the model.

    Works for any transformers model whose attention goes through `AttentionInterface` (GPT-2, Llama, Qwen, ...).
    Each selected layer gets ``study_spec`` and a ``study_normalizer`` submodule (so learnable normaliser
    parameters train and are saved with the model); the others get stock softmax. Calling it again replaces the
    spec. Raises ValueError when the model has no such attention layers or ``spec.layers`` names a missing one.
    """
    modules = attention_modules(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention modules with a layer_idx; use study.attention.attend")
    known = {m.layer_idx for m in modules}
    missing = set(spec.layers or ()) - known
    if missing:
        raise ValueError(f"layers {sorted(missing)} not in the model, which has layers {sorted(known)}")
    config = getattr(model, "config", None)
    for module in modules:
        layer_spec = spec if spec.applies_to(module.layer_idx) else STOCK
        module.study_spec = layer_spec
        normalizer = NORMALIZERS[layer_spec.normalizer].from_spec(layer_spec, _num_heads(module, config))
        param = next(module.parameters(), None)
        if param is not None:
            normalizer = normalizer.to(device=param.device)
        module.study_normalizer = normalizer
    if config is not None and config._attn_implementation != IMPLEMENTATION:
        model.set_attn_implementation(IMPLEMENTATION)
    return model


def current_spec(model: nn.Module) -> dict[int, AttentionSpec]:
    """The spec each attention layer of ``model`` runs, by layer index."""
    return {m.layer_idx: getattr(m, "study_spec", STOCK) for m in attention_modules(model)}


def stock_copy(model: nn.Module, implementation: str = "eager") -> nn.Module:
    """A deep copy of a transformers model running stock attention (for parity checks)."""
    clone = copy.deepcopy(model)
    for module in attention_modules(clone):
        for attr in ("study_spec", "study_normalizer"):
            if hasattr(module, attr):
                delattr(module, attr)
    clone.set_attn_implementation(implementation)
    return clone


__all__ = ["IMPLEMENTATION", "apply_attention_spec", "attention_modules", "current_spec", "stock_copy"]
