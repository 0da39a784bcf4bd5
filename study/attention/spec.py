"""`AttentionSpec`: which normaliser, temperature and top-k selection an attention layer uses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# The built-in normalisers register themselves on import; the registry itself sits below both modules.
from study.attention import normalizers as _builtins  # noqa: F401
from study.attention.registry import normalizer_class

# Options of built-in normalisers that configs name as keys of their own (`model.attention.alpha: 2`): each is the
# same as `options: {alpha: 2}`. New options belong in `options` only.
OPTION_KEYS = ("alpha", "ssmax_scale", "self_adjust_variant")


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
        learnable: whether the normaliser's parameter trains (entmax: alpha per head; ssmax: s per head).
            None means the normaliser's default: True for ssmax (as in the SSMax paper), False for entmax.
            True on a normaliser without parameters is rejected.
        options: the normaliser's own options, by name (``{"alpha": 2.0}`` for entmax); the normaliser declares
            them with their defaults (`Normalizer.options`) and checks their values. After construction it holds
            every option of the normaliser, defaults filled in. An option the normaliser does not declare is
            rejected: it would be silently ignored.
        alpha, ssmax_scale, self_adjust_variant: the built-ins' options under keys of their own (as configs
            write them): ``alpha=2.0`` is ``options={"alpha": 2.0}``. After construction each holds the resolved
            value when the normaliser has that option, else None.
        qk_norm: normalise q and k per head (RMS over the head dimension, a trainable scalar gain per head,
            `study.attention.qknorm`) before their dot product, on every path and with every normaliser; the
            logits are then bounded by ``g_q g_k d * scaling / T`` (``g^2 sqrt(d) / T`` at the default scale).
        output_gate: gate each head's attention output elementwise by ``sigmoid(X W)`` before the output
            projection, X the layer's input (Qiu et al. 2025's G1 gate, `study.attention.gate`; W trainable, one
            per layer). It rescales the output, not the weights, so it composes with every normaliser, T and top-k.
            A new gate changes a model's function: for models built from scratch (`study.model` refuses it on a
            pretrained one).

    Validation happens at construction, so a bad value fails before any model or data is touched.
    """

    normalizer: str = "softmax"
    temperature: float = 1.0
    top_k: int | None = None
    layers: tuple[int, ...] | None = None
    learnable: bool | None = None
    options: dict[str, Any] | None = None
    alpha: float | None = None
    ssmax_scale: float | None = None
    self_adjust_variant: str | None = None
    qk_norm: bool = False
    output_gate: bool = False

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
        if self.learnable is not None and not isinstance(self.learnable, bool):
            raise ValueError(f"learnable must be None, True or False, got {self.learnable!r}")
        if not isinstance(self.qk_norm, bool):
            raise ValueError(f"qk_norm must be True or False, got {self.qk_norm!r}")
        if not isinstance(self.output_gate, bool):
            raise ValueError(f"output_gate must be True or False, got {self.output_gate!r}")
        given = self._given_options()
        object.__setattr__(self, "options", {**normalizer.options, **given})
        for key in OPTION_KEYS:  # mirrors of the resolved options (None where the normaliser has no such option)
            object.__setattr__(self, key, self.options.get(key))
        normalizer.check_spec(self)

    def _given_options(self) -> dict[str, Any]:
        """The options given, by `options` and by their own keys; one option given twice must agree."""
        if self.options is not None and not (
            isinstance(self.options, dict) and all(isinstance(k, str) for k in self.options)
        ):
            raise ValueError(f"options must map option names to values, got {self.options!r}")
        given = dict(self.options or {})
        for key in OPTION_KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if key in given and given[key] != value:
                raise ValueError(f"{key} is given twice, {key}={value!r} and options[{key!r}]={given[key]!r}")
            given[key] = value
        return given

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A spec pickled before normalisers declared their options (a checkpoint's hyperparameters) has no
        # `options` and every built-in option at its old default: keep those of its own normaliser.
        if state.get("options") is None:
            declared = normalizer_class(state["normalizer"]).options
            kept = {k: state[k] for k in OPTION_KEYS if k in declared and state.get(k) is not None}
            state = {**state, **dict.fromkeys(OPTION_KEYS), "options": kept}
        # A spec pickled before the output gate existed has no `output_gate`: it ran without one.
        self.__dict__.update({"output_gate": False, **state})
        self.__post_init__()

    def __hash__(self) -> int:  # `options` is a dict: hash its items
        return hash((self.normalizer, self.temperature, self.top_k, self.layers, self.learnable,
                     tuple(sorted(self.options.items())), self.qk_norm, self.output_gate))

    @property
    def is_stock_softmax(self) -> bool:
        """True when the layer computes plain (temperature-scaled) softmax over all visible keys.

        Such layers run on PyTorch's fused SDPA kernel with the temperature folded into its scale (with
        ``qk_norm``, on the normalised q and k).
        """
        return self.normalizer == "softmax" and self.top_k is None

    def applies_to(self, layer: int | None) -> bool:
        return self.layers is None or layer is None or layer in self.layers

    def as_hparams(self) -> dict[str, object]:
        """Flat, TensorBoard-friendly hyperparameters (HParams needs scalars: top-k is "all" or the k as text)."""
        hparams: dict[str, object] = {
            "normalizer": self.normalizer,
            "temperature": self.temperature,
            "top_k": top_k_hparam(self.top_k),
            "layers": "all" if self.layers is None else ",".join(map(str, self.layers)),
            "learnable": self.is_learnable,
            "qk_norm": self.qk_norm,
            "output_gate": self.output_gate,
        }
        # the normaliser's own options, each a column of its own (a value HParams cannot show becomes its repr)
        for key, value in self.options.items():
            hparams[key] = value if isinstance(value, (bool, int, float, str)) else repr(value)
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
