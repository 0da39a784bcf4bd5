"""The built-in row normalisers: fp32 scores over allowed keys -> attention weights.

Every normaliser is an `nn.Module` so that learnable parameters (SSMax's s, entmax's alpha) live in the model's
state dict. The contract (``weights = normalizer(scores, allowed, visible=None)``) is documented on the base
class, `study.attention.registry.Normalizer`. Each built-in registers with `@register_normalizer` and declares
its own options (``options``: name -> default), as your own normaliser does.

Rows sum to 1 for every normaliser except Self-Adjust Softmax (``sums_to_one = False``); monitors that treat a
row as a distribution (entropy, KL to uniform, top-k mass) must check that flag.

Names: softmax, sparsemax, entmax15, entmax (alpha from the spec, optionally learnable per head), ssmax
(Scalable-Softmax), self_adjust (SA-Softmax, "normalized" or "plain" variant), uniform (equal weight on every
allowed key: the control for a model that need not attend).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

import entmax
import torch
from torch import Tensor

from study.attention.registry import MASK_VALUE, NORMALIZERS, Normalizer, register_normalizer
from study.attention.select import top_k_allowed

if TYPE_CHECKING:
    from study.attention.spec import AttentionSpec


def masked_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the allowed keys of each row; rows with no allowed key are all zero (not NaN)."""
    weights = scores.masked_fill(~allowed, MASK_VALUE).softmax(dim=-1)
    # A row with no allowed key softmaxes to uniform over masked keys: zero it instead.
    return weights.masked_fill(~allowed, 0.0)


def _per_head(values: Tensor) -> Tensor:
    """(H,) -> (1, H, 1, 1), to broadcast against (B, H, Lq, Lk) scores."""
    return values.view(1, -1, 1, 1)


@register_normalizer
class Softmax(Normalizer):
    """exp(score) / sum exp(score) over allowed keys: the stock normaliser."""

    name = "softmax"

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        return masked_softmax(scores, allowed)


def _threshold_input(scores: Tensor, allowed: Tensor, alpha: Tensor | float) -> Tensor:
    """Scores with masked keys replaced by a finite value that alpha-entmax is guaranteed to map to exactly 0.

    alpha-entmax gives p_i = [(alpha - 1) z_i - tau]_+^(1 / (alpha - 1)) with tau >= (alpha - 1) max(z) - 1
    (no weight exceeds 1), so any z_i <= max(z) - 1 / (alpha - 1) gets exactly 0. The fill is one unit below that
    bound, relative to the row's largest allowed score. A global fill such as float32's minimum does not work
    here: entmax15 squares its inputs (inf - inf = NaN), entmax_bisect multiplies them by alpha - 1 (overflow to
    -inf for alpha > 2) and returns NaN on a row whose entries are all the fill value.

    Rows with no allowed key keep their raw (finite) scores so that the map and its gradient stay finite; the
    caller zeroes those rows afterwards.
    """
    usable = allowed | ~allowed.any(dim=-1, keepdim=True)
    # Detached: the fill is a constant; masked keys get weight 0 and no gradient either way.
    row_max = scores.masked_fill(~usable, MASK_VALUE).amax(dim=-1, keepdim=True).detach()
    if isinstance(alpha, Tensor):
        alpha = alpha.detach()
    fill = row_max - 1.0 - 1.0 / (alpha - 1.0)
    return torch.where(usable, scores, fill)


@register_normalizer
class Sparsemax(Normalizer):
    """Euclidean projection of the scores onto the simplex (Martins & Astudillo 2016), via `entmax.sparsemax`.

    Rows sum to 1 and keys far enough below the row maximum get exactly 0. Temperature matters: sparsemax is not
    scale-invariant, so sparsemax(z / T) is sparser as T falls (one key at T -> 0, wider support as T grows).
    With top_k the projection runs over the k selected keys; when k is at least the support size of the full row
    this equals sparsemax over all visible keys (the support is always a set of largest scores).
    """

    name = "sparsemax"

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        weights = entmax.sparsemax(_threshold_input(scores, allowed, 2.0), dim=-1)
        return weights.masked_fill(~allowed, 0.0)


@register_normalizer
class Entmax15(Normalizer):
    """1.5-entmax (Peters et al. 2019), exact sort-based, via `entmax.entmax15`.

    Between softmax and sparsemax: rows sum to 1 with exact zeros. Temperature and top_k behave as for sparsemax.
    For another alpha, or a learnable one, use ``normalizer="entmax"``.
    """

    name = "entmax15"

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        weights = entmax.entmax15(_threshold_input(scores, allowed, 1.5), dim=-1)
        return weights.masked_fill(~allowed, 0.0)


