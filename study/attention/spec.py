"""`AttentionSpec`: which normaliser, temperature and top-k selection an attention layer uses."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# The built-in normalisers register themselves on import; the registry itself sits below both modules.
from study.attention import normalizers as _builtins  # noqa: F401
from study.attention.registry import normalizer_class

SELF_ADJUST_VARIANTS = ("normalized", "plain")


@dataclass(frozen=True)
class AttentionSpec:
    """How attention rows are normalised.

    Args:
        normalizer: name of the row normaliser (see `study.attention.NORMALIZERS`); "softmax" is the stock one.
            Your own: a name registered with `study.attention.register_normalizer`, or ``"module:Class"``.
        temperature: T > 0. Scores are ``l / T`` where l is the model's own logit: ``q.k * scaling`` (1/sqrt(d)
            for GPT-2) after the model's own transforms (additive position bias, soft-capping; see `attend`), so
            T = 1 is the stock model and T < 1 sharpens attention.
        top_k: None keeps every visible key. An integer k >= 1 keeps exactly the k largest scores among the
            visible keys and renormalises over them; among tied scores the lowest position wins (the same rule on
            both attention paths and in the analyses, `study.attention.select`). A row that sees fewer than k keys
            keeps them all.
        layers: indices of the layers the spec applies to; None means all. Other layers keep stock attention.
        alpha: the alpha of ``normalizer="entmax"`` (alpha-entmax; 1 would be softmax, 2 is sparsemax); > 1.
        learnable: whether the normaliser's parameter trains (entmax: alpha per head; ssmax: s per head).
            None means the normaliser's default: True for ssmax (as in the SSMax paper), False for entmax.
            True on a normaliser without parameters is rejected.
        ssmax_scale: initial (or fixed) s of ``normalizer="ssmax"``, per head; finite and > 0.
        self_adjust_variant: ``normalizer="self_adjust"`` only: "normalized" or "plain" (see `SelfAdjustSoftmax`).

    Options that only one normaliser reads (alpha, ssmax_scale, self_adjust_variant) must keep their default
    under any other normaliser: a value that would be silently ignored is rejected instead.
    Validation happens at construction, so a bad value fails before any model or data is touched.
    """

    normalizer: str = "softmax"
    temperature: float = 1.0
    top_k: int | None = None
    layers: tuple[int, ...] | None = None
    alpha: float = 1.5
    learnable: bool | None = None
    ssmax_scale: float = 0.43
    self_adjust_variant: str = "normalized"

    def __post_init__(self) -> None:
        if not isinstance(self.normalizer, str):
            raise ValueError(f"normalizer must be a name, got {self.normalizer!r}")
        normalizer = normalizer_class(self.normalizer)  # raises naming the unknown name
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature <= 0:
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature!r}")
        if self.top_k is not None:
            if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
                raise ValueError(f"top_k must be None or an integer >= 1, got {self.top_k!r}")
            if self.top_k < 1:
                raise ValueError(f"top_k must be None or an integer >= 1, got {self.top_k!r}")
        if self.layers is not None:
            layers = tuple(self.layers)  # YAML gives lists
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
                raise ValueError(f"layers must be non-negative layer indices, got {self.layers!r}")
            object.__setattr__(self, "layers", layers)
        for name in ("alpha", "ssmax_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.learnable is not None and not isinstance(self.learnable, bool):
            raise ValueError(f"learnable must be None, True or False, got {self.learnable!r}")
        if self.self_adjust_variant not in SELF_ADJUST_VARIANTS:
            raise ValueError(
                f"unknown self_adjust_variant {self.self_adjust_variant!r}; choose one of {list(SELF_ADJUST_VARIANTS)}"
            )
        normalizer.check_spec(self)

    @property
    def is_stock_softmax(self) -> bool:
        """True when the layer computes plain (temperature-scaled) softmax over all visible keys.

        Such layers run on PyTorch's fused SDPA kernel with the temperature folded into its scale.
        """
        return self.normalizer == "softmax" and self.top_k is None

    def applies_to(self, layer: int | None) -> bool:
        return self.layers is None or layer is None or layer in self.layers

    def as_hparams(self) -> dict[str, object]:
        """Flat, TensorBoard-friendly hyperparameters (HParams needs scalars: top-k is "all" or the k as text)."""
        hparams = asdict(self)
        hparams["top_k"] = top_k_hparam(self.top_k)
        hparams["layers"] = "all" if self.layers is None else ",".join(map(str, self.layers))
        hparams["learnable"] = self.is_learnable
        return hparams

    @property
    def is_learnable(self) -> bool:
        """Whether the normaliser's parameter trains, with None resolved to the normaliser's default."""
        if self.learnable is not None:
            return self.learnable
        return normalizer_class(self.normalizer).learnable_by_default


STOCK = AttentionSpec()


def top_k_hparam(top_k: int | None) -> str:
    """Top-k as HParams shows it: "all" (every visible key) or the k. Text for both: one column holds one type, and
    a number column would show "all" as 0."""
    return "all" if top_k is None else str(top_k)
