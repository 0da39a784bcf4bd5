"""Attention normalisation in pure torch, and its registration with Hugging Face transformers.

Public API:
    AttentionSpec           normaliser, temperature T, top-k selection, layers
    apply_attention_spec    switch any transformers model (GPT-2, Llama, ...) to a spec
    attend                  the same computation for models that are not from transformers
    tapping, AttentionTap   let monitors observe attention rows on the steps they log
"""

from study.attention.core import attend, causal_allowed
from study.attention.hf import IMPLEMENTATION, apply_attention_spec, attention_modules, current_spec
from study.attention.normalizers import NORMALIZERS, Normalizer, top_k_allowed
from study.attention.spec import STOCK, AttentionSpec
from study.attention.tap import AttentionTap, active_taps, tapping

__all__ = [
    "IMPLEMENTATION",
    "NORMALIZERS",
    "STOCK",
    "AttentionSpec",
    "AttentionTap",
    "Normalizer",
    "active_taps",
    "apply_attention_spec",
    "attend",
    "attention_modules",
    "causal_allowed",
    "current_spec",
    "tapping",
    "top_k_allowed",
]
