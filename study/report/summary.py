"""One `Summary` per run: the numbers the findings, tables and figures use, computed once from its scalars.

A summary is plain data (`values` by name), so tests build synthetic runs directly as `Summary` objects and
the findings never read event files themselves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from study import tags
from study.report import sources
from study.report.read import RunData
from study.report.stats import loglog_slope

SPIKE_FACTOR = 1.5  # a spike: a logged training loss above this x the running median of the losses before it
SPIKE_WINDOW = 5  # the running median: over the last this many logged losses

# names of `Summary.values`
GRAD_NORM = "grad_norm"  # median pre-clip total gradient norm over logged steps
GRAD_QK = "grad_qk"  # median over logged steps of sqrt(|g_Wq|^2 + |g_Wk|^2)
FP64_QK = "fp64_qk"  # step-0 fp32 / fp64 of that norm over every layer (Fp64GradientCheck), None where not run
FP64_LAST_QK = "fp64_last_qk"  # the same for the last layer
FP64_LAYERS = "fp64_layers"  # the per-layer (and group) ratio furthest from 1 (None in runs logged before it)
STEP0_QK = "step0_qk"  # the float64 step-0 sqrt(|g_Wq|^2 + |g_Wk|^2) over every layer (Fp64GradientCheck)
JACOBIAN = "jacobian"  # final validation (else median training) mean attention Jacobian norm
JACOBIAN_MAX = "jacobian_max"  # largest sampled Jacobian norm of the run (train and validation)
ENTRY_RATIO = "entry_ratio_mean"  # final validation mean over sampled rows of the largest Jacobian entry x 4T
ENTRY_RATIO_MAX = "entry_ratio_max"  # its largest value in the run (train and validation): <= 1 by mathematics
NEAR_QUARTER = "frac_near_quarter_T"  # final validation rows whose largest entry is >= 0.9 x 1/(4T)
SATURATED = "frac_saturated"
SATURATED_STEP0 = "saturated_step0"  # validation rows with max weight > 0.99 at step 0 (BaselineValidation)
VAL_LOSS_BASELINE = "val_loss_step0"  # val/loss logged at step 0 (BaselineValidation): the frozen model under T
VAL_SELECTION_STEP0 = "val_selection_step0"  # validation H(top-k)/log k at step 0 (BaselineValidation)
VAL_SELECTION_END = "val_selection_end"  # validation H(top-k)/log k at the last validation after step 0
SELECTION_DRIFT = "selection_drift"  # validation H(top-k)/log k at the end minus at step 0 (`held_out_drift`)
SELECTION_FINAL = "selection_final"  # final training H(top-k)/log k
DILUTION_SLOPE = "dilution_slope"  # log-log slope of the validation max weight against the visible count n
CLIPPED = "clipped_fraction"
SPIKES = "spikes"


def diverged(nonfinite: bool, init_loss: float | None, final_loss: float | None) -> bool:
    """The report's one definition of a diverged run (every table, finding and figure reads it from here).

    A run **diverged** when its loss or gradient went non-finite (the guard stopped it), or its final held-out loss
    is non-finite or above its held-out loss at init (step 0). Every other run is **stable**. A run without both
    losses is judged by non-finiteness alone: there is nothing to compare. Equal to the loss at init is not above it.

    A loss spike or a skipped step is not a divergence: `Summary.unstable` counts those events beside it for the
    instability finding, and a run can be stable and have had one.
    """
    if nonfinite or (final_loss is not None and not math.isfinite(final_loss)):
        return True
    if init_loss is None or final_loss is None or not math.isfinite(init_loss):
        return False
    return final_loss > init_loss


class _Judged(Protocol):
    stable: bool


def largest_stable_lr(by_lr: Mapping[float, Iterable[_Judged]]) -> float | None:
    """The largest learning rate at which every run is stable (`diverged`), None when there is none: one curve
    (one run per learning rate) gives that curve's lr*, a cell of seeds the learning rate every seed survives.
    Summaries and the learning-rate section's runs both pass through here, so their tables cannot disagree."""
    stable = [lr for lr, runs in by_lr.items() if (judged := list(runs)) and all(r.stable for r in judged)]
    return max(stable) if stable else None


