"""QK-norm: queries and keys normalised per head before their dot product, with a trainable scalar gain per head.

For query head h and key head h' (grouped-query attention shares a key head across a group of query heads):

    q_hat = g_q[h]  * q / rms(q),   rms(q) = sqrt(mean_d q_d^2 + eps)
    k_hat = g_k[h'] * k / rms(k)

so every logit is bounded: |q_hat . k_hat| <= g_q g_k d, and with the model's scale (1/sqrt(d) by default) and
the temperature, |l / T| <= |g_q g_k| d * scaling / T = g^2 sqrt(d) / T for equal gains. A low T can still
saturate rows; QK-norm only stops the logits from growing through the weights' norms.

Why a scalar gain per head and not a gain per dimension (OLMo 2, Qwen3): in a transformers model the attention
function receives q and k after the rotary position embedding. RMS over the head dimension is invariant under
RoPE's rotation R (an orthogonal map: rms(Rq) = rms(q)), and a scalar commutes with it, so normalising after RoPE
here is exactly normalising before it, as those models do. A per-dimension gain diag(w) does not commute with R
(R mixes pairs of dimensions), so the same module placed after RoPE would be a different function from the one
those models train. Models that already normalise q and k are refused by `study.attention.hf`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EPS = 1e-6
"""Added to the mean square before the root (Qwen3's and OLMo 2's default ``rms_norm_eps``)."""


def rms_normalize(x: Tensor, eps: float = EPS) -> Tensor:
    """``x / sqrt(mean(x^2) + eps)`` over the last (head) dimension, in x's dtype."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


class QKNorm(nn.Module):
    """The gains of one attention layer: ``query_gain`` (H,) and ``key_gain`` (H_kv,), both starting at 1.

    A submodule of the model's attention module (`apply_attention_spec` registers it as ``study_qk_norm``), so
    the gains train with the attention weights (``trainable: attention``) and are saved in its state dict.
    """

    def __init__(self, num_heads: int, num_kv_heads: int | None = None, eps: float = EPS) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} key heads in equal groups")
        self.eps = eps
        self.query_gain = nn.Parameter(torch.ones(num_heads))
        self.key_gain = nn.Parameter(torch.ones(num_kv_heads))

    def forward(self, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        """(B, H, Lq, D) and (B, H_kv, Lk, D) -> the normalised, scaled query and key, same shapes and dtypes."""
        if query.shape[1] != self.query_gain.shape[0] or key.shape[1] != self.key_gain.shape[0]:
            raise ValueError(
                f"QK-norm holds gains for {self.query_gain.shape[0]} query and {self.key_gain.shape[0]} key heads, "
                f"got {query.shape[1]} and {key.shape[1]}"
            )
        q = rms_normalize(query, self.eps) * self.query_gain.to(query.dtype).view(1, -1, 1, 1)
        k = rms_normalize(key, self.eps) * self.key_gain.to(key.dtype).view(1, -1, 1, 1)
        return q, k

    def logit_bound(self, head_dim: int, scaling: float | None = None, temperature: float = 1.0) -> Tensor:
        """(H,) the largest |logit / T| each query head can reach: |g_q g_k| d * scaling / T (Cauchy-Schwarz on
        two vectors of norm |g| sqrt(d))."""
        scaling = head_dim**-0.5 if scaling is None else scaling
        groups = self.query_gain.shape[0] // self.key_gain.shape[0]
        gains = (self.query_gain * self.key_gain.repeat_interleave(groups)).abs()
        return gains.detach() * head_dim * scaling / temperature


__all__ = ["EPS", "QKNorm", "rms_normalize"]
