"""`EntropyCollapseAlert`: notice, while a run goes on, when a layer's attention entropy collapses.

Zhai et al. 2023 (sigma-reparam, arXiv 2303.06296) find that attention entropy falling towards 0 in some layers
precedes divergence. The entropy monitor logs the curve; this callback watches it: when a layer's normalised
entropy H / log n falls by ``factor`` from that layer's own value at the first measured step (step 0), or, with
``threshold``, below an absolute value, it warns once in the console, writes a TensorBoard text entry, keeps the
event for the run's status.json (`study.sweep.run` reads `events`) and can stop the run.

Relative by default because a low temperature saturates rows before any update (at T = 0.01 most rows of a
pretrained model have a max weight above 0.99 at step 0): an absolute threshold would fire at step 0 there, while
a layer cannot fall from its own start value at its start. A relative fall must also be a real one
(``min_drop``): a layer that starts saturated, with H / log n of a few hundredths, falls by a factor 4 within a
few SGD steps at T = 0.01 (tests/test_callbacks_sinks_collapse.py) while hardly moving at all.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from study import tags
from study.attention import AttentionSpec
from study.attention.rowstats import RowStatistics
from study.callbacks.base import TRAIN, Sums, TapMonitor, call_entropy_sums, tensorboard_writers
from study.callbacks.layers import LayerChoice
from study.metrics import finalize, row_entropy_sums

ACTIONS = ("warn", "stop")


class EntropyCollapseAlert(TapMonitor):
    """Alert on a layer whose normalised attention entropy collapses during training.

    On the training steps it taps (every ``every_n_steps``), a layer's value is the mean over its heads of the
    mean H / log n over rows (as ``attention/normalized_entropy/layer_{l}`` of `AttentionEntropyMonitor`). A layer
    collapses at the first measured step where that value is below its value at the first measured step divided
    by ``factor`` and at least ``min_drop`` below it (or, with ``threshold``, below ``threshold``). Each layer's collapse is one event, recorded once:
    ``{"layer", "step", "value", "reference", "rule"}``.

    On an event: one console warning (the first event of the run, naming each layer collapsing at that step, its
    value and reference), a TensorBoard text entry ``alerts/entropy_collapse`` per step with events, the scalar
    ``alerts/entropy_collapse_layers`` (how many layers have collapsed so far, at every measured step: 0 until
    one does) and, with ``action="stop"``, the end of the fit after that step (`study sweep` records the run as
    "collapsed", a result of its own, with the event as its reason). Under DDP every rank sees the same reduced values and stops together.

    Args:
        every_n_steps: measure every this many optimizer steps (step 0 included: the reference).
        factor: the relative rule: collapse when the value falls below reference / factor (> 1) ...
        min_drop: ... and by at least this much (normalised entropy is in [0, 1]; default 0.1).
        threshold: the absolute rule instead: collapse when the value falls below this (in (0, 1)). Fires at step 0
            on a run whose rows start saturated (T = 0.01).
        action: "warn" (default) or "stop".
        layers: the layers to watch (indices, negative from the end, and "mid"); None (default) every layer.

    Example::

        trainer = L.Trainer(callbacks=[EntropyCollapseAlert(every_n_steps=10, factor=4, action="stop")])
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        factor: float = 4.0,
        min_drop: float = 0.1,
        threshold: float | None = None,
        action: str = "warn",
        layers: LayerChoice = None,
    ) -> None:
        super().__init__(every_n_steps, validation=False, layers=layers)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 1:
            raise ValueError(f"factor must be a number > 1, got {factor!r}")
        if isinstance(min_drop, bool) or not isinstance(min_drop, int | float) or not 0 <= min_drop < 1:
            raise ValueError(f"min_drop must be a number in [0, 1), got {min_drop!r}")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)
                                      or not 0 < threshold < 1):
            raise ValueError(f"threshold must be a number in (0, 1) or null, got {threshold!r}")
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {list(ACTIONS)}, got {action!r}")
        self.factor = float(factor)
        self.min_drop = float(min_drop)
        self.threshold = None if threshold is None else float(threshold)
        self.action = action
        self.reference: dict[int, float] = {}  # each layer's value at its first measured step
        self.events: list[dict[str, Any]] = []
        self._warned = False

    @property
    def rule(self) -> str:
        if self.threshold is not None:
            return f"below {self.threshold:g}"
        return f"fell by {self.factor:g}x" + (f" and by {self.min_drop:g}" if self.min_drop else "")

    row_statistics = frozenset({"entropy"})

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        return call_entropy_sums(weights, allowed, spec)

    def summarize_row_statistics(self, layer: int, rows: RowStatistics, spec: AttentionSpec) -> dict[str, Tensor]:
        return row_entropy_sums(rows.entropy, rows.visible)

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        if phase != TRAIN or not sums:
            return {}
        layers = sorted(sums)
        per_layer = torch.stack([finalize(sums[layer])["normalized_entropy"].nanmean() for layer in layers])
        values = dict(zip(layers, per_layer.tolist()))  # a host read, on this callback's logging steps only
        step = self._window_step if self._window_step is not None else trainer.global_step  # the step being logged
        new = self._check(values, step)
        if new:
            self._announce(trainer, new, step)
        collapsed = {e["layer"] for e in self.events}
        return {tags.ENTROPY_COLLAPSE_LAYERS: torch.tensor(float(len(collapsed)))}

    def _check(self, values: dict[int, float], step: int) -> list[dict[str, Any]]:
        """The layers that collapse at this step (not before), and the references of layers seen for the first time."""
        collapsed = {e["layer"] for e in self.events}
        new = []
        for layer, value in values.items():
            if not math.isfinite(value):
                continue
            reference = self.reference.setdefault(layer, value)
            limit = self.threshold if self.threshold is not None else min(reference / self.factor, reference - self.min_drop)
            if layer not in collapsed and value < limit:
                new.append({"layer": layer, "step": step, "value": value, "reference": reference, "rule": self.rule})
        self.events.extend(new)
        return new

    def _announce(self, trainer: L.Trainer, new: list[dict[str, Any]], step: int) -> None:
        lines = [f"layer {e['layer']}: normalised entropy {e['value']:.4g} at step {e['step']} "
                 f"(step-0 value {e['reference']:.4g}; {e['rule']})" for e in new]
        if not self._warned:
            self._warned = True
            stop = "; stopping the run" if self.action == "stop" else ""
            rank_zero_warn("attention entropy collapse: " + "; ".join(lines) + stop
                           + " (EntropyCollapseAlert warns once; later events go to TensorBoard and status.json)")
        for writer in tensorboard_writers(trainer):
            writer.add_text(tags.ENTROPY_COLLAPSE_TEXT, "  \n".join(lines), step)
        if self.action == "stop":
            trainer.should_stop = True

    @property
    @override
    def state_key(self) -> str:
        # two alerts with different rules in one trainer keep their own references in a checkpoint
        return self._generate_state_key(factor=self.factor, min_drop=self.min_drop, threshold=self.threshold,
                                        layers=self.layers)

    def status_events(self) -> list[dict[str, Any]]:
        """The events so far, as the run's status.json records them."""
        return [dict(e) for e in self.events]

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "reference": dict(self.reference), "events": self.status_events(),
                "warned": self._warned}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.reference = {int(k): float(v) for k, v in state_dict.get("reference", {}).items()}
        self.events = [dict(e) for e in state_dict.get("events", [])]
        self._warned = bool(state_dict.get("warned", False))


__all__ = ["ACTIONS", "EntropyCollapseAlert"]