@dataclass
class Summary:
    name: str
    temperature: float
    top_k: int | None
    normalizer: str = "softmax"
    seed: int | None = None
    state: str = "finished"
    steps: int | None = None
    clip: float | None = None  # trainer.gradient_clip_val (None: no clipping)
    final: dict[str, float | None] = field(default_factory=dict)  # last logged value per tag
    values: dict[str, float | None] = field(default_factory=dict)
    skipped: int = 0
    reason: str = ""
    run: RunData | None = None  # None for synthetic summaries
    same_as: list[str] = field(default_factory=list)  # runs identical to this one by construction
    selection_by_k: dict[int, float] = field(default_factory=dict)  # final validation H(top-k) (nats) per k
    # median over logged steps of each layer's gradient norm per parameter group (LAYER_GROUPS) -> {layer: norm}
    layer_grads: dict[str, dict[int, float]] = field(default_factory=dict)
    # the float64 step-0 gradient norm of each layer per parameter group (Fp64GradientCheck) -> {layer: norm}
    step0_grads: dict[str, dict[int, float]] = field(default_factory=dict)
    optimizer: str = "adamw"
    learning_rate: float | None = None

    @property
    def nonfinite(self) -> bool:
        """The guard stopped the run on a non-finite loss or gradient (its state, as the sweep records it)."""
        return self.state == "diverged"

    @property
    def diverged(self) -> bool:
        """`diverged` on this run's non-finite state and its held-out loss at step 0 and at the end."""
        return diverged(self.nonfinite, self.values.get(VAL_LOSS_BASELINE), self.final.get(tags.VAL_LOSS))

    @property
    def stable(self) -> bool:
        return not self.diverged

    @property
    def k_label(self) -> str:
        return "all" if self.top_k is None else str(self.top_k)

    @property
    def unstable(self) -> bool:
        """An instability event: diverged, a loss spike or a skipped step (the instability finding's count). Not the
        complement of `stable`, which is "not diverged" alone."""
        return self.diverged or (self.values.get(SPIKES) or 0) > 0 or self.skipped > 0

    def series(self, tag: str) -> list[tuple[int, float]] | None:
        return self.run.series(tag) if self.run is not None else None


def _last(series: list[tuple[int, float]] | None) -> float | None:
    return series[-1][1] if series else None


def _median(series: list[tuple[int, float]] | None) -> float | None:
    values = [v for _, v in series or [] if math.isfinite(v)]
    return float(np.median(values)) if values else None


def count_spikes(series: list[tuple[int, float]] | None) -> int | None:
    """Logged training losses that are non-finite or above SPIKE_FACTOR x the median of the (up to) SPIKE_WINDOW
    finite losses logged before them, from the second logged loss on.

    A running median, not one step-0 batch: a single noisy first batch neither hides later spikes nor makes
    ordinary batch-to-batch noise (about 20% on 2 x 128 tokens) count as one; a jump right after the switch of
    temperature is still judged (against the losses before it).
    """
    if not series:
        return None
    spikes, recent = 0, []
    for _, value in series:
        if not math.isfinite(value):
            spikes += 1
            continue
        if recent and value > SPIKE_FACTOR * float(np.median(recent)):
            spikes += 1
        recent = (recent + [value])[-SPIKE_WINDOW:]
    return spikes


def _qk_series(run: RunData) -> list[tuple[int, float]] | None:
    q, k = run.series(tags.GRAD_Q), dict(run.series(tags.GRAD_K) or [])
    if not q or not k:
        return None
    return [(s, math.hypot(v, k[s])) for s, v in q if s in k]


