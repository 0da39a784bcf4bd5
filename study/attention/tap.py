"""Attention taps: a way for monitors to see attention rows without keeping them.

A tap is any object with an ``observe`` method. While at least one tap is open (``with tapping(tap): ...``),
every attention call made through this project (`study.attention.attend`, or any transformers model after
`apply_attention_spec`) takes the explicit path and hands each tap the layer's weights, still inside the call,
so the tap can reduce them to per-head numbers at once. Nothing holds all layers' L x L maps at the same time.
When no tap is open, attention runs its fast path untouched: a step that does not log costs nothing extra.

A tap that also defines ``observe_inputs(layer, inputs)`` receives the call's `AttentionInputs` (queries, keys,
values, scaling, spec, normaliser): the paper's analyses (`study.frozen.analysis.capture_attention`) record those to
recompute logits at other temperatures. Monitors need only ``observe``.

A tap that also defines ``observe_logits(layer, logits)`` receives the call's `AttentionLogits`: the logits the
normaliser sees (q.k scaled by 1/(T sqrt(d)) after the model's own transforms) and the same logits before T, with
the visible keys. Attention keeps them alive until the taps have seen them only while such a tap is open
(`wants_logits`); the other taps cost nothing more. On the blockwise path a tap gets one `AttentionLogits` per
block of query rows, over the key columns that block can reach.

A tap whose ``observe`` only sums over rows may set ``row_blocks = True``: `attend`'s blockwise path
(`study.attention.blockwise`, long contexts) then hands it each block of query rows as it is computed, several
``observe`` calls per attention call with the same layer number, and never forms the whole map (a tap that also
records inputs gets them once, with the call's first block). While any open tap lacks the flag, attention keeps
the dense explicit path, so such a tap still sees each call's full map once.

A tap that only reads what it is handed may set ``fused_output = True``. On a spec the fused kernel computes
(stock softmax at any T, no top-k), while every open tap has the flag, the call's output still comes from that
kernel, and the weights the taps read are computed beside it without an autograd graph: a logged step then
trains (and backpropagates) exactly as an unlogged one, at the cost of the weights' forward only. A tap without
the flag gets the explicit path for the whole call, as before: its output is differentiable through the weights
to any order (the probe's Hessian of the loss in W_q, W_k needs that; the fused CPU kernel has no double
backward).

A tap that reads only row statistics may say so with ``row_statistics`` (a set of names from
`study.attention.rowstats.STATISTICS`; ``row_top_k``, when it asks for "top", the number of largest weights) and an
``observe_rows(layer, rows, spec)`` method. On a fused-path spec (stock softmax, no sink), while every open tap says
so, the call hands each tap the call's `study.attention.rowstats.RowStatistics` instead of weights: computed beside
the fused output from the kernel's log-sum-exp or in blocks of keys, O(L) memory and no attention map. While any
open tap needs the weights, every tap gets the weights, as above.

Taps are per process and per thread; under DDP each rank taps its own forward pass.

Under activation checkpointing (`CausalLMModule(gradient_checkpointing=True)`, transformers'
``activation_checkpointing_enable``) the backward pass runs each checkpointed layer's forward again. Taps see only
the first forward: a call made inside the backward pass (`recomputing`) is not handed to them, so each attention
call counts once per step, with or without checkpointing. The taps stay open during that recomputation, so it takes
the same (explicit) path as the forward it repeats.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from study.attention.spec import AttentionSpec


@dataclass(frozen=True)
class AttentionInputs:
    """What one attention call computed its weights from (all detached).

    query: (B, H, Lq, D). key, value: (B, H, Lk, D), already shared out to the query heads (grouped-query
    attention). scaling: the model's scale of q.k. normalizer: the layer's normaliser module.
    transforms: the model's own logit transforms besides the scale that this call applied ("softcap", "bias",
    "sinks", "sliding_window", "mask"): a consumer that recomputes weights from q and k alone must refuse them.
    """

    query: Tensor
    key: Tensor
    value: Tensor
    scaling: float
    spec: AttentionSpec
    normalizer: nn.Module
    transforms: tuple[str, ...] = ()


@dataclass(frozen=True)
class AttentionLogits:
    """The logits of one attention call (or one block of its query rows), detached, fp32 (fp64 for a fp64 model).

    scaled: (B, H, Lq, Lk), what the normaliser sees: z = l / T, top-k picks among them.
    raw: the same shape, l = q.k * scaling (1/sqrt(d) by default) after the model's own soft-capping and biases
        (none in GPT-2 or Llama), before T: ``raw / T == scaled`` up to rounding.
    visible: bool, broadcastable to the logits: the keys the query may see (causal, padding and window masks,
        before top-k). Entries at other positions are not logits of the model: statistics must mask them.
    spec: the layer's spec.
    """

    scaled: Tensor
    raw: Tensor
    visible: Tensor
    spec: AttentionSpec


class AttentionTap(Protocol):
    def observe(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> None:
        """Called once per attention call.

        Args:
            layer: the layer index (transformers' ``module.layer_idx``, or ``attend(..., layer=)``; calls without
                one are numbered in call order since the tap was opened).
            weights: detached fp32 weights, (B, H, Lq, Lk), zero on keys that are not allowed. Rows sum to 1
                only when ``NORMALIZERS[spec.normalizer].sums_to_one`` (not for self_adjust): statistics that
                treat a row as a distribution must check it.
            allowed: bool, broadcastable to weights: the causal/padding mask before top-k selection, i.e. the
                keys the query could see. Statistics "over visible keys" use it.
            spec: the layer's spec (its temperature is needed for the softmax Jacobian).
        """


class _TapState(threading.local):
    def __init__(self) -> None:
        self.taps: list[AttentionTap] = []
        self.unnamed_calls = 0


_state = _TapState()


@contextmanager
def tapping(*taps: AttentionTap) -> Iterator[None]:
    """Open taps for the duration of the block (nestable)."""
    _state.taps.extend(taps)
    if len(_state.taps) == len(taps):
        _state.unnamed_calls = 0
    try:
        yield
    finally:
        for tap in taps:
            _state.taps.remove(tap)


@contextmanager
def suspended() -> Iterator[None]:
    """Hide the open taps for the duration of the block (attention that monitors must not see: cross-attention)."""
    saved, _state.taps = _state.taps, []
    try:
        yield
    finally:
        _state.taps = saved


@contextmanager
def reopened(taps: tuple[AttentionTap, ...]) -> Iterator[None]:
    """The taps ``taps`` open (and only those) for the duration of the block: activation checkpointing's
    recomputation takes the path its forward took (`study.attention.recompute`); `notify` still skips it."""
    saved, _state.taps = _state.taps, list(taps)
    try:
        yield
    finally:
        _state.taps = saved


def active_taps() -> tuple[AttentionTap, ...]:
    return tuple(_state.taps)


def takes_row_blocks() -> bool:
    """Whether every open tap accepts its weights in blocks of query rows (``row_blocks = True``); a tap that
    records a call's inputs (``observe_inputs``) gets them with the call's first block."""
    return all(getattr(tap, "row_blocks", False) for tap in _state.taps)


def recomputing() -> bool:
    """Whether this call runs inside a backward pass: activation checkpointing's recomputation of a forward the
    taps already saw (autograd's engine runs a graph task only during backward)."""
    return torch._C._current_graph_task_id() != -1


def fused_output_allowed() -> bool:
    """Whether every open tap lets the call's output come from the fused kernel (``fused_output = True``)."""
    return all(getattr(tap, "fused_output", False) for tap in _state.taps)


def wants_logits() -> bool:
    """Whether an open tap receives the calls' logits (defines ``observe_logits``)."""
    return any(hasattr(tap, "observe_logits") for tap in _state.taps)


def row_statistics_needed() -> tuple[frozenset[str], int] | None:
    """(The statistics every open tap asks for together, the largest ``row_top_k``) when every open tap takes
    row statistics (``row_statistics`` and ``observe_rows``), else None (then the taps get the weights)."""
    if not _state.taps:
        return None
    needs: frozenset[str] = frozenset()
    top_k = 1
    for tap in _state.taps:
        wanted = getattr(tap, "row_statistics", None)
        if wanted is None or not hasattr(tap, "observe_rows"):
            return None
        needs |= wanted
        top_k = max(top_k, getattr(tap, "row_top_k", 1))
    return needs, top_k


def notify_rows(layer: int | None, rows, spec: AttentionSpec) -> None:
    """Hand every open tap one call's `study.attention.rowstats.RowStatistics` (not inside a backward pass)."""
    if recomputing():
        return
    layer = layer_number(layer)
    for tap in _state.taps:
        tap.observe_rows(layer, rows, spec)


def layer_number(layer: int | None) -> int:
    """The layer number taps see for one attention call: ``layer``, or the next number in call order (a
    recomputed call does not advance it)."""
    if layer is None:
        layer = _state.unnamed_calls
        if not recomputing():
            _state.unnamed_calls += 1
    return layer


def notify(
    layer: int | None, weights: Tensor, allowed: Tensor, spec: AttentionSpec, inputs: AttentionInputs | None = None,
    logits: AttentionLogits | None = None,
) -> None:
    if recomputing():  # the taps saw this call in the forward pass
        return
    layer = layer_number(layer)
    weights = weights.detach()
    for tap in _state.taps:
        if inputs is not None and hasattr(tap, "observe_inputs"):
            tap.observe_inputs(layer, inputs)
        if logits is not None and hasattr(tap, "observe_logits"):
            tap.observe_logits(layer, logits)
        tap.observe(layer, weights, allowed, spec)
