"""Capture per-layer attention inputs (q, k, v) from any transformers causal LM.

The model runs once with a private attention implementation registered through
`transformers.AttentionInterface`. The function records the query/key/value tensors it receives (so
for Llama-style models q and k are already rotated by RoPE) and then delegates to the attention the
layer really runs: the stock SDPA forward, or, for a layer switched by `study.attention.apply_attention_spec`,
the project's `attend` under the layer's spec (normaliser, temperature, top-k). The model's outputs are
therefore unchanged. Logits l = q.k * scaling are formed lazily, one layer at a time, so an L x L matrix
per head exists for one layer only.

Weights: `AttentionCapture.weights` applies each layer's own normaliser (its `study_normalizer` module, with
the spec's temperature and top-k selection) to the captured logits, computed exactly as `attend` computes
them, so the analysed weights are the weights the model uses (sparse maps give exact zeros). Layers without
a spec are stock softmax at T = 1.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from study.attention import hf as _study_hf
from study.attention.normalizers import NORMALIZERS, top_k_allowed
from study.attention.spec import STOCK, AttentionSpec

CAPTURE_IMPLEMENTATION = "study_analysis_capture"

# The recorder the attention function writes to while a capture is running (None otherwise).
_ACTIVE: dict | None = None


def _capture_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Record q/k/v for `module.layer_idx`, then run the stock SDPA attention."""
    if _ACTIVE is not None:
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            layer = len(_ACTIVE)
        # GQA: key/value heads are shared by groups of query heads; expand so every query head has its own.
        n_rep = query.shape[1] // key.shape[1]
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        _ACTIVE[int(layer)] = (
            query.detach(),
            repeat_kv(key.detach(), n_rep),
            repeat_kv(value.detach(), n_rep),
            float(scaling),
            getattr(module, "study_spec", None),
            getattr(module, "study_normalizer", None),
        )
    if hasattr(module, "study_spec"):
        # The layer runs under an AttentionSpec: delegate to the project's attention so the forward pass (and
        # therefore every later layer's q, k, v) is the model's own.
        return _study_hf._attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


# Both registrations are needed: without a mask function of the same name the model silently stops
# being causal. `sdpa_mask` may return None (causal skip), which SDPA then honours with is_causal.
AttentionInterface.register(CAPTURE_IMPLEMENTATION, _capture_attention)
AttentionMaskInterface.register(CAPTURE_IMPLEMENTATION, sdpa_mask)


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

    queries/keys/values[layer]: (B, H, L, Dh), keys and values expanded to the query heads.
    scalings[layer]: the factor the model multiplies q.k by (1/sqrt(Dh) for GPT-2).
    specs[layer], normalizers[layer]: the layer's `AttentionSpec` and normaliser module when the model was
        switched by `apply_attention_spec` (None: stock softmax at T = 1).
    hidden_states: the model's hidden states (embeddings, then each block's output) if requested;
        hidden_states[layer] is the residual stream entering block `layer`.
    """

    queries: list[torch.Tensor]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
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
            norm = NORMALIZERS[self.spec(layer).normalizer].from_spec(self.spec(layer), num_heads=self.n_heads)
        return norm

    def is_softmax(self, layer: int) -> bool:
        """True when the layer's weights are plain softmax of logits / T over all visible keys."""
        return self.spec(layer).is_stock_softmax

    @property
    def n_layers(self) -> int:
        return len(self.queries)

    @property
    def n_heads(self) -> int:
        return self.queries[0].shape[1]

    @property
    def length(self) -> int:
        return self.queries[0].shape[2]

    def logits(self, layer: int, length: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Per-head scaled logits l = q.k * scaling for one layer, (B, H, L, L); no mask applied."""
        n = self.length if length is None else length
        q = self.queries[layer][:, :, :n].to(dtype)
        k = self.keys[layer][:, :, :n].to(dtype)
        return (q @ k.transpose(-1, -2)) * self.scalings[layer]

    def weights(self, layer: int, length: int | None = None, temperature: float | None = None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The layer's attention weights (B, H, L, L), zeros above the diagonal.

        temperature=None: exactly the weights the model uses (its normaliser, the spec's temperature and
        top-k), computed as `study.attention.attend` computes them. A number replaces the layer's temperature.
        """
        spec = self.spec(layer)
        T = spec.temperature if temperature is None else float(temperature)
        n = self.length if length is None else length
        q = self.queries[layer][:, :, :n].to(dtype)
        k = self.keys[layer][:, :, :n].to(dtype)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.scalings[layer] / T)
        return self.normalize(layer, scores)

    @torch.no_grad()
    def normalize(self, layer: int, scores: torch.Tensor) -> torch.Tensor:
        """Apply layer `layer`'s normaliser and top-k selection to causal scores (..., L, L) (already / T)."""
        spec = self.spec(layer)
        n = scores.shape[-1]
        allowed = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        if spec.is_stock_softmax:
            z = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            return torch.softmax(z, dim=-1).masked_fill(~allowed, 0.0)
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
def capture_attention(model, input_ids: torch.Tensor, *, hidden_states: bool = False) -> AttentionCapture:
    """Run `model` on `input_ids` (B, L) and capture every layer's q, k, v (and optionally hidden states).

    The model's own outputs are unchanged (the capture delegates to SDPA). Works for any causal LM whose
    attention goes through `transformers.AttentionInterface` (GPT-2, Llama, Mistral, Qwen, ...).
    """
    global _ACTIVE
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (B, L) with L >= 1, got shape {tuple(input_ids.shape)}")
    limit = context_length(model)
    if limit is not None and input_ids.shape[1] > limit:
        raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's context {limit}")
    if _ACTIVE is not None:
        raise RuntimeError("capture_attention is not re-entrant")
    was_training = model.training
    model.eval()
    _ACTIVE = {}
    try:
        with _implementation(model, CAPTURE_IMPLEMENTATION):
            # The base model (no LM head): the attention inputs and hidden states are the same, and GPT-2's
            # 50257 x 768 head is about a sixth of the forward pass at L = 1024.
            runner = getattr(model, "base_model", None) or model
            out = runner(input_ids=input_ids, output_hidden_states=hidden_states, use_cache=False)
        recorded = _ACTIVE
    finally:
        _ACTIVE = None
        model.train(was_training)
    if not recorded:
        raise RuntimeError("no attention call was captured: does this model use transformers.AttentionInterface?")
    layers = sorted(recorded)
    hs = None
    if hidden_states:
        hs = [h.detach() for h in out.hidden_states]
    return AttentionCapture(
        queries=[recorded[i][0] for i in layers],
        keys=[recorded[i][1] for i in layers],
        values=[recorded[i][2] for i in layers],
        scalings=[recorded[i][3] for i in layers],
        hidden_states=hs,
        meta={"model": type(model).__name__, "model_type": getattr(model.config, "model_type", None)},
        specs=[recorded[i][4] for i in layers],
        normalizers=[recorded[i][5] for i in layers],
    )