def _clipped_fraction(run: RunData, grad: list[tuple[int, float]] | None) -> float | None:
    if grad and run.series(tags.GRAD_NORM_CLIPPED):
        after = dict(run.series(tags.GRAD_NORM_CLIPPED))
        pairs = [(v, after[s]) for s, v in grad if s in after]
        return sum(a < v * (1 - 1e-6) for v, a in pairs) / len(pairs) if pairs else None
    if grad:
        clip = run.setting("trainer.gradient_clip_val")
        return (sum(v > float(clip) for _, v in grad) / len(grad)) if clip else 0.0
    return None


def _val_or_train(run: RunData, val_tag: str, train_tag: str | None = None) -> float | None:
    value = _last(run.series(val_tag))
    return value if value is not None or train_tag is None else _median(run.series(train_tag))


def _selection_final(run: RunData) -> float | None:
    """The last training-step H(top-k)/log k at k = sources.SELECTION_K."""
    series = run.series(sources.SELECTION_ENTROPY)
    return series[-1][1] / math.log(sources.SELECTION_K) if series else None


def held_out_drift(values: dict[str, Any]) -> float | None:
    """Validation H(top-k)/log k after the last step minus before the first: the same held-out batches both times
    (training batches differ from step to step, which the drift would read as change). None without both (a run
    that stopped before validating after step 0 has no end value: its step-0 one is not an end)."""
    first, last = values.get(VAL_SELECTION_STEP0), values.get(VAL_SELECTION_END)
    return None if first is None or last is None else last - first


def _at_step0(series: list[tuple[int, float]] | None) -> float | None:
    """The value logged at step 0, if any."""
    return series[0][1] if series and series[0][0] == 0 else None


def _after_step0(series: list[tuple[int, float]] | None) -> float | None:
    """The last value logged after step 0."""
    later = [v for step, v in series or [] if step > 0]
    return later[-1] if later else None


def last_by_group(run: RunData, regex: str) -> dict[int, float]:
    """{int(group 1): last logged value} of every tag matching ``regex`` (e.g. the Lemma 1 bins by n)."""
    out = {}
    for tag, series in run.scalars.items():
        match = re.match(regex, tag)
        if match and series:
            out[int(match.group(1))] = series[-1][1]
    return dict(sorted(out.items()))


LAYER_GROUPS = tags.LAYER_GROUPS  # the per-layer parameter groups (named in study/tags.py)


def layer_gradients(run: RunData, regex: str = tags.GRAD_BLOCK_KIND_REGEX) -> dict[str, dict[int, float]]:
    """{group: {layer: median over logged steps of the group's gradient norm}} from the per-block-and-kind tags
    (``regex``: the training steps' by default, the fp64 check's step-0 ones with `tags.FP64_GRAD_BLOCK_KIND_REGEX`);
    a group's kinds combine as the root of the sum of squares at each step (W_q and W_k: one attention-logit
    norm). Groups a run did not log (frozen MLPs) are absent."""
    by_kind: dict[tuple[int, str], dict[int, float]] = {}
    for tag, series in run.scalars.items():
        match = re.match(regex, tag)
        if match and series:
            by_kind[(int(match.group(1)), match.group(2))] = dict(series)
    out: dict[str, dict[int, float]] = {}
    for group, kinds in LAYER_GROUPS.items():
        for layer in sorted({b for b, _ in by_kind}):
            parts = [by_kind.get((layer, k)) for k in kinds]
            if any(p is None for p in parts):
                continue
            steps = set.intersection(*(set(p) for p in parts))
            combined = [(s, math.sqrt(sum(p[s] ** 2 for p in parts))) for s in sorted(steps)]
            value = _median(combined)
            if value is not None:
                out.setdefault(group, {})[layer] = value
    return out


def _scaled(entropy: float | None, k: int) -> float | None:
    """H(top-k) as a fraction of its maximum, log k."""
    return None if entropy is None else entropy / math.log(k)


def _baseline(series: list[tuple[int, float]] | None) -> float | None:
    """The value logged at step 0 when a later one follows (BaselineValidation's step-0 validation)."""
    if series and len(series) >= 2 and series[0][0] == 0:
        return series[0][1]
    return None