# A learnable alpha is kept above 1 + _ALPHA_MARGIN: at alpha = 1 entmax is undefined (it becomes softmax as a
# limit) and its bisection and alpha-gradient divide by (alpha - 1).
_ALPHA_MARGIN = 1e-3


@register_normalizer
class Entmax(Normalizer):
    """alpha-entmax with the option ``alpha`` per head, by bisection (`entmax.entmax_bisect`, differentiable in alpha).

    Rows sum to 1; alpha > 1 gives exact zeros (alpha -> 1 tends to softmax, 2 is sparsemax, larger is sparser).
    ``spec.learnable=True`` makes alpha a per-head parameter ("adaptively sparse" attention, Correia et al. 2019),
    clamped to alpha >= 1.001 in the forward pass so an optimizer step can never leave the valid range; otherwise
    alpha is a buffer. Either way it is stored as ``alpha`` (shape (H,)) in the state dict. Temperature and top_k
    behave as for sparsemax. The bisection runs a fixed 50 iterations.
    """

    name = "entmax"
    options = MappingProxyType({"alpha": 1.5})
    has_parameters = True

    @classmethod
    def check_spec(cls, spec: AttentionSpec) -> None:
        super().check_spec(spec)
        alpha = spec.options["alpha"]
        if alpha <= 1:
            raise ValueError(f"alpha must be > 1 for entmax (alpha = 1 is softmax), got {alpha!r}")

    def __init__(self, alpha: float, num_heads: int, learnable: bool) -> None:
        super().__init__()
        self.add_per_head("alpha", alpha, num_heads, learnable)

    @classmethod
    def from_spec(cls, spec: AttentionSpec, num_heads: int) -> Entmax:
        return cls(spec.options["alpha"], num_heads, spec.is_learnable)

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        alpha = _per_head(self.alpha.float().clamp(min=1.0 + _ALPHA_MARGIN))
        # entmax_bisect wants alpha shaped like the scores with the key dimension reduced to 1.
        alpha = alpha.expand(*scores.shape[:-1], 1)
        weights = entmax.entmax_bisect(_threshold_input(scores, allowed, alpha), alpha=alpha, dim=-1)
        return weights.masked_fill(~allowed, 0.0)


@register_normalizer
class ScalableSoftmax(Normalizer):
    """Scalable-Softmax (SSMax, Nakanishi 2025): softmax(s * log(n) * z), s per head.

    n is the number of keys the query can see: the causal/padding mask BEFORE any top-k selection (``visible``),
    so row t of a causal sequence uses n = t + 1. SSMax's log n compensates for the context length (the max of n
    logits must outgrow log n for attention not to fade); top-k is a selection made afterwards on the scores, and
    a positive factor does not change which keys are the largest. So ssmax with top_k is "SSMax over the visible
    row, keep the k largest weights, renormalise", exactly as top_k treats softmax. (Using the selected count
    instead would freeze the factor at log k and make SSMax's scale depend on k.)

    A row with one visible key has log 1 = 0 and gets weight 1 on it, as it must; n is clamped to 1 so rows with
    no visible key stay finite (and are zeroed). Temperature divides the scores as usual, so it multiplies with
    s log n. Rows sum to 1.

    s is a per-head parameter (``spec.learnable`` None/True, as in the SSMax paper) or a fixed buffer
    (``learnable=False``), stored as ``s`` (shape (H,)). It starts at the option ``ssmax_scale``, default 0.43: the
    value the SSMax paper uses to illustrate the method (its Fig. 1). With it s log n = 1 at n = e^(1/0.43) ~ 10:
    rows that see fewer keys are flatter than softmax, longer rows sharper.
    """

    name = "ssmax"
    options = MappingProxyType({"ssmax_scale": 0.43})
    has_parameters = True
    learnable_by_default = True

    @classmethod
    def check_spec(cls, spec: AttentionSpec) -> None:
        super().check_spec(spec)
        scale = spec.options["ssmax_scale"]
        if scale <= 0:
            raise ValueError(f"ssmax_scale must be > 0, got {scale!r}")

    def __init__(self, scale: float, num_heads: int, learnable: bool) -> None:
        super().__init__()
        self.add_per_head("s", scale, num_heads, learnable)

    @classmethod
    def from_spec(cls, spec: AttentionSpec, num_heads: int) -> ScalableSoftmax:
        return cls(spec.options["ssmax_scale"], num_heads, spec.is_learnable)

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        if visible is None:
            visible = allowed
        log_n = visible.sum(dim=-1, keepdim=True).clamp(min=1).to(scores.dtype).log()
        return masked_softmax(scores * (_per_head(self.s.to(scores.dtype)) * log_n), allowed)


