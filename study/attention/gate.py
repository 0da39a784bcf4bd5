"""The output gate: a sigmoid gate on the attention output, computed from the layer's input, per head and element.

Qiu et al. 2025 ("Gated Attention for Large Language Models", arXiv 2505.06708), their best variant (G1,
elementwise and head-specific): with X the attention layer's input (the hidden states after the block's pre-norm)
and Y the attention output of head h before the heads are joined and projected,

    Y'_h = Y_h * sigmoid(X W_h (+ b_h))

where W = [W_0 ... W_{H-1}] is one (d_model, H * D) projection whose columns h*D .. (h+1)*D - 1 gate head h. The
gate reads no query, key or weight: it rescales what each head passes to the output projection, so every
normaliser, temperature and top-k selection keeps its rows; it runs on every path of `attend`.

In their code the gate's columns are appended to the query projection (``q_proj``), so they are initialised and
biased as it is: the model's own init of a linear layer (normal, mean 0, std ``initializer_range``; bias zero) and a
bias exactly when the attention projections have one. `study.attention.hf` builds it that way. At that init every
gate is close to 1/2: a model built with the gate is a different model from step 0, which is why a pretrained model
is not given one (`study.model`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class OutputGate(nn.Module):
    """The gate of one attention layer: ``linear``, a (d_model -> H * D) linear map, and its sigmoid per head.

    A submodule of the model's attention module (`apply_attention_spec` registers it as ``study_output_gate``), so
    it trains with the attention weights (``trainable: attention``) and is saved in its state dict. Its child is
    not named ``proj``: the gradient monitors group parameters by name (`study.metrics.gradients`), and a
    ``proj`` inside an attention module would be counted as W_o.
    """

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, bias: bool = True) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"OutputGate: {name} must be an integer >= 1, got {value!r}")
        self.num_heads, self.head_dim = num_heads, head_dim
        self.linear = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.input: Tensor | None = None  # the layer's input, held from the module's forward to its attention call

    def forward(self, hidden_states: Tensor) -> Tensor:
        """(B, L, d_model) -> the gate (B, H, L, D), in (0, 1)."""
        if hidden_states.shape[-1] != self.linear.in_features:
            raise ValueError(f"the output gate reads inputs of width {self.linear.in_features}, got "
                             f"{tuple(hidden_states.shape)}")
        batch, length = hidden_states.shape[0], hidden_states.shape[1]
        scores = self.linear(hidden_states).view(batch, length, self.num_heads, self.head_dim)
        return torch.sigmoid(scores).transpose(1, 2)

    def gated(self, output: Tensor, hidden_states: Tensor) -> Tensor:
        """The attention output (B, H, L, D) gated by the gate of ``hidden_states`` (B, L, d_model), in its dtype."""
        gate = self(hidden_states)
        if gate.shape != output.shape:
            raise ValueError(f"the output gate of {self.num_heads} heads x {self.head_dim} gives {tuple(gate.shape)}, "
                             f"but the attention output is {tuple(output.shape)}")
        return output * gate.to(output.dtype)


__all__ = ["OutputGate"]
