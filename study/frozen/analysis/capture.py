"""Capture per-layer attention inputs (q, k, v) from any transformers causal LM.

The model runs once under this project's attention implementation with an attention tap open (the same
mechanism the monitors use, `study.attention.tapping`): each layer's call hands the tap the query/key/value
tensors it received (so for Llama-style models q and k are already rotated by RoPE), with keys and values
already shared out to the query heads, and computes the attention the layer really runs (its spec's
normaliser, temperature and top-k; stock softmax for layers without a spec). The model's outputs are
therefore its own. Logits l = q.k * scaling are formed lazily, one layer at a time, so an L x L matrix per head
exists for one layer only.

Weights: `AttentionCapture.weights` applies each layer's own normaliser (its `study_normalizer` module, with
the spec's temperature and top-k selection) to the captured logits, computed exactly as `attend` computes
them, so the analysed weights are the weights the model uses (sparse maps give exact zeros). Models whose
attention applies its own logit transforms (soft-capping, position biases, sinks, sliding windows) are refused:
the analyses recompute weights from q and k alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from study.attention import AttentionInputs, normalizer_class, tapping
from study.attention.hf import implementation_for
from study.attention.normalizers import masked_softmax, top_k_allowed
from study.attention.spec import STOCK, AttentionSpec

from .rows import causal_visible

WEIGHTS_IN_ONE_PIECE = 2**26  # scores (B * H * L * L) up to which a layer's weights are normalised in one piece
WEIGHTS_BLOCK = 2**22  # scores per block of query rows above that


class _Enough(Exception):
    """Raised by the recorder once it holds the last layer it keeps: the rest of the forward pass is skipped."""


class _Recorder:
    """An attention tap that keeps each layer's inputs (and nothing of the weights).

    `keep`: the layers whose inputs are kept (None: every layer); the others are only counted, so a long-context
    capture holds q, k, v of the analysed layers alone. The recorder takes the model's attention in blocks of query
    rows (`row_blocks`): it needs only the call's inputs, which come with its first block, so attention at long L
    runs blockwise and never forms a layer's whole map.
    """

    row_blocks = True

    def __init__(self, keep: set[int] | None = None, stop_after: int | None = None) -> None:
        self.inputs: dict[int, AttentionInputs | None] = {}
        self.keep = keep
        self.stop_after = stop_after

    def observe_inputs(self, layer: int, inputs: AttentionInputs) -> None:
        unsupported = [t for t in inputs.transforms if t != "mask"]
        if unsupported:
            raise ValueError(f"layer {layer} applies {unsupported} to its logits; the analyses recompute weights "
                             "from q.k * scaling alone and cannot follow them")
        if self.keep is not None and int(layer) not in self.keep:  # its spec and scaling only, not its tensors
            inputs = replace(inputs, query=None, key=None, value=None)
        self.inputs[int(layer)] = inputs
        if self.stop_after is not None and int(layer) >= self.stop_after:
            raise _Enough  # the layers after the last one kept change nothing the capture holds

    def observe(self, layer, weights, allowed, spec) -> None:
        pass


def context_length(model) -> int | None:
    """The model's maximum context (n_positions / max_position_embeddings), or None if it names none."""
    config = model.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass
