"""Hugging Face transformers integration: run any `AttentionInterface` model under an `AttentionSpec`.

`apply_attention_spec` gives each self-attention module its spec, normaliser and layer number, and switches the
model to the attention implementation registered here under `IMPLEMENTATION`. Registration happens when this
module is imported (spawned DDP workers import it through the LightningModule, so the name exists in every
process). `import study.attention` alone does not import transformers; its transformers names load this module.

Which modules: every module whose forward calls transformers' attention interface (``ALL_ATTENTION_FUNCTIONS``):
decoders, encoders (BERT: bidirectional, padding masks) and vision transformers (ViT) alike. They are numbered
0, 1, ... in module order (``model.modules()``), which is the layer order of every stock model and does not
need a ``layer_idx`` (ViT has none; an encoder-decoder has two layers 0).

Cross-attention (the decoder reading the encoder in T5, BART, Whisper; ``crossattention`` in GPT-2 with
``add_cross_attention``) is left stock: it is not the self-attention row normalisation the spec studies, its
keys are another sequence, and a temperature there would change what the decoder can read of its input. Those
modules run stock softmax at T = 1 (with the model's own logit transforms), are not numbered and are hidden from
the taps, so monitors never see them.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import nullcontext
from functools import cache

from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from study.attention import tap
from study.attention.core import attend
from study.attention.gate import OutputGate
from study.attention.intercept import intercept, is_cross_attention
from study.attention.qknorm import QKNorm
from study.attention.registry import normalizer_class
from study.attention.spec import STOCK, AttentionSpec

IMPLEMENTATION = "study"
"""The implementation name for models transformers runs with SDPA: SDPA-style masks (bool, or None for plain
causality, which keeps the fused kernel's fastest case)."""
EAGER_MASK_IMPLEMENTATION = "study_eager_mask"
"""The same attention with eager-style masks (always a float tensor), for models that transformers does not run
with SDPA: some extend or read the mask tensor themselves (DeepSeek-V4 appends its compressed keys' bias)."""

# Arguments transformers' attention modules and model forwards pass that do not change the result of this
# implementation (found by reading the attention calls of transformers 5.24's modeling files). The packing
# arguments (cu_seq_lens_*, max_length_*, seq_idx) and ``deterministic`` (a kernel choice) are read by
# flash-attention kernels only; with SDPA-style attention the mask built by the registered mask function carries
# the packing, exactly as for stock "sdpa" and "eager". The others are bookkeeping (positions, cache, what to
# return). Anything else is refused by name unless it is passed as None.
NO_EFFECT_ARGUMENTS = frozenset({
    "position_ids", "cache_position", "past_key_values", "past_key_value", "use_cache", "output_attentions",
    "output_hidden_states", "output_router_logits", "return_dict", "num_items_in_batch", "cu_seq_lens_q",
    "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "deterministic",
})


def _attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    sliding_window: int | None = None,
    position_bias: Tensor | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """The function transformers calls; q, k, v are (B, H, L, D), the output goes back as (B, L, H, D)."""
    cross = getattr(module, "study_cross_attention", False)
    # An argument passed as None is absent (BERT's self-attention forwards encoder_hidden_states=None).
    unknown = sorted(name for name, value in kwargs.items() if value is not None and name not in NO_EFFECT_ARGUMENTS)
    if unknown:
        raise ValueError(
            f"{type(module).__name__} passed {unknown} to its attention function; study.attention does not "
            "implement them, and dropping them would change the result"
        )
    # As in transformers' own eager and SDPA attention, a mask, when given, is the whole truth: it already holds
    # causality and any sliding window, and may cover keys beyond the sequence (DeepSeek-V4 appends compressed
    # entries), so causality and the window argument are applied only when there is no mask.
    if attention_mask is not None:
        is_causal, sliding_window = False, None
    gate = None if cross else getattr(module, "study_output_gate", None)
    gate_input = None
    if gate is not None:  # the layer's input, held by `_hold_gate_input` since this module's forward began
        gate_input, gate.input = gate.input, None
        if gate_input is None:
            raise ValueError(f"{type(module).__name__}'s output gate has no input: its attention function was called "
                             "outside the module's forward")
    # Cross-attention runs stock softmax at T = 1, hidden from the taps (see the module docstring).
    with tap.suspended() if cross else nullcontext():
        output = attend(
            query,
            key,
            value,
            STOCK if cross else getattr(module, "study_spec", STOCK),
            mask=attention_mask,
            causal=is_causal if is_causal is not None else getattr(module, "is_causal", True),
            scaling=scaling,
            dropout=dropout,
            normalizer=getattr(module, "study_normalizer", None),
            layer=getattr(module, "study_layer", None),
            softcap=softcap,
            logit_bias=position_bias,
            sinks=s_aux,
            sliding_window=sliding_window,
            qk_norm=None if cross else getattr(module, "study_qk_norm", None),
            output_gate=gate,
            gate_input=gate_input,
        )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(IMPLEMENTATION, _attention_forward)
AttentionInterface.register(EAGER_MASK_IMPLEMENTATION, _attention_forward)
# The mask function matters: without one the model silently stops being causal. `sdpa_mask` gives a bool mask
# (True = attend) or None when plain causality suffices, which `attend` then applies itself.
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
AttentionMaskInterface.register(EAGER_MASK_IMPLEMENTATION, eager_mask)


def implementation_for(model: nn.Module) -> str:
    """`IMPLEMENTATION` for models that support SDPA, else `EAGER_MASK_IMPLEMENTATION` (their masks as eager's)."""
    return IMPLEMENTATION if getattr(model, "_supports_sdpa", False) else EAGER_MASK_IMPLEMENTATION


@cache
def _calls_attention_interface(cls: type) -> bool:
    """Whether ``cls.forward`` dispatches through transformers' attention interface (read from its source)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source


def _attention_calls(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    """(module, is cross-attention) for every module that calls the attention interface, in module order."""
    return [
        (m, is_cross_attention(path, m))
        for path, m in model.named_modules()
        if _calls_attention_interface(type(m))
    ]


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of a transformers model, in module order; layer i is the i-th of them."""
    return [m for m, cross in _attention_calls(model) if not cross]


def _num_heads(module: nn.Module, config) -> int:
    for source, attr in (
        (module, "num_heads"),
        (module, "num_attention_heads"),
        (config, "num_attention_heads"),
        (config, "n_head"),
    ):
        value = getattr(source, attr, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"cannot tell the number of heads of {type(module).__name__}")


def _num_kv_heads(module: nn.Module, config, num_heads: int) -> int:
    """Key/value heads of an attention module (fewer than the query heads under grouped-query attention)."""
    for source, attr in ((module, "num_key_value_heads"), (config, "num_key_value_heads")):
        value = getattr(source, attr, None)
        if isinstance(value, int):
            return value
    groups = getattr(module, "num_key_value_groups", None)
    return num_heads // groups if isinstance(groups, int) and groups > 0 else num_heads


# Submodule names under which transformers' attention modules keep their own query/key normalisation (Qwen3,
# OLMo 2, Gemma 3: ``q_norm``; Persimmon, Phi, StableLM: ``q_layernorm``; Chameleon-style ``query_layernorm``).
OWN_QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_layernorm", "key_layernorm")


def _own_qk_norm(module: nn.Module) -> list[str]:
    """The names of the query/key normalisation submodules a model's attention module already has."""
    return [name for name in OWN_QK_NORMS
            if isinstance(getattr(module, name, None), nn.Module) and not isinstance(getattr(module, name), nn.Identity)]


def _hold_gate_input(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a gated attention module: hold its input X (``hidden_states``, after the block's
    pre-norm) on its gate until the attention function reads it. A plain function, so that a deep copy of the model
    keeps it and it finds the copy's gate."""
    gate = getattr(module, "study_output_gate", None)
    if gate is None:
        return
    hidden_states = kwargs.get("hidden_states", args[0] if args else None)
    if not isinstance(hidden_states, Tensor):
        raise ValueError(f"output_gate=True, but {type(module).__name__}'s forward got no hidden_states tensor to "
                         "compute the gate from")
    gate.input = hidden_states


def _remove_gate_hook(module: nn.Module) -> None:
    """Drop `_hold_gate_input` from a module's forward pre-hooks (torch keeps no name for a hook but its id)."""
    for hook_id, hook in list(module._forward_pre_hooks.items()):
        if hook is _hold_gate_input:
            del module._forward_pre_hooks[hook_id]
            module._forward_pre_hooks_with_kwargs.pop(hook_id, None)


def _output_gate(model: nn.Module, module: nn.Module, config, num_heads: int) -> OutputGate:
    """A gate for one attention module, as Qiu et al. build theirs: extra columns of the query projection, so the
    model's own init of a linear layer (`_init_weights`) and a bias when the attention projections have one."""
    hidden_size = getattr(config, "hidden_size", None)
    if not isinstance(hidden_size, int):
        raise ValueError(f"output_gate=True: cannot tell the hidden size of {type(model).__name__} (config.hidden_size)")
    head_dim = getattr(module, "head_dim", None)
    head_dim = head_dim if isinstance(head_dim, int) else hidden_size // num_heads
    own = [name for name, _ in module.named_parameters() if not name.startswith("study_")]
    gate = OutputGate(hidden_size, num_heads, head_dim, bias=any(name.endswith("bias") for name in own))
    init_weights = getattr(model, "_init_weights", None)
    if init_weights is None:
        raise ValueError(f"output_gate=True: {type(model).__name__} has no _init_weights to initialise the gate as "
                         "its own linear layers")
    init_weights(gate.linear)
    return gate


def apply_attention_spec(model: nn.Module, spec: AttentionSpec) -> nn.Module:
    """Make every self-attention layer of ``model`` that ``spec.layers`` selects use ``spec``; returns the model.

    Works for any transformers model whose attention goes through `AttentionInterface`: decoders (GPT-2, Llama,
    Gemma 2 with its soft-capping, gpt-oss with its sinks), encoders (BERT) and vision transformers (ViT).
    Any other model (nanoGPT, LitGPT, `nn.TransformerEncoder`) runs its `F.scaled_dot_product_attention` calls
    under the spec through `study.attention.intercept` (undone by `remove_attention_spec`).
    Layers are numbered in module order (see the module docstring); cross-attention stays stock. Each selected
    layer gets ``study_spec`` and a ``study_normalizer`` submodule (so learnable normaliser parameters train and
    are saved with the model); the others get stock softmax. With ``spec.output_gate`` each selected layer also gets
    a fresh ``study_output_gate`` (`OutputGate`, drawn by the model's own init) and a forward pre-hook that hands it
    the layer's input: the model then computes another function, so give it to models you train from scratch.
    Calling it again replaces the spec (and removes a gate it does not ask for). Raises
    ValueError when the model has no such attention layers or ``spec.layers`` names a missing one.
    """
    calls = _attention_calls(model)
    modules = [m for m, cross in calls if not cross]
    if not modules and isinstance(model, PreTrainedModel):
        raise ValueError(
            f"{type(model).__name__} has no attention module that calls transformers' attention interface; "
            "use study.attention.attend in your own attention code"
        )
    if not modules:  # not a transformers model: its SDPA calls are intercepted (study.attention.intercept)
        return intercept(model, spec)
    missing = set(spec.layers or ()) - set(range(len(modules)))
    if missing:
        raise ValueError(f"layers {sorted(missing)} not in the model, which has layers 0..{len(modules) - 1}")
    config = getattr(model, "config", None)
    if spec.qk_norm:
        # Refused rather than composed: normalising twice would leave the model's own per-dimension weights
        # before RoPE and a second norm after it, which is neither the model nor the option (docs/attention.md).
        for layer, module in enumerate(modules):
            own = _own_qk_norm(module)
            if own and spec.applies_to(layer):
                raise ValueError(
                    f"qk_norm=True, but {type(model).__name__}'s attention ({type(module).__name__}) already "
                    f"normalises its queries and keys ({', '.join(own)}); use the model's own QK-norm"
                )
    for m, cross in calls:
        m.study_cross_attention = cross
    for layer, module in enumerate(modules):
        layer_spec = spec if spec.applies_to(layer) else STOCK
        module.study_spec = layer_spec
        module.study_layer = layer
        num_heads = _num_heads(module, config)
        normalizer = normalizer_class(layer_spec.normalizer).from_spec(layer_spec, num_heads)
        param = next(module.parameters(), None)
        if param is not None:
            normalizer = normalizer.to(device=param.device)
        module.study_normalizer = normalizer
        if hasattr(module, "study_qk_norm"):  # a spec applied before: its gains go with it
            del module.study_qk_norm
        if layer_spec.qk_norm:
            # A submodule of the attention module: trained under `trainable: attention`, saved in its state dict.
            qk_norm = QKNorm(num_heads, _num_kv_heads(module, config, num_heads))
            module.study_qk_norm = qk_norm if param is None else qk_norm.to(device=param.device)
        if hasattr(module, "study_output_gate"):  # a spec applied before: its gate goes with it
            del module.study_output_gate
        _remove_gate_hook(module)
        if layer_spec.output_gate:
            # A submodule too: trained under `trainable: attention`, saved in its state dict. The attention
            # function sees q, k and v only, so the layer's input reaches the gate through a pre-hook.
            gate = _output_gate(model, module, config, num_heads)
            module.study_output_gate = gate if param is None else gate.to(device=param.device, dtype=param.dtype)
            module.register_forward_pre_hook(_hold_gate_input, with_kwargs=True)
    if config is not None and config._attn_implementation != implementation_for(model):
        model.set_attn_implementation(implementation_for(model))
    return model


def current_spec(model: nn.Module) -> dict[int, AttentionSpec]:
    """The spec each self-attention layer of ``model`` runs, by layer number."""
    return {i: getattr(m, "study_spec", STOCK) for i, m in enumerate(attention_modules(model))}


def stock_copy(model: nn.Module, implementation: str = "eager") -> nn.Module:
    """A deep copy of a transformers model running stock attention (for parity checks)."""
    clone = copy.deepcopy(model)
    for module, _ in _attention_calls(clone):
        for attr in ("study_spec", "study_normalizer", "study_layer", "study_cross_attention", "study_qk_norm",
                     "study_output_gate"):
            if hasattr(module, attr):
                delattr(module, attr)
        _remove_gate_hook(module)
    clone.set_attn_implementation(implementation)
    return clone


__all__ = [
    "EAGER_MASK_IMPLEMENTATION",
    "IMPLEMENTATION",
    "NO_EFFECT_ARGUMENTS",
    "OWN_QK_NORMS",
    "apply_attention_spec",
    "attention_modules",
    "current_spec",
    "implementation_for",
    "stock_copy",
]