def _values(run: RunData) -> dict[str, Any]:
    grad = next((run.series(t) for t in sources.GRAD_NORM_SOURCES if run.series(t)), None)
    maxima = [_last(run.series(t)) for t in (sources.VAL_JACOBIAN_MAX,)] + [
        v for _, v in run.series(sources.JACOBIAN_MAX) or []
    ]
    maxima = [m for m in maxima if m is not None]
    ratios = [_last(run.series(sources.VAL_ENTRY_RATIO_MAX))] + [v for _, v in run.series(sources.ENTRY_RATIO_MAX) or []]
    ratios = [r for r in ratios if r is not None]
    bins = {n: v for n, v in last_by_group(run, sources.BY_VISIBLE_MAX_WEIGHT).items() if n >= 2}
    return {
        GRAD_NORM: _median(grad),
        GRAD_QK: _median(_qk_series(run)),
        JACOBIAN: _val_or_train(run, sources.VAL_JACOBIAN, sources.JACOBIAN),
        JACOBIAN_MAX: max(maxima) if maxima else None,
        ENTRY_RATIO: _val_or_train(run, sources.ENTRY_RATIO_MEAN),
        ENTRY_RATIO_MAX: max(ratios) if ratios else None,
        NEAR_QUARTER: _val_or_train(run, sources.NEAR_QUARTER_T),
        VAL_LOSS_BASELINE: _baseline(run.series(tags.VAL_LOSS)),
        SATURATED: _val_or_train(run, sources.FRAC_SATURATED),
        SATURATED_STEP0: _baseline(run.series(sources.SATURATED_ROWS)),
        VAL_SELECTION_STEP0: _scaled(_at_step0(run.series(sources.VAL_SELECTION_ENTROPY)), sources.SELECTION_K),
        VAL_SELECTION_END: _scaled(_after_step0(run.series(sources.VAL_SELECTION_ENTROPY)), sources.SELECTION_K),
        SELECTION_FINAL: _selection_final(run),
        DILUTION_SLOPE: loglog_slope(list(bins), list(bins.values())),
        CLIPPED: _clipped_fraction(run, grad),
        SPIKES: count_spikes(run.series(tags.FIXED_BATCH_LOSS) or run.series(tags.TRAIN_LOSS)),
        FP64_QK: _last(run.series(tags.FP64_RATIO_QK)),
        FP64_LAST_QK: _last(run.series(tags.FP64_RATIO_LAST_QK)),
        FP64_LAYERS: _last(run.series(tags.FP64_RATIO_LAYERS_WORST)),
    }


def summarize(run: RunData) -> Summary:
    final_tags = (
        tags.TRAIN_LOSS, tags.VAL_LOSS, tags.VAL_PPL, *sources.ATTENTION_TAGS, sources.NONZERO, sources.SATURATED_ROWS,
        sources.VAL_SELECTION_TV, sources.MAX_LOGIT, sources.SINK_RATE,
    )  # fmt: skip
    clip = run.setting("trainer.gradient_clip_val")
    skipped = int(run.status.get("skipped_steps") or (_last(run.series(tags.GUARD_SKIPPED)) or 0))
    summary = Summary(
        name=run.name,
        temperature=float(run.params.get("temperature", 1.0)),
        top_k=run.params.get("top_k"),
        normalizer=str(run.params.get("normalizer") or run.setting("model.attention.normalizer", "softmax")),
        seed=run.params.get("seed"),
        state=run.state,
        steps=run.status.get("global_step"),
        clip=float(clip) if clip else None,
        final={t: _last(run.series(t)) for t in final_tags},
        values=_values(run),
        skipped=skipped,
        reason=(run.status.get("reason") or "") if run.state != "finished" else "",
        run=run,
        selection_by_k=_selection_by_k(run),
        layer_grads=layer_gradients(run),
        step0_grads=layer_gradients(run, tags.FP64_GRAD_BLOCK_KIND_REGEX),
        optimizer=str(run.params.get("optimizer") or run.setting("model.optimizer", "adamw")),
        learning_rate=_float(run.params.get("learning_rate") or run.setting("model.learning_rate")),
    )
    summary.values[SELECTION_DRIFT] = held_out_drift(summary.values)
    summary.values[STEP0_QK] = whole_network(summary.step0_grads.get("W_q,W_k"))
    return summary


