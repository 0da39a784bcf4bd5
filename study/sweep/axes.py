"""The axes a sweep's grid may vary, declared once.

Everything the sweep does with a grid value reads it from here: which `study fit` option it sets, what it is called
in the HParams table, its part of the run's folder name, how a value is checked (before any run starts), when two
values are the same setting, and the value a run gets when the grid leaves the axis out (the base config's).

Adding an axis is one entry in `AXES` (and, if the report should group runs by it, one place in `study.report`):
the spec's `grid:` accepts it, runs get its option, its folder-name part and its HParams column.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from study import tags
from study.report.read import dotted_get


def exact(value: float) -> str:
    """The shortest text that reads back as exactly this float (1.0 -> "1", 0.1234561 -> "0.1234561").

    Run names must not round: with 6 significant digits two temperatures shared a folder, and the second run
    "resumed" the first one's finished checkpoint.
    """
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _attention_check(field: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        from study.attention import AttentionSpec  # the spec's own validation: one rule for a sweep and a run

        AttentionSpec(**{field: value})

    return check


def _top_k_hparam(value: Any) -> str:
    from study.attention.spec import top_k_hparam  # the module's own label: "all" or the k

    return top_k_hparam(value)


def _seed_check(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"seed must be a non-negative integer, got {value!r}")


def _optimizer_check(value: Any) -> None:
    from study.model import OPTIMIZERS  # the module's own list: one rule for a sweep and a run

    if value not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {value!r}")


def _temperature_in_check(value: Any) -> None:
    from study.model import TEMPERATURE_IN  # the module's own list: one rule for a sweep and a run

    if value not in TEMPERATURE_IN:
        raise ValueError(f"temperature_in must be one of {TEMPERATURE_IN}, got {value!r}")


def _positive_check(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class Axis:
    """One dimension of a sweep's grid."""

    key: str  # its name under the spec's `grid:`
    option: str  # the `study fit` option it sets
    hparam: str  # its column in TensorBoard's HParams (as `CausalLMModule.hparam_summary` names it)
    label: Callable[[Any], str]  # its part of a run's folder name; distinct values give distinct parts
    check: Callable[[Any], None]  # raises ValueError on a value a run would refuse
    default: Any = None  # the value when neither the grid nor the base config sets it
    numeric: bool = True  # 1 and 1.0 are the same setting
    always_named: bool = True  # part of every run's name (False: only when the grid varies it)
    hparam_label: Callable[[Any], bool | int | float | str] | None = None  # its HParams value, when not the value

    def base_value(self, base_config: dict) -> Any:
        """The value a run gets when the grid leaves this axis out: the base config's, else the default."""
        value = dotted_get(base_config, self.option)
        return self.default if value is None else value

    def same(self, value: Any) -> Any:
        """What makes two grid values one setting."""
        if self.numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
            return ("number", float(value))
        return ("value", json.dumps(value))

    def hparam_value(self, value: Any) -> bool | int | float | str:
        """The value as the run's HParams session shows it (`CausalLMModule.hparam_summary`)."""
        if self.hparam_label is not None:
            return self.hparam_label(value)
        return 0 if value is None else value  # HParams has no null


AXES: tuple[Axis, ...] = (
    Axis("temperature", "model.attention.temperature", tags.attention_hparam("temperature"), lambda v: f"T{exact(v)}",
         _attention_check("temperature"), default=1.0),
    Axis("top_k", "model.attention.top_k", tags.attention_hparam("top_k"), lambda v: f"k{'all' if v is None else v}",
         _attention_check("top_k"), hparam_label=_top_k_hparam),
    Axis("normalizer", "model.attention.normalizer", tags.attention_hparam("normalizer"), str, _attention_check("normalizer"),
         default="softmax", numeric=False),
    Axis("seed", "seed_everything", "seed", lambda v: f"s{v}", _seed_check, default=0),
    Axis("learning_rate", "model.learning_rate", "learning_rate", lambda v: f"lr{exact(v)}", _positive_check,
         always_named=False),
    Axis("optimizer", "model.optimizer", "optimizer", str, _optimizer_check, default="adamw", numeric=False,
         always_named=False),
    Axis("qk_norm", "model.attention.qk_norm", tags.attention_hparam("qk_norm"), lambda v: "qkn" if v else "noqkn",
         _attention_check("qk_norm"), default=False, numeric=False, always_named=False),
    Axis("temperature_in", "model.temperature_in", "temperature_in", lambda v: f"Tin{v}", _temperature_in_check,
         default="softmax", numeric=False, always_named=False),
    Axis("output_gate", "model.attention.output_gate", tags.attention_hparam("output_gate"),
         lambda v: "gate" if v else "nogate", _attention_check("output_gate"), default=False, numeric=False,
         always_named=False),
)  # fmt: skip
"""Run names join the labels in this order: T0.1_k4_softmax_s0 (then lr3e-05, qkn, Tininit, gate when the grid
varies them: the from-scratch sweep's QK-norm arm, init-scale control and gated-attention arm)."""



# Read `AXES` when called, never copied at import: the table is the one place an axis exists (a test can add one).
def grid_keys() -> tuple[str, ...]:
    """The keys the spec's `grid:` accepts, in run-name order."""
    return tuple(axis.key for axis in AXES)


def axis(key: str) -> Axis:
    """The axis named ``key`` under `grid:` (KeyError for an unknown one; the spec checks keys first)."""
    for candidate in AXES:
        if candidate.key == key:
            return candidate
    raise KeyError(key)


def run_name(params: dict[str, Any], swept: set[str] | frozenset[str] = frozenset()) -> str:
    """Folder name of a run from its value on every axis, e.g. T0.1_k4_softmax_s0 (k = all keeps every visible
    key); distinct settings give distinct names."""
    return "_".join(axis.label(params[axis.key]) for axis in AXES if axis.always_named or axis.key in swept)
