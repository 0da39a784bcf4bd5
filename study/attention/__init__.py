"""Attention normalisation in pure torch, and (loaded on first use) its registration with Hugging Face transformers.

Public API:
    AttentionSpec           normaliser, temperature T, top-k selection, layers, QK-norm (`QKNorm`: its gains),
                            the output gate (`OutputGate`: its weights)
    apply_attention_spec    switch any transformers model (GPT-2, Llama, BERT, ViT, ...) to a spec, or any other
                            model whose attention calls F.scaled_dot_product_attention (nanoGPT, LitGPT,
                            nn.TransformerEncoder), unedited, through the interception (`intercept`)
    remove_attention_spec   undo the interception: the model runs its own SDPA calls again
    attend                  the same computation for models that are not from transformers
    tapping, AttentionTap   let monitors observe attention rows on the steps they log
    register_normalizer     add your own row normaliser (a `Normalizer` subclass) by name
    blockwise_settings      when the explicit path runs in blocks of query rows (long contexts), and their size

Layers, bottom up: `registry` (the `Normalizer` base and the name table) <- `select` (top-k, one tie rule) <-
`normalizers` (the built-ins) <- `spec` <- `qknorm`, `gate` <- `tap` <- `blockwise` <- `core` (`attend`) <-
`intercept` (any model's SDPA calls) <- `hf` (transformers).
Importing this package does not import transformers: the names that need it (`apply_attention_spec`,
`attention_modules`, `current_spec`, `IMPLEMENTATION`) load `study.attention.hf` when first read.
"""

from study.attention.blockwise import BlockwiseSettings, blockwise_settings
from study.attention.core import attend, causal_allowed
from study.attention.gate import OutputGate
from study.attention.intercept import remove_attention_spec
from study.attention.normalizers import NORMALIZERS, Normalizer, top_k_allowed
from study.attention.qknorm import QKNorm
from study.attention.registry import normalizer_class, register_normalizer
from study.attention.select import top_k_indices
from study.attention.spec import STOCK, AttentionSpec
from study.attention.tap import AttentionInputs, AttentionLogits, AttentionTap, active_taps, tapping

_HF_NAMES = ("IMPLEMENTATION", "apply_attention_spec", "attention_modules", "current_spec")


def __getattr__(name: str):
    # PEP 562: the transformers registration loads only when one of its names is used.
    if name in _HF_NAMES:
        from study.attention import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'study.attention' has no attribute {name!r}")


__all__ = [
    "IMPLEMENTATION",
    "NORMALIZERS",
    "STOCK",
    "AttentionInputs",
    "AttentionLogits",
    "AttentionSpec",
    "AttentionTap",
    "BlockwiseSettings",
    "Normalizer",
    "OutputGate",
    "QKNorm",
    "active_taps",
    "apply_attention_spec",
    "attend",
    "attention_modules",
    "blockwise_settings",
    "causal_allowed",
    "current_spec",
    "normalizer_class",
    "register_normalizer",
    "remove_attention_spec",
    "tapping",
    "top_k_allowed",
    "top_k_indices",
]