@register_normalizer
class SelfAdjustSoftmax(Normalizer):
    """Self-Adjust Softmax (SA-Softmax, Zheng et al. 2025, arXiv 2502.18277), over the allowed keys of each row.

    The option ``self_adjust_variant``:
    - "normalized" (default): (z - min(z_min, 0)) / (max(0, z_max) - min(z_min, 0)) * softmax(z), with z_min and
      z_max over the allowed keys. Weights lie in [0, 1]; the factor is 0 for the smallest score when it is
      negative, so a row with one key of negative score gets weight 0, one with a positive score gets 1. A row of
      all-zero scores (0 / 0) gets 0.
    - "plain": z * softmax(z). Weights are unbounded and negative where z < 0.

    Rows do NOT sum to 1 in general (``sums_to_one = False``): entropy, KL to uniform and top-k mass monitors that
    assume a distribution do not apply as such; renormalise or skip them. z includes the temperature (scores / T),
    so T scales both the factor and the softmax. With top_k, min, max and softmax run over the selected keys.
    """

    name = "self_adjust"
    options = MappingProxyType({"self_adjust_variant": "normalized"})
    variants = ("normalized", "plain")
    sums_to_one = False

    @classmethod
    def check_spec(cls, spec: AttentionSpec) -> None:
        super().check_spec(spec)
        variant = spec.options["self_adjust_variant"]
        if variant not in cls.variants:
            raise ValueError(f"unknown self_adjust_variant {variant!r}; choose one of {list(cls.variants)}")

    def __init__(self, variant: str = "normalized") -> None:
        super().__init__()
        self.variant = variant

    @classmethod
    def from_spec(cls, spec: AttentionSpec, num_heads: int) -> SelfAdjustSoftmax:
        return cls(spec.options["self_adjust_variant"])

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}"

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        probs = masked_softmax(scores, allowed)
        if self.variant == "plain":
            factor = scores
        else:
            # Rows with no allowed key use all their (finite) scores: no +-inf in min/max, zeroed below.
            usable = allowed | ~allowed.any(dim=-1, keepdim=True)
            low = scores.masked_fill(~usable, torch.inf).amin(dim=-1, keepdim=True).clamp(max=0.0)
            high = scores.masked_fill(~usable, -torch.inf).amax(dim=-1, keepdim=True).clamp(min=0.0)
            span = high - low
            factor = (scores - low) / torch.where(span > 0, span, torch.ones_like(span))
        return (factor * probs).masked_fill(~allowed, 0.0)


@register_normalizer
class Uniform(Normalizer):
    """Equal weight on every allowed key, whatever the scores: 1 / (number of allowed keys) per row.

    The control arm of a from-scratch study: the same model with attention that reads no query or key, so its
    held-out loss is what the architecture reaches without selecting positions. With ``top_k`` the row is uniform
    over the selected keys (selection still reads the scores, in an order no T changes). The scores get no gradient through the weights,
    and the temperature has no effect, so a temperature other than 1 is refused rather than silently ignored.
    """

    name = "uniform"

    @classmethod
    def check_spec(cls, spec) -> None:
        super().check_spec(spec)
        if spec.temperature != 1.0:  # selection by top_k is the same at every T too
            raise ValueError(
                f"temperature={spec.temperature!r} has no effect with normalizer 'uniform' (its weights do not read "
                "the scores); use temperature 1"
            )

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        allowed = allowed.expand_as(scores)
        counts = allowed.sum(dim=-1, keepdim=True).clamp(min=1)  # a row with no allowed key stays all zero
        return allowed.to(scores.dtype) / counts.to(scores.dtype)


__all__ = [
    "MASK_VALUE",
    "NORMALIZERS",
    "Entmax",
    "Entmax15",
    "Normalizer",
    "ScalableSoftmax",
    "SelfAdjustSoftmax",
    "Softmax",
    "Sparsemax",
    "Uniform",
    "masked_softmax",
    "top_k_allowed",
]
