"""Capture per-layer attention inputs (q, k, v) from any transformers causal LM.

The model runs once with a private attention implementation registered through
`transformers.AttentionInterface`. The function records the query/key/value tensors it receives (so
for Llama-style models q and k are already rotated by RoPE) and then delegates to the stock SDPA
forward, so the model's outputs are unchanged. Logits l = q.k * scaling are formed lazily, one layer
at a time, so an L x L matrix per head exists for one layer only.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

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
    hidden_states: the model's hidden states (embeddings, then each block's output) if requested;
        hidden_states[layer] is the residual stream entering block `layer`.
    """

    queries: list[torch.Tensor]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    scalings: list[float]
    hidden_states: list[torch.Tensor] | None = None
    meta: dict = field(default_factory=dict)

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

    def weights(self, layer: int, length: int | None = None, temperature: float = 1.0,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Causal softmax weights softmax(l / T) for one layer, (B, H, L, L), zeros above the diagonal."""
        logits = self.logits(layer, length, dtype) / temperature
        n = logits.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=logits.device).tril()
        logits = logits.masked_fill(~causal, torch.finfo(dtype).min)
        return torch.softmax(logits, dim=-1).masked_fill(~causal, 0.0)

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
            out = model(input_ids=input_ids, output_hidden_states=hidden_states, use_cache=False)
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
    )