def whole_network(by_layer: dict[int, float] | None) -> float | None:
    """The norm over every layer from the per-layer norms (the root of their sum of squares); None without any."""
    return math.sqrt(sum(v**2 for v in by_layer.values())) if by_layer else None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _selection_by_k(run: RunData) -> dict[int, float]:
    return last_by_group(run, sources.VAL_SELECTION_ENTROPY_BY_K)


def random_init(summary: Summary) -> bool:
    """A run that trains a freshly initialised model (no `model.model_name_or_path`): its step-0 model depends on
    its seed. A summary without its run's data (a test's) counts as fine-tuning."""
    return summary.run is not None and summary.run.setting("model.model_name_or_path") in (None, "", "null")


def baseline_setting(run: RunData) -> tuple[float, Any, str] | None:
    """The setting (T, k, normaliser) whose step-0 validation a fine-tuning run shares with that setting's other
    runs, keyed as `share_baselines` keys it; None for a from-scratch run (its step-0 model depends on its seed)."""
    if run.setting("model.model_name_or_path") in (None, "", "null"):
        return None
    normalizer = str(run.params.get("normalizer") or run.setting("model.attention.normalizer", "softmax"))
    return float(run.params.get("temperature", 1.0)), run.params.get("top_k"), normalizer


def share_baselines(summaries: list[Summary]) -> list[Summary]:
    """Give every fine-tuning run without a step-0 validation the one of a run with the same attention setting (T,
    k, normaliser): the pretrained model before its first update depends on that setting and the validation set
    only, not on the seed or the optimizer, so a sweep validates it once per setting (`BaselineValidation(seed=...)`).
    The step-0 values shared are the validation loss, H(top-k) (from which each run's held-out drift is then
    measured) and the saturated rows' fraction. A from-scratch run's step-0 model depends on its seed: it neither lends nor borrows."""
    shared = [s for s in summaries if not random_init(s)]
    for baseline in (VAL_LOSS_BASELINE, VAL_SELECTION_STEP0, SATURATED_STEP0):
        known: dict[tuple, float] = {}
        for s in shared:
            if s.values.get(baseline) is not None:
                known.setdefault((s.temperature, s.top_k, s.normalizer), s.values[baseline])
        for s in shared:
            if s.values.get(baseline) is None and (key := (s.temperature, s.top_k, s.normalizer)) in known:
                s.values[baseline] = known[key]
    for s in shared:  # the held-out drift is measured from the step-0 value, now known for every run
        if (drift := held_out_drift(s.values)) is not None:
            s.values[SELECTION_DRIFT] = drift
    return summaries


def dedupe(summaries: list[Summary]) -> list[Summary]:
    """Keep one run of each set that is the same function by construction; the others go into `same_as`.

    Softmax with top-1 is a one-hot row whatever T, so top-1 runs that share seed and normaliser compute the same
    forward and backward at every temperature: counting them once per T would pool one measurement as several.
    The kept run is the one with T closest to 1.
    """
    groups: dict[tuple, list[Summary]] = {}
    out = []
    for s in summaries:
        if s.top_k == 1 and s.normalizer == "softmax":
            groups.setdefault((s.seed, s.normalizer), []).append(s)
        else:
            out.append(s)
    for members in groups.values():
        keep = min(members, key=lambda s: abs(math.log(s.temperature)))
        keep.same_as = [m.name for m in members if m is not keep]
        out.append(keep)
    order = {s.name: i for i, s in enumerate(summaries)}
    return sorted(out, key=lambda s: order[s.name])
