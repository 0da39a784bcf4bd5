"""The normaliser registry: the `Normalizer` base class and the table of names `AttentionSpec` accepts.

This module sits at the bottom of `study.attention`: `normalizers` (the built-ins) and `spec` (validation) both
import it, and it imports neither. A user-defined normaliser is a `Normalizer` subclass registered here:

    @register_normalizer
    class Capped(Normalizer):
        name = "capped"
        options = {"cap": 5.0}                      # its own option and the default
        @classmethod
        def from_spec(cls, spec, num_heads):
            return cls(spec.options["cap"])
        def forward(self, scores, allowed, visible=None): ...

after which ``AttentionSpec(normalizer="capped", options={"cap": 3.0})`` works everywhere a built-in name does
(apply_attention_spec, `attend`, the monitors, `study analyze` on a model carrying it). The built-ins register
the same way (`study.attention.normalizers`). Processes that never ran the registering code
(a ``study fit`` CLI, spawned DDP workers, a checkpoint loaded elsewhere) can name the class by import path
instead, ``"my_package.my_module:Capped"``: the first lookup imports it and registers it under that path.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import torch
from torch import Tensor, nn

# Finite stand-in for -inf: -inf gives NaN on rows with no allowed key (exp(-inf - -inf)).
MASK_VALUE = torch.finfo(torch.float32).min


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
        options: the normaliser's own options, name -> default. ``AttentionSpec(options={...})`` sets them (YAML:
            ``model.attention.options``); `from_spec` reads them, complete with defaults, from ``spec.options``.
            A value must have its default's type (a finite number for a number, a string for a string, a bool
            for a bool); `check_spec` adds the normaliser's own checks.
        has_parameters: whether ``spec.learnable = True`` means anything.
        learnable_by_default: what ``spec.learnable = None`` resolves to.
        sums_to_one: whether every row with an allowed key sums to 1 (monitors that treat a row as a
            distribution read this flag).
    """

    name: ClassVar[str]
    options: ClassVar[Mapping[str, object]] = MappingProxyType({})
    has_parameters: ClassVar[bool] = False
    learnable_by_default: ClassVar[bool] = False
    sums_to_one: ClassVar[bool] = True

    @classmethod
    def check_spec(cls, spec) -> None:
        """Reject spec combinations this normaliser cannot take (raise ValueError naming the value).

        ``spec.options`` holds every option of this normaliser (defaults filled in) and those the spec was given.
        The base check rejects options this normaliser does not declare, values of another type than the
        option's default, and ``learnable=True`` without parameters: each would otherwise be silently ignored or
        fail later. Subclasses add their own checks after calling it.
        """
        named = spec.normalizer  # as the spec names it (a registered name or a "module:Class" path)
        for option, value in spec.options.items():
            if option not in cls.options:
                takes = f"its options are {sorted(cls.options)}" if cls.options else "it takes no options"
                raise ValueError(f"{option}={value!r} has no effect with normalizer {named!r}; {takes}")
            problem = _type_problem(cls.options[option], value)
            if problem:
                raise ValueError(f"{option} of normalizer {named!r} must be {problem}, got {value!r}")
        if spec.learnable and not cls.has_parameters:
            raise ValueError(f"learnable=True but normalizer {named!r} has no parameters to learn")

    @classmethod
    def from_spec(cls, spec, num_heads: int) -> Normalizer:
        """The module for one attention layer with ``num_heads`` query heads (parameters per head, if any)."""
        return cls()

    def add_per_head(self, name: str, value: float, num_heads: int, learnable: bool) -> None:
        """Store ``value`` for each of ``num_heads`` heads as ``self.<name>`` (shape (H,)): a parameter that trains
        when ``learnable``, else a fixed buffer; either way it is saved in the state dict."""
        initial = torch.full((num_heads,), float(value))
        if learnable:
            setattr(self, name, nn.Parameter(initial))
        else:
            self.register_buffer(name, initial)

    def forward(self, scores: Tensor, allowed: Tensor, visible: Tensor | None = None) -> Tensor:
        raise NotImplementedError


def _type_problem(default: object, value: object) -> str | None:
    """What ``value`` should be, given the option's ``default``, or None when it fits (ints pass for floats)."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "True or False"
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return "a finite number"
        if isinstance(default, int) and not isinstance(value, int):
            return "an integer"
        return None
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    return None


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
    if not isinstance(cls.options, Mapping) or not all(isinstance(k, str) and k for k in cls.options):
        raise TypeError(f"{cls.__name__}.options must map option names to their defaults, e.g. "
                        f"{{'alpha': 1.5}}, got {cls.options!r}")
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


__all__ = ["MASK_VALUE", "NORMALIZERS", "Normalizer", "normalizer_class", "register_normalizer"]
