"""The normaliser registry: the `Normalizer` base class and the table of names `AttentionSpec` accepts.

This module sits at the bottom of `study.attention`: `normalizers` (the built-ins) and `spec` (validation) both
import it, and it imports neither. A user-defined normaliser is a `Normalizer` subclass registered here:

    @register_normalizer
    class Capped(Normalizer):
        name = "capped"
        def forward(self, scores, allowed, visible=None): ...

after which ``AttentionSpec(normalizer="capped")`` works everywhere a built-in name does (apply_attention_spec,
`attend`, the monitors, `study analyze` on a model carrying it). Processes that never ran the registering code
(a ``study fit`` CLI, spawned DDP workers, a checkpoint loaded elsewhere) can name the class by import path
instead, ``"my_package.my_module:Capped"``: the first lookup imports it and registers it under that path.
"""

from __future__ import annotations

import importlib
from dataclasses import fields
from types import MappingProxyType
from typing import ClassVar

import torch
from torch import Tensor, nn

# Finite stand-in for -inf: -inf gives NaN on rows with no allowed key (exp(-inf - -inf)).
MASK_VALUE = torch.finfo(torch.float32).min

# Spec fields that only some normalisers read; the others require the default (see `Normalizer.check_spec`).
SPEC_OPTIONS = ("alpha", "ssmax_scale", "self_adjust_variant")


class Normalizer(nn.Module):
    """Base class of row normalisers; subclasses set `name` and implement `forward`.

    The contract of ``forward(scores, allowed, visible=None) -> weights``:

    - ``scores``: fp32, (B, H, Lq, Lk), already multiplied by ``scaling / T``.
    - ``allowed``: bool, broadcastable to ``scores``; True where the query may attend (causal, padding and top-k
      selection folded in). A row may have no allowed key at all (a padded query): its weights must be all zero,
      never NaN.
    - ``visible``: bool, broadcastable to ``scores``: the mask before top-k selection, i.e. the keys the query
      could see (None means ``allowed``). Only normalisers that depend on the context length read it.
    - ``weights``: same shape as ``scores``, zero wherever ``allowed`` is False.

    Class attributes:
        options: the `AttentionSpec` option fields this normaliser reads (alpha, ssmax_scale, ...).
        has_parameters: whether ``spec.learnable = True`` means anything.
        learnable_by_default: what ``spec.learnable = None`` resolves to.
        sums_to_one: whether every row with an allowed key sums to 1 (monitors that treat a row as a
            distribution read this flag).
    """

    name: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()
    has_parameters: ClassVar[bool] = False
    learnable_by_default: ClassVar[bool] = False
    sums_to_one: ClassVar[bool] = True

    @classmethod
    def check_spec(cls, spec) -> None:
        """Reject spec combinations this normaliser cannot take (raise ValueError naming the value).

        The base check rejects options meant for another normaliser and ``learnable=True`` without parameters:
        both would otherwise be silently ignored. Subclasses add their own checks after calling it.
        """
        defaults = {f.name: f.default for f in fields(spec)}
        for option in SPEC_OPTIONS:
            value = getattr(spec, option)
            if option not in cls.options and value != defaults[option]:
                raise ValueError(
                    f"{option}={value!r} has no effect with normalizer {cls.name!r}; leave it at its default "
                    f"{defaults[option]!r}"
                )
        if spec.learnable and not cls.has_parameters:
            raise ValueError(f"learnable=True but normalizer {cls.name!r} has no parameters to learn")

    @classmethod
    def from_spec(cls, spec, num_heads: int) -> Normalizer:
        """The module for one attention layer with ``num_heads`` query heads (parameters per head, if any)."""
        return cls()

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        raise NotImplementedError


_REGISTRY: dict[str, type[Normalizer]] = {}

NORMALIZERS = MappingProxyType(_REGISTRY)
"""Read-only view: normaliser name -> class. Add to it with `register_normalizer`."""


def register_normalizer(cls: type[Normalizer], *, name: str | None = None) -> type[Normalizer]:
    """Register a `Normalizer` subclass under ``name`` (default: its ``name`` attribute); returns the class.

    Usable as a class decorator. Registering the same class again is a no-op; another class under a taken name
    is an error (a silent replacement would change what a saved spec means).
    """
    if not (isinstance(cls, type) and issubclass(cls, Normalizer)):
        raise TypeError(f"register_normalizer needs a Normalizer subclass, got {cls!r}")
    name = getattr(cls, "name", None) if name is None else name
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} needs a non-empty string `name` to be registered, got {name!r}")
    if cls.forward is Normalizer.forward:
        raise TypeError(f"{cls.__name__} does not implement forward(scores, allowed, visible=None)")
    bad = set(cls.options) - set(SPEC_OPTIONS)
    if bad:
        raise ValueError(f"{cls.__name__}.options names {sorted(bad)}, which are not AttentionSpec options "
                         f"{list(SPEC_OPTIONS)}; keep a normaliser's own constants on the class")
    if _REGISTRY.get(name, cls) is not cls:
        raise ValueError(f"normalizer name {name!r} is already registered to {_REGISTRY[name].__qualname__}")
    _REGISTRY[name] = cls
    return cls


def normalizer_class(name: str) -> type[Normalizer]:
    """The class registered as ``name``; a ``"module:Class"`` path is imported and registered on first use."""
    cls = _REGISTRY.get(name)
    if cls is not None:
        return cls
    if isinstance(name, str) and ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot import normalizer {name!r}: {err}") from err
        return register_normalizer(cls, name=name)
    raise ValueError(
        f"unknown normalizer {name!r}; choose one of {sorted(_REGISTRY)}, register your own with "
        "study.attention.register_normalizer, or name it as 'module:Class'"
    )


__all__ = ["MASK_VALUE", "NORMALIZERS", "SPEC_OPTIONS", "Normalizer", "normalizer_class", "register_normalizer"]