class AttentionCapture:
    """What one forward pass handed to each attention layer.

    queries/keys/values[layer]: (B, H, L, Dh), keys and values expanded to the query heads; None for a layer
        the capture did not keep (`capture_attention(..., layers=)`).
    scalings[layer]: the factor the model multiplies q.k by (1/sqrt(Dh) for GPT-2).
    specs[layer], normalizers[layer]: the layer's `AttentionSpec` and normaliser module when the model was
        switched by `apply_attention_spec` (None: stock softmax at T = 1).
    hidden_states: the model's hidden states (embeddings, then each block's output) if requested;
        hidden_states[layer] is the residual stream entering block `layer`.
    """

    queries: list[torch.Tensor | None]
    keys: list[torch.Tensor | None]
    values: list[torch.Tensor | None]
    scalings: list[float]
    hidden_states: list[torch.Tensor] | None = None
    meta: dict = field(default_factory=dict)
    specs: list[AttentionSpec | None] = field(default_factory=list)
    normalizers: list[nn.Module | None] = field(default_factory=list)

    def spec(self, layer: int) -> AttentionSpec:
        """The spec layer `layer` runs (stock softmax when the model carries none)."""
        spec = self.specs[layer] if layer < len(self.specs) else None
        return spec if spec is not None else STOCK

    def normalizer(self, layer: int) -> nn.Module:
        """The layer's normaliser module (built from its spec when the model carries none)."""
        norm = self.normalizers[layer] if layer < len(self.normalizers) else None
        if norm is None:
            norm = normalizer_class(self.spec(layer).normalizer).from_spec(self.spec(layer), num_heads=self.n_heads)
        return norm

    def is_softmax(self, layer: int) -> bool:
        """True when the layer's weights are plain softmax of logits / T over all visible keys."""
        return self.spec(layer).is_stock_softmax

    @property
    def n_layers(self) -> int:
        return len(self.queries)

    @property
    def kept_layers(self) -> list[int]:
        """The layers whose q, k, v the capture holds."""
        return [i for i, q in enumerate(self.queries) if q is not None]

    def _query(self, layer: int) -> torch.Tensor:
        q = self.queries[layer]
        if q is None:
            raise ValueError(f"layer {layer} was not kept by the capture (it kept layers {self.kept_layers})")
        return q

    @property
    def n_heads(self) -> int:
        return self._query(self.kept_layers[0]).shape[1]

    @property
    def length(self) -> int:
        return self._query(self.kept_layers[0]).shape[2]

    def logits(self, layer: int, length: int | None = None, dtype: torch.dtype = torch.float32,
               rows: slice | None = None) -> torch.Tensor:
        """Per-head scaled logits l = q.k * scaling for one layer, (B, H, L, L); no mask applied. `rows` keeps
        only those query rows, (B, H, rows, L) (the last query alone: ``rows=slice(-1, None)``)."""
        n = self.length if length is None else length
        q = self._query(layer)[:, :, :n]
        q = (q if rows is None else q[:, :, rows]).to(dtype)
        k = self.keys[layer][:, :, :n].to(dtype)
        return (q @ k.transpose(-1, -2)) * self.scalings[layer]

    def weights(self, layer: int, length: int | None = None, temperature: float | None = None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The layer's attention weights (B, H, L, L), zeros above the diagonal.

        temperature=None: exactly the weights the model uses (its normaliser, the spec's temperature and
        top-k), computed as `study.attention.attend` computes them. A number replaces the layer's temperature.
        Above `WEIGHTS_IN_ONE_PIECE` scores (long contexts) a row-wise normaliser runs on blocks of query rows
        written into the result, so the peak is the result plus one block, not several whole score tensors.
        """
        spec = self.spec(layer)
        T = spec.temperature if temperature is None else float(temperature)
        n = self.length if length is None else length
        q = self._query(layer)[:, :, :n].to(dtype)
        k = self.keys[layer][:, :, :n].to(dtype)
        scale = self.scalings[layer] / T
        if q.shape[0] * q.shape[1] * n * n <= WEIGHTS_IN_ONE_PIECE or not getattr(self.normalizer(layer), "row_wise", True):
            return self.normalize(layer, torch.matmul(q, k.transpose(-1, -2)) * scale)
        out = torch.empty(*q.shape[:2], n, n, dtype=dtype, device=q.device)
        step = max(1, WEIGHTS_BLOCK // (q.shape[0] * q.shape[1] * n))
        for start in range(0, n, step):
            stop = min(n, start + step)
            scores = torch.matmul(q[:, :, start:stop], k.transpose(-1, -2)) * scale
            out[:, :, start:stop] = self.normalize(layer, scores, first_row=start)
        return out

    @torch.no_grad()
    def normalize(self, layer: int, scores: torch.Tensor, first_row: int = 0) -> torch.Tensor:
        """Apply layer `layer`'s normaliser and top-k selection to causal scores (..., rows, L) (already / T) of
        the query rows first_row, first_row + 1, ... (all L rows by default)."""
        spec = self.spec(layer)
        n = scores.shape[-1]
        allowed = causal_visible(n, scores.device)[first_row:first_row + scores.shape[-2]]
        if spec.is_stock_softmax:
            return masked_softmax(scores, allowed)
        norm = self.normalizer(layer)
        param = next(iter(norm.parameters()), next(iter(norm.buffers()), None))
        if param is not None and (param.dtype != scores.dtype or param.device != scores.device):
            import copy

            norm = copy.deepcopy(norm).to(device=scores.device, dtype=scores.dtype)
        selected = allowed if spec.top_k is None else top_k_allowed(scores, allowed, spec.top_k)
        return norm(scores, selected, visible=allowed.expand_as(scores))

    def vectors(self, layer: int, kind: str = "value", length: int | None = None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The x_i of the paper for one layer: per-head values (B, H, L, Dh) or hidden states (B, 1, L, D)."""
        n = self.length if length is None else length
        if kind == "value":
            self._query(layer)  # names a layer the capture did not keep
            return self.values[layer][:, :, :n].to(dtype)
        if kind == "hidden":
            if self.hidden_states is None:
                raise ValueError("vectors='hidden' needs a capture made with hidden_states=True")
            return self.hidden_states[layer][:, None, :n].to(dtype)
        raise ValueError(f"vectors must be 'value' or 'hidden', got {kind!r}")


@contextmanager
def _implementation(model, name: str):
    """Switch the model to attention implementation `name`, restoring the previous one afterwards."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@torch.no_grad()
def capture_attention(model, input_ids: torch.Tensor, *, hidden_states: bool = False,
                      layers: Sequence[int] | None = None) -> AttentionCapture:
    """Run `model` on `input_ids` (B, L) and capture every layer's q, k, v (and optionally hidden states).

    `layers`: keep q, k, v of those layers only (the others are None in the capture), so that a long-context
    capture does not hold every layer's inputs; without `hidden_states` the forward pass stops at the last of them
    (n_layers then counts the layers up to it).

    The model computes its own attention (each layer's spec, or stock softmax) on the explicit path that taps open;
    its implementation is restored afterwards. Works for any causal LM whose attention goes through
    `transformers.AttentionInterface` (GPT-2, Llama, Mistral, Qwen, ...) and applies no logit transform of its own.
    """
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (B, L) with L >= 1, got shape {tuple(input_ids.shape)}")
    limit = context_length(model)
    if limit is not None and input_ids.shape[1] > limit:
        raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's context {limit}")
    was_training = model.training
    model.eval()
    keep = None if layers is None else {int(i) for i in layers}
    recorder = _Recorder(keep, stop_after=max(keep) if keep and not hidden_states else None)
    out = None
    try:
        with _implementation(model, implementation_for(model)), tapping(recorder):
            # The base model (no LM head): the attention inputs and hidden states are the same, and GPT-2's
            # 50257 x 768 head is about a sixth of the forward pass at L = 1024.
            runner = getattr(model, "base_model", None) or model
            out = runner(input_ids=input_ids, output_hidden_states=hidden_states, use_cache=False)
    except _Enough:
        pass
    finally:
        model.train(was_training)
    recorded = recorder.inputs
    if not recorded:
        raise RuntimeError("no attention call was captured: does this model use transformers.AttentionInterface?")
    calls = [recorded[i] for i in sorted(recorded)]
    if all(r.query is None for r in calls):
        raise ValueError(f"layers {sorted(layers or [])} not in the model, which has layers 0..{len(calls) - 1}")
    config = model.config
    in_model = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    if out is None and isinstance(in_model, int):  # stopped early: the layers not run hold nothing
        calls += [AttentionInputs(None, None, None, math.nan, STOCK, None)] * (in_model - len(calls))
    return AttentionCapture(
        queries=[r.query for r in calls],
        keys=[r.key for r in calls],
        values=[r.value for r in calls],
        scalings=[r.scaling for r in calls],
        hidden_states=[h.detach() for h in out.hidden_states] if hidden_states and out is not None else None,
        meta={"model": type(model).__name__, "model_type": getattr(model.config, "model_type", None)},
        # Stock layers (no spec) are reported as None, as before: `AttentionCapture.spec` reads them as STOCK.
        specs=[r.spec if r.spec is not STOCK else None for r in calls],
        normalizers=[r.normalizer for r in calls],
    )
