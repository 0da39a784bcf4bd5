"""Any model, unedited: every `F.scaled_dot_product_attention` call of its forward pass runs `attend` under a spec.

`intercept(model, spec)` (what `apply_attention_spec` does for a model that is not a transformers model) puts
forward pre- and post-hooks on every named submodule. They keep a stack of the modules being run; while the
outermost one runs, a `torch.overrides.TorchFunctionMode` catches each SDPA call, names it by the innermost
module on the stack (``transformer.h.3.attn``) and hands it to `study.attention.attend` with the call's own mask,
causality, scale, dropout and grouped-query flag, the layer's spec and its layer number. The taps
(`study.attention.tap`) see it as they see a transformers layer, so every monitor watches the model unchanged.

Layers are numbered 0, 1, ... in the order of the first forward pass's calls (module order for every model that
runs its blocks in the order it registers them: nanoGPT, LitGPT, `nn.TransformerEncoder`); a module that calls SDPA
twice in a pass is two layers. Every later pass must make the same calls: a call from a module (or a repeat) the
first pass did not make, or a pass with fewer calls, is an error naming the call, since layer numbers would no
longer mean the same layer. A first pass with no SDPA call is an error too: its attention bypasses SDPA.

What it cannot see is refused or turned off, never skipped silently:
- PyTorch's fused fast path for `nn.TransformerEncoderLayer` and `nn.MultiheadAttention` (eval without grad)
  computes attention in one kernel without SDPA: `torch.backends.mha.set_fastpath_enabled(False)` while a pass
  runs, restored after it;
- `nn.MultiheadAttention` called with ``need_weights=True`` computes its weights without SDPA: an error naming it;
- a mask that is neither bool nor floating, or does not broadcast to (B, H, Lq, Lk); inputs that are not 4-d
  (B, H, L, D); a mask given with ``is_causal=True`` (SDPA itself refuses it).
- Specs that create parameters (a learnable normaliser, QK-norm's gains) are refused: the layers are found
  during the first forward pass, after an optimizer has been built over the model's parameters. The output gate
  is refused by name as well: it reads the layer's input, which an SDPA call does not carry.
- ``torch.compile`` is refused: the compiled graph calls the attention kernel itself, so the mode sees no call,
  and the pass ends with an error that says so (a hook traced into a compiled outer module refuses at once).
  Compile the model without a spec, or run it eagerly under one.

Cross-attention (a module named as `is_cross_attention` says, or `nn.TransformerDecoderLayer`'s
``multihead_attn``) runs stock softmax at T = 1 and is hidden from the taps, as on the transformers path.
SDPA's ``is_causal`` with Lq != Lk is its top-left causal mask (query i sees keys 0..i), passed on as that mask.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from study.attention import tap
from study.attention.core import attend
from study.attention.registry import normalizer_class
from study.attention.spec import STOCK, AttentionSpec

SDPA = F.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def is_cross_attention(path: str, module: nn.Module) -> bool:
    """Whether the attention module at ``path`` reads another sequence (its keys are not its queries' sequence)."""
    parts = path.lower().split(".")
    return (
        bool(getattr(module, "is_cross_attention", False))
        or "cross" in type(module).__name__.lower()
        or any("cross" in p or "encdec" in p or p == "encoder_attn" for p in parts)
        or (isinstance(module, nn.MultiheadAttention) and parts[-1] == "multihead_attn")  # nn.TransformerDecoderLayer
    )


class _Mode(TorchFunctionMode):
    """Routes SDPA calls to the interception; every other function runs as it is."""

    def __init__(self, interception: Interception) -> None:
        super().__init__()
        self.interception = interception

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            return self.interception.call(args, kwargs)
        if func is F.multi_head_attention_forward:
            return self.interception.multi_head_attention(func, args, kwargs)
        return func(*args, **kwargs)


class _PassState(threading.local):
    def __init__(self) -> None:
        self.stack: list[str] = []
        self.calls: dict[str, int] = {}  # calls each module made in this pass
        self.made = 0  # SDPA calls in this pass
        self.counted = False  # a forward pass, not activation checkpointing's recomputation (inside backward)
        self.fastpath: bool | None = None


class Interception:
    """The hooks and the mode of one model under one spec (see the module docstring); `remove` undoes them."""

    def __init__(self, model: nn.Module, spec: AttentionSpec) -> None:
        self.model_name = type(model).__name__
        self.spec = spec
        self.layers: list[tuple[str, int]] = []  # (module path, its n-th call in a pass), by layer number
        self.index: dict[tuple[str, int], int] = {}
        self.frozen = False  # True once a whole pass has fixed the layers
        self.cross = {path: is_cross_attention(path, m) for path, m in model.named_modules()}
        self.normalizers: dict[int, nn.Module] = {}
        self._mode = _Mode(self)
        self._state = _PassState()
        self._handles = []
        for path, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._entering(path)))
            self._handles.append(module.register_forward_hook(self._leaving(path), always_call=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ----- the module stack --------------------------------------------------------------------------------

    def _entering(self, path: str):
        def hook(module, args):
            state = self._state
            if not state.stack:
                if torch.compiler.is_compiling():  # a hook traced into a graph (a compiled outer module)
                    raise RuntimeError(
                        f"{self.model_name} runs under torch.compile with an attention spec applied "
                        "(study.attention.intercept); the interception runs eagerly only: compile the model "
                        "without a spec, or run it uncompiled")
                state.calls, state.made = {}, 0
                state.counted = not tap.recomputing()
                state.fastpath = torch.backends.mha.get_fastpath_enabled()
                torch.backends.mha.set_fastpath_enabled(False)  # the fused MHA kernel would bypass SDPA
                self._mode.__enter__()
            state.stack.append(path)

        return hook

    def _leaving(self, path: str):
        def hook(module, args, output):
            state = self._state
            state.stack.pop()
            if state.stack:
                return None
            self._mode.__exit__(None, None, None)
            torch.backends.mha.set_fastpath_enabled(state.fastpath)
            if state.counted:
                self._end_pass(path)
            return None

        return hook

    def _end_pass(self, path: str) -> None:
        """Check a pass that began at the module ``path`` ("" the model itself; a submodule run on its own that
        calls no attention, a head or an embedding, is not a pass of the model)."""
        made = self._state.made
        if made == 0 and path:
            return
        if made == 0:
            # torch.compile's graph calls the attention kernel itself: the mode sees no call either
            raise RuntimeError(
                f"{self.model_name}'s forward pass made no torch.nn.functional.scaled_dot_product_attention call "
                "that the interception could see: its attention bypasses SDPA, or the model runs under "
                "torch.compile, whose compiled graph calls the kernel directly; the spec cannot apply there and no "
                "monitor would see it (the interception runs eagerly only)")
        if not self.frozen:
            missing = sorted(set(self.spec.layers or ()) - set(range(len(self.layers))))
            if missing:
                raise ValueError(f"layers {missing} not in {self.model_name}, whose forward pass made "
                                 f"{len(self.layers)} scaled_dot_product_attention calls (layers 0..{len(self.layers) - 1})")
            self.frozen = True
        elif made != len(self.layers):
            raise RuntimeError(
                f"{self.model_name} made {made} scaled_dot_product_attention calls in this forward pass, the "
                f"first pass made {len(self.layers)} (the last expected, layer {len(self.layers) - 1}: "
                f"{_describe(self.layers[-1])}); layer numbers need the same calls at every step")

    # ----- one call ----------------------------------------------------------------------------------------

    def _layer_of(self, path: str) -> int:
        state = self._state
        ordinal = state.calls.get(path, 0)
        state.calls[path] = ordinal + 1
        key = (path, ordinal)
        if key in self.index:
            layer = self.index[key]
        elif self.frozen:
            raise RuntimeError(
                f"{self.model_name} made a scaled_dot_product_attention call from {_describe(key)} that its "
                f"first forward pass did not make (it made {len(self.layers)}); layer numbers need the same calls "
                "at every step")
        elif not state.counted:
            raise RuntimeError(f"activation checkpointing recomputed {_describe(key)}, which no forward pass made")
        else:
            layer = self.index[key] = len(self.layers)
            self.layers.append(key)
        if state.counted:
            state.made += 1
        return layer

    def call(self, args, kwargs) -> Tensor:
        """One SDPA call, through `attend` under the layer's spec."""
        bound = dict(_SDPA_DEFAULTS)
        bound.update(zip(_SDPA_ARGS, args))
        bound.update(kwargs)
        path = self._state.stack[-1]
        query, key, value, mask = bound["query"], bound["key"], bound["value"], bound["attn_mask"]
        where = f"{self.model_name}'s scaled_dot_product_attention call from {path or 'the model'}"
        _check_call(where, query, key, value, mask, bound["is_causal"], bound["enable_gqa"])
        causal = bool(bound["is_causal"])
        q_len, kv_len = query.shape[-2], key.shape[-2]
        if causal and q_len != kv_len:  # SDPA's causal mask is top-left aligned; `attend` aligns to the end
            mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril()
            causal = False
        scaling = bound["scale"] if bound["scale"] is not None else 1.0 / math.sqrt(query.shape[-1])  # as SDPA's
        cross = self.cross.get(path, False)
        layer = None if cross else self._layer_of(path)
        spec = STOCK if cross or not self.spec.applies_to(layer) else self.spec
        with tap.suspended() if cross else nullcontext():
            return attend(query, key, value, spec, mask=mask, causal=causal, scaling=scaling,
                          dropout=bound["dropout_p"], normalizer=self._normalizer(layer, spec, query), layer=layer)

    def _normalizer(self, layer: int | None, spec: AttentionSpec, query: Tensor) -> nn.Module | None:
        """The layer's normaliser module, built once (None for stock softmax: `attend` needs none then)."""
        if layer is None or spec.normalizer == "softmax":
            return None
        if layer not in self.normalizers:
            self.normalizers[layer] = normalizer_class(spec.normalizer).from_spec(spec, query.shape[1]).to(query.device)
        return self.normalizers[layer]

    def multi_head_attention(self, func, args, kwargs):
        """`F.multi_head_attention_forward` (nn.MultiheadAttention): its SDPA call comes through this mode only if
        the call runs with ``need_weights=False``; the module-level name it calls is routed here for the call."""
        need_weights = kwargs.get("need_weights", args[13] if len(args) > 13 else True)
        path = self._state.stack[-1]
        if need_weights:
            raise RuntimeError(
                f"{path or self.model_name} (nn.MultiheadAttention) is called with need_weights=True, which computes "
                "attention without scaled_dot_product_attention; call it with need_weights=False under a spec")
        with _routed_sdpa(self):
            return func(*args, **kwargs)


@contextmanager
def _routed_sdpa(interception: Interception):
    """While the mode is popped (inside its handler), `F.multi_head_attention_forward` calls SDPA by its module-level
    name: that name points at the interception for the duration of the call, and back at SDPA inside the call
    (where `attend` runs the fused kernel itself)."""

    def routed(*args, **kwargs):
        F.scaled_dot_product_attention = SDPA
        try:
            return interception.call(args, kwargs)
        finally:
            F.scaled_dot_product_attention = routed

    F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = SDPA


def _describe(key: tuple[str, int]) -> str:
    path, ordinal = key
    return f"{path or 'the model'}" + (f" (its call {ordinal + 1} in one pass)" if ordinal else "")


def _check_call(where: str, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, is_causal,
                enable_gqa) -> None:
    """One-line errors naming the call, before any work."""
    if any(t.is_nested for t in (query, key, value)):
        raise ValueError(f"{where}: nested (jagged) tensors are not supported under a spec")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"{where}: query, key and value must be (B, H, L, D) under a spec, got shapes "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads and not (enable_gqa and heads % kv_heads == 0):
        raise ValueError(f"{where}: {heads} query heads and {kv_heads} key heads "
                         f"(enable_gqa={enable_gqa!r}; grouped-query attention needs it and equal groups)")
    if mask is None:
        return
    if is_causal:
        raise ValueError(f"{where}: a mask given with is_causal=True (SDPA refuses it too)")
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise ValueError(f"{where}: the mask must be bool (True = attend) or an additive float mask, got {mask.dtype}")
    full = (query.shape[0], heads, query.shape[-2], key.shape[-2])
    try:
        if torch.broadcast_shapes(mask.shape, full) != torch.Size(full):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"{where}: a mask of shape {tuple(mask.shape)} does not broadcast to the scores "
                         f"{full}") from None


def check_spec(spec: AttentionSpec) -> None:
    """Refuse, by name, the options the interception cannot give (see the module docstring)."""
    if spec.qk_norm:
        raise ValueError(
            "qk_norm=True: QK-norm's gains are parameters, and the interception finds a model's layers during its "
            "first forward pass, after an optimizer has taken the model's parameters; use attend(..., qk_norm=) in "
            "the model's own attention")
    if spec.output_gate:
        raise ValueError(
            "output_gate=True: the gate is computed from the attention layer's input, which the interception "
            "cannot see (it catches the SDPA call, whose arguments are q, k and v); use attend(..., output_gate=, gate_input=) in the "
            "model's own attention")
    if spec.is_learnable:
        raise ValueError(
            f"learnable=True ({spec.normalizer!r}'s parameter trains): the interception finds a model's layers "
            "during its first forward pass, after an optimizer has taken the model's parameters; use "
            "learnable=False, or attend(..., normalizer=) in the model's own attention")


def intercept(model: nn.Module, spec: AttentionSpec) -> nn.Module:
    """Run every SDPA call of ``model``'s forward under ``spec`` (see the module docstring); returns the model.
    Calling it again replaces the spec; `remove_attention_spec` undoes it."""
    check_spec(spec)
    remove_attention_spec(model)
    model.__dict__["_study_interception"] = Interception(model, spec)
    return model


def interception_of(model: nn.Module) -> Interception | None:
    return model.__dict__.get("_study_interception")


def remove_attention_spec(model: nn.Module) -> nn.Module:
    """Undo `intercept`: the hooks go, the model runs its own SDPA calls again; returns the model."""
    interception = model.__dict__.pop("_study_interception", None)
    if interception is not None:
        interception.remove()
    return model


__all__ = ["Interception", "check_spec", "intercept", "interception_of", "is_cross_attention", "remove_attention_spec"]
