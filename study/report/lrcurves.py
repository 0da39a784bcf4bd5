"""Learning-rate curves of the from-scratch study: LR sensitivity, the largest stable LR, and the four pre-registered
findings (docs/findings.md, "Training at a temperature from scratch").

One place for the definitions the findings use:

- a *curve* is one (temperature, arm, seed): its runs at every learning rate of the grid;
- the *loss at init* L0 is the curve's held-out loss at step 0; the *final loss* the last validation's;
- a run **diverged** when it went non-finite (the guard stopped it) or its final loss is above L0, else it is
  **stable**: `study.report.summary.diverged`, the one definition the whole report uses;
- **LR sensitivity** (Wortsman et al. 2023) is mean over the grid of min(L(lr), L0) - min over the grid of the same
  capped losses (a diverged run counts as L0);
- the **largest stable LR** is the largest grid LR whose run is stable (None: below the grid):
  `study.report.summary.largest_stable_lr`, which the findings' learning-rate bracket uses too.

The seed is the unit: every statistic is one number per seed, then a mean over seeds with a t-interval. The
section's six judged statistics are one Bonferroni family at 95%. Inputs are plain `LRRun` records, so tests build
synthetic sweeps; `lr_runs` makes them from the report's `Summary` objects.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from study import tags
from study.atomic import save_figure
from study.report import summary as S
from study.report.stats import (
    Family,
    Interval,
    TooFew,
    family_level,
    fmt,
    least_squares_slope,
    mean_interval,
    percent,
)
from study.report.summary import Summary
from study.report.table import table

ARMS = ("softmax", "qk_norm", "output_gate", "init_scale", "uniform")
SELECTING_ARMS = ("softmax", "qk_norm", "output_gate", "init_scale")  # whose weights read the scores: 3b's "every arm"
"""The from-scratch arms: T divides the logits; the same with QK-norm; the same with the output gate (gated
attention); T folded into the initial W_q, W_k; attention uniform over the visible keys (the control: what the model
reaches without selecting positions)."""
ARM_LABELS = {"softmax": "softmax", "qk_norm": "softmax + QK-norm", "output_gate": "softmax + output gate",
              "init_scale": "init-scale control", "uniform": "uniform attention"}
FAMILY_SIZE = 6  # the judged statistics of docs/findings.md: 1, 2, 3a, 3b, 4a, 4b
MIN_SEEDS = 3  # complete curves a per-seed interval needs
MIN_DIVERGED = 5  # diverged runs finding 3b needs
REFERENCE_T = 1.0


@dataclass(frozen=True)
class LRRun:
    """One run of the learning-rate sweep, as the findings need it."""

    name: str
    temperature: float
    arm: str
    seed: int
    learning_rate: float
    init_loss: float | None  # held-out loss at step 0 (L0)
    final_loss: float | None  # held-out loss at the last validation (None: never validated)
    nonfinite: bool = False  # the guard stopped it on a non-finite loss or gradient
    stop_step: int | None = None  # the step it stopped at (non-finite runs)
    train_loss: tuple[tuple[int, float], ...] = ()
    max_logit: tuple[tuple[int, float], ...] = ()
    collapse_step: int | None = None  # first logged step at which the collapse alert had fired
    collapse_logged: bool = True  # whether the run logged the alert at all (None above means "never fired" only then)

    @property
    def diverged(self) -> bool:
        """`study.report.summary.diverged`: non-finite, or a final held-out loss above the loss at init."""
        return S.diverged(self.nonfinite, self.init_loss, self.final_loss)

    @property
    def stable(self) -> bool:
        return not self.diverged

    @property
    def divergence_step(self) -> int | None:
        """When it diverged: the guard's stop, else the first logged step >= 1 whose training loss exceeds L0,
        else its last logged step; None for a stable run."""
        if not self.diverged:
            return None
        if self.nonfinite and self.stop_step is not None:
            return self.stop_step
        if self.init_loss is not None:
            for step, value in self.train_loss:
                if step >= 1 and (not math.isfinite(value) or value > self.init_loss):
                    return step
        return self.train_loss[-1][0] if self.train_loss else self.stop_step

    @property
    def collapse_before_divergence(self) -> bool:
        step = self.divergence_step
        return self.collapse_step is not None and step is not None and self.collapse_step < step


def lr_sensitivity(losses: Sequence[float | None], init_loss: float) -> float:
    """Wortsman et al.'s LR sensitivity of one curve: mean of min(L, L0) over the grid minus the smallest of those
    (a non-finite or missing L counts as L0)."""
    capped = [min(x, init_loss) if x is not None and math.isfinite(x) else init_loss for x in losses]
    if not capped:
        raise ValueError("an empty curve has no LR sensitivity")
    return float(np.mean(capped) - min(capped))


@dataclass
class Curve:
    temperature: float
    arm: str
    seed: int
    runs: dict[float, LRRun] = field(default_factory=dict)  # by learning rate

    @property
    def init_loss(self) -> float | None:
        values = [r.init_loss for r in self.runs.values() if r.init_loss is not None and math.isfinite(r.init_loss)]
        return float(np.median(values)) if values else None  # the same model at every LR: one value, logged per run

    def sensitivity(self) -> float | None:
        l0 = self.init_loss
        if l0 is None:
            return None
        return lr_sensitivity([None if r.nonfinite else r.final_loss for _, r in sorted(self.runs.items())], l0)

    def largest_stable(self) -> float | None:
        return S.largest_stable_lr({lr: [r] for lr, r in self.runs.items()})


@dataclass
class Curves:
    grid: list[float]  # every learning rate of the sweep
    temperatures: list[float]
    complete: dict[tuple[float, str, int], Curve]  # (T, arm, seed) -> a curve with every LR of the grid
    incomplete: list[Curve]

    def seeds(self, arm: str, temperatures: Sequence[float] | None = None) -> list[int]:
        """Seeds with a complete curve of ``arm`` at every one of ``temperatures`` (default: all of them)."""
        temps = self.temperatures if temperatures is None else temperatures
        seeds = {seed for (_, a, seed) in self.complete if a == arm}
        return sorted(s for s in seeds if all((t, arm, s) in self.complete for t in temps))

    def curve(self, temperature: float, arm: str, seed: int) -> Curve:
        return self.complete[(temperature, arm, seed)]


def gather(runs: Sequence[LRRun]) -> Curves:
    grid = sorted({r.learning_rate for r in runs})
    by_key: dict[tuple[float, str, int], Curve] = {}
    for r in runs:
        curve = by_key.setdefault((r.temperature, r.arm, r.seed), Curve(r.temperature, r.arm, r.seed))
        curve.runs[r.learning_rate] = r
    complete = {k: c for k, c in by_key.items() if set(c.runs) == set(grid) and c.init_loss is not None}
    incomplete = [c for k, c in by_key.items() if k not in complete]
    return Curves(grid, sorted({r.temperature for r in runs}), complete, incomplete)


@dataclass(frozen=True)
class LRFinding:
    key: str  # "1", "2", "3a", "3b", "4a", "4b"
    claim: str
    statistic: str
    value: str
    verdict: str
    rule: str
    interval: Interval | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: getattr(self, k) for k in ("key", "claim", "statistic", "value", "verdict", "rule")}
        if self.interval is not None:
            i = self.interval
            out["interval"] = {"estimate": i.estimate, "lo": i.lo, "hi": i.hi, "n": i.n, "level": i.level}
        return out


def sign_verdict(interval: Interval, direction: int) -> str:
    """'supported' when the interval lies on the claimed side of 0 (direction +1: above), 'not supported' when it
    lies on the other side, else 'inconclusive'."""
    lo, hi = (interval.lo, interval.hi) if direction > 0 else (-interval.hi, -interval.lo)
    if lo > 0:
        return "supported"
    if hi < 0:
        return "not supported"
    return "inconclusive"


def interval_finding(key: str, claim: str, statistic: str, values: list[float], direction: int, rule: str,
                     what: str = "seeds") -> LRFinding:
    """A finding on the mean of per-seed ``values`` (the seed as the unit): its t-interval, judged by its sign in
    ``direction`` (`sign_verdict`); underpowered with fewer than `MIN_SEEDS` seeds or too few values."""
    try:
        interval = mean_interval(values, what)
    except TooFew as err:
        return LRFinding(key, claim, statistic, f"too few: {err}", "underpowered", rule)
    if len(values) < MIN_SEEDS:
        return LRFinding(key, claim, statistic, f"{interval} ({len(values)} {what}, need {MIN_SEEDS})", "underpowered",
                         rule, interval)
    return LRFinding(key, claim, statistic, f"{interval} ({len(values)} {what})", sign_verdict(interval, direction),
                     rule, interval)


def finding_sensitivity_vs_t(curves: Curves) -> LRFinding:
    seeds = curves.seeds("softmax")
    slopes = [least_squares_slope(np.log10(curves.temperatures), [curves.curve(t, "softmax", s).sensitivity() for t in curves.temperatures])
              for s in seeds] if len(curves.temperatures) >= 2 else []
    return interval_finding(
        "1", "LR sensitivity rises as T falls (softmax, from scratch)", "per-seed slope of LR sensitivity vs log10 T",
        slopes, -1, "supported if the interval < 0; not supported if > 0")


def sign_test(below: int, above: int, alpha: float) -> tuple[str, float | None]:
    """Exact one-sided sign test over untied pairs: (verdict, p of the claimed direction)."""
    from scipy.stats import binomtest

    n = below + above
    if n == 0 or 0.5**n > alpha:
        return "underpowered", None
    p_claim = float(binomtest(below, n, 0.5, alternative="greater").pvalue)
    p_reverse = float(binomtest(above, n, 0.5, alternative="greater").pvalue)
    if p_claim <= alpha:
        return "supported", p_claim
    if p_reverse <= alpha:
        return "not supported", p_claim
    return "inconclusive", p_claim


def finding_largest_stable_lr(curves: Curves, alpha: float) -> LRFinding:
    claim = "the largest stable LR falls with T (softmax, from scratch)"
    rule = (f"exact one-sided sign test over untied seeds at p <= {fmt(alpha)}: lr*(lowest T) < lr*(T=1); "
            "underpowered when a perfect count could not reach it")
    if REFERENCE_T not in curves.temperatures or len(curves.temperatures) < 2:
        return LRFinding("2", claim, "sign test", "no T = 1 and lower T in the grid", "underpowered", rule)
    low = min(curves.temperatures)
    seeds = curves.seeds("softmax", [low, REFERENCE_T])
    below = above = ties = 0
    floor = curves.grid[0] / math.sqrt(10)  # below the grid: half a decade under its smallest LR
    for s in seeds:
        a = curves.curve(low, "softmax", s).largest_stable() or floor
        b = curves.curve(REFERENCE_T, "softmax", s).largest_stable() or floor
        below, above, ties = below + (a < b), above + (a > b), ties + (a == b)
    verdict, p = sign_test(below, above, alpha)
    value = f"{below} of {below + above} untied seeds lower at T={fmt(low)} ({ties} tied); p = {fmt(p)}"
    exponent = _stable_lr_exponent(curves, seeds)
    return LRFinding("2", claim, "lr*(lowest T) vs lr*(T=1), per seed", f"{value}; exponent {exponent}", verdict, rule)


def _stable_lr_exponent(curves: Curves, seeds: list[int]) -> str:
    """Mean per-seed slope of log10 lr* against log10 T, when no lr* is censored at a grid end."""
    values = {(t, s): curves.curve(t, "softmax", s).largest_stable() for t in curves.temperatures for s in seeds
              if (t, "softmax", s) in curves.complete}
    if any(v is None or v == curves.grid[-1] for v in values.values()):
        return "not resolved by the grid (lr* censored at a grid end)"
    slopes = [least_squares_slope(np.log10(curves.temperatures), [math.log10(values[(t, s)]) for t in curves.temperatures])
              for s in seeds if all((t, s) in values for t in curves.temperatures)]
    try:
        return str(mean_interval(slopes, "seeds"))
    except TooFew as err:
        return f"too few ({err})"


def reference_lr(curves: Curves) -> float | None:
    """The largest grid LR stable at every T in every seed (softmax), else the smallest LR of the grid."""
    keys = [k for k in curves.complete if k[1] == "softmax"]
    if not keys:
        return None
    stable_everywhere = [lr for lr in curves.grid if all(curves.complete[k].runs[lr].stable for k in keys)]
    return max(stable_everywhere) if stable_everywhere else curves.grid[0]


def logit_growth(run: LRRun) -> float | None:
    """log10(max logit at the last logged step / at step 0); None without both."""
    if len(run.max_logit) < 2 or run.max_logit[0][0] != 0:
        return None
    first, last = run.max_logit[0][1], run.max_logit[-1][1]
    if not (first > 0 and last > 0 and math.isfinite(first) and math.isfinite(last)):
        return None
    return math.log10(last / first)


def finding_logit_growth(curves: Curves) -> LRFinding:
    claim = "at a fixed LR the max attention logit grows faster at lower T (softmax, from scratch)"
    statistic = "per-seed slope of log10(max logit final / step 0) vs log10 T, at the reference LR"
    rule = "supported if the interval < 0; not supported if > 0"
    lr = reference_lr(curves)
    if lr is None or len(curves.temperatures) < 2:
        return LRFinding("3a", claim, statistic, "no complete softmax curves", "underpowered", rule)
    slopes = []
    for s in curves.seeds("softmax"):
        growth = [logit_growth(curves.curve(t, "softmax", s).runs[lr]) for t in curves.temperatures]
        if all(g is not None for g in growth):
            slopes.append(least_squares_slope(np.log10(curves.temperatures), growth))
    if not slopes:
        return LRFinding("3a", claim, statistic, "max logit not logged (AttentionLogitMonitor)", "underpowered", rule)
    finding = interval_finding("3a", claim, statistic, slopes, -1, rule)
    return LRFinding(finding.key, claim, statistic, f"{finding.value}; reference LR {fmt(lr)}", finding.verdict,
                     rule, finding.interval)


def clopper_pearson(events: int, n: int, level: float) -> tuple[float, float]:
    from scipy.stats import binomtest

    ci = binomtest(events, n).proportion_ci(level, method="exact")
    return float(ci.low), float(ci.high)


def finding_collapse_precedes_divergence(runs: Sequence[LRRun], level: float) -> LRFinding:
    claim = "divergences are preceded by entropy collapse (from scratch, every arm whose weights read the scores)"
    statistic = "diverged runs whose collapse alert fired before the divergence step, of all diverged runs"
    rule = f"Clopper-Pearson interval > 1/2: supported; < 1/2: not supported; fewer than {MIN_DIVERGED} diverged: underpowered"
    # Uniform rows keep H/log n = 1, so their alert cannot fire: counting their divergences would pull the
    # fraction towards 0 by construction.
    logged = [r for r in runs if r.collapse_logged and r.arm in SELECTING_ARMS]
    if not logged:
        return LRFinding("3b", claim, statistic, "collapse alert not logged (EntropyCollapseAlert)", "underpowered", rule)
    diverged = [r for r in logged if r.diverged]
    stable = [r for r in logged if r.stable]
    k = sum(r.collapse_before_divergence for r in diverged)
    control = sum(r.collapse_step is not None for r in stable)
    value = f"{k} of {len(diverged)}; control: {control} of {len(stable)} stable runs collapsed"
    if len(diverged) < MIN_DIVERGED:
        return LRFinding("3b", claim, statistic, value, "underpowered", rule)
    lo, hi = clopper_pearson(k, len(diverged), level)
    interval = Interval(k / len(diverged), lo, hi, len(diverged), level)
    verdict = "supported" if lo > 0.5 else "not supported" if hi < 0.5 else "inconclusive"
    return LRFinding("3b", claim, statistic, f"{interval}: {value}", verdict, rule, interval)


def _qk_difference(curves: Curves, temperature: float, seed: int) -> float | None:
    a, b = curves.complete.get((temperature, "softmax", seed)), curves.complete.get((temperature, "qk_norm", seed))
    if a is None or b is None or a.sensitivity() is None or b.sensitivity() is None:
        return None
    return a.sensitivity() - b.sensitivity()


def findings_qk_norm(curves: Curves) -> list[LRFinding]:
    low = min(curves.temperatures) if curves.temperatures else None
    seeds = sorted({s for (_, _, s) in curves.complete})
    at_low = [d for s in seeds if low is not None and (d := _qk_difference(curves, low, s)) is not None]
    dod = []
    for s in seeds:
        if low is None or low == REFERENCE_T:
            break
        d_low, d_ref = _qk_difference(curves, low, s), _qk_difference(curves, REFERENCE_T, s)
        if d_low is not None and d_ref is not None:
            dod.append(d_low - d_ref)
    return [
        interval_finding("4a", f"QK-norm lowers LR sensitivity at low T (T={fmt(low)})",
                          "per-seed S(softmax) - S(QK-norm) at the lowest T", at_low, +1,
                          "supported if the interval > 0; not supported if < 0"),
        interval_finding("4b", "QK-norm helps more at low T than at T = 1 (difference of differences)",
                          "per-seed [S(softmax) - S(QK-norm)] at the lowest T minus the same at T = 1", dod, +1,
                          "supported if the interval > 0; not supported if < 0"),
    ]


@dataclass(frozen=True)
class DesignCheck:
    statement: str
    passed: bool
    detail: str


def design_checks(curves: Curves) -> list[DesignCheck]:
    """The T = 1 softmax curve has a basin inside the grid and a failure at the high end (docs/findings.md)."""
    seeds = curves.seeds("softmax", [REFERENCE_T]) if REFERENCE_T in curves.temperatures else []
    if not seeds:
        return [DesignCheck("a complete T = 1 softmax curve", False, "none")]
    mean_loss = {lr: float(np.mean([_capped(curves.curve(REFERENCE_T, "softmax", s), lr) for s in seeds]))
                 for lr in curves.grid}
    best = min(mean_loss, key=mean_loss.get)
    top_diverged = sum(curves.curve(REFERENCE_T, "softmax", s).runs[curves.grid[-1]].diverged for s in seeds)
    return [
        DesignCheck("basin: the best LR at T = 1 lies inside the grid", curves.grid[0] < best < curves.grid[-1],
                    f"best mean final loss {fmt(mean_loss[best])} at lr {fmt(best)} (grid {fmt(curves.grid[0])}.."
                    f"{fmt(curves.grid[-1])})"),
        DesignCheck("failure: the largest LR diverges at T = 1 in at least half the seeds", 2 * top_diverged >= len(seeds),
                    f"{top_diverged} of {len(seeds)} seeds diverged at lr {fmt(curves.grid[-1])}"),
    ]


def _capped(curve: Curve, lr: float) -> float:
    run, l0 = curve.runs[lr], curve.init_loss
    if run.nonfinite or run.final_loss is None or not math.isfinite(run.final_loss):
        return l0
    return min(run.final_loss, l0)


def lr_findings(runs: Sequence[LRRun]) -> tuple[list[LRFinding], list[DesignCheck], Family]:
    """The six judged statistics (one Bonferroni family) and the design checks; a failed design check makes every
    verdict "underpowered: the grid does not bracket the basin"."""
    curves = gather(runs)
    family = Family(FAMILY_SIZE)
    with family_level(family):
        alpha = 1 - family.level
        found = [
            finding_sensitivity_vs_t(curves),
            finding_largest_stable_lr(curves, alpha),
            finding_logit_growth(curves),
            finding_collapse_precedes_divergence(runs, family.level),
            *findings_qk_norm(curves),
        ]
    checks = design_checks(curves)
    if not all(c.passed for c in checks):
        found = [LRFinding(f.key, f.claim, f.statistic, f.value, "underpowered: the grid does not bracket the basin",
                           f.rule, f.interval) for f in found]
    return found, checks, family


# ---- from the report's summaries -----------------------------------------------------------------------------


def arm_of(summary: Summary) -> str:
    params = summary.run.params if summary.run is not None else {}
    if params.get("qk_norm") or (summary.run is not None and summary.run.setting("model.attention.qk_norm")):
        return "qk_norm"
    if params.get("output_gate") or (summary.run is not None and summary.run.setting("model.attention.output_gate")):
        return "output_gate"  # its own curves: pooled with the softmax arm, a gated run would move its findings
    if (params.get("temperature_in") or (summary.run.setting("model.temperature_in") if summary.run else None)) == "init":
        return "init_scale"
    normalizer = params.get("normalizer") or (summary.run.setting("model.attention.normalizer") if summary.run else None)
    if normalizer == "uniform":
        return "uniform"
    return "softmax"


def _series(summary: Summary, tag: str) -> tuple[tuple[int, float], ...]:
    return tuple(summary.series(tag) or ())


def _init_loss(summary: Summary) -> float | None:
    """The run's own step-0 validation loss: also for a run stopped before any later validation, whose summary has
    none (the report's `share_baselines` would lend it another arm's, whose model at init differs)."""
    val = _series(summary, tags.VAL_LOSS)
    if val and val[0][0] == 0:
        return val[0][1]
    return summary.values.get(S.VAL_LOSS_BASELINE)


def lr_run(summary: Summary) -> LRRun:
    collapse = next((step for step, value in _series(summary, tags.ENTROPY_COLLAPSE_LAYERS) if value > 0), None)
    return LRRun(
        name=summary.name,
        temperature=summary.temperature,
        arm=arm_of(summary),
        seed=int(summary.seed or 0),
        learning_rate=float(summary.learning_rate),
        init_loss=_init_loss(summary),
        final_loss=None if summary.nonfinite else summary.final.get(tags.VAL_LOSS),
        nonfinite=summary.nonfinite,
        stop_step=summary.steps,
        train_loss=_series(summary, tags.TRAIN_LOSS),
        max_logit=_series(summary, tags.MAX_LOGIT),
        collapse_step=collapse,
        collapse_logged=bool(_series(summary, tags.ENTROPY_COLLAPSE_LAYERS)),
    )


def from_scratch(summary: Summary) -> bool:
    """An AdamW run with a learning rate that started from random initialisation (no model to load)."""
    loaded = summary.run.setting("model.model_name_or_path") if summary.run is not None else None
    return summary.learning_rate is not None and summary.optimizer == "adamw" and not loaded


def is_lr_sweep(summaries: Sequence[Summary]) -> bool:
    """A from-scratch learning-rate sweep: runs from random initialisation over at least 3 learning rates."""
    return len({s.learning_rate for s in summaries if from_scratch(s)}) >= 3


# ---- the section: tables, figure, markdown, json ----------------------------------------------------------------


def sensitivity_rows(curves: Curves) -> list[list[str]]:
    rows = []
    for arm in ARMS:
        for t in curves.temperatures:
            keyed = [c for (tt, a, _), c in sorted(curves.complete.items()) if tt == t and a == arm]
            if not keyed:
                continue
            values = [c.sensitivity() for c in keyed]
            try:
                cell = str(mean_interval(values, "seeds"))
            except TooFew:
                cell = f"{fmt(float(np.mean(values)))} (n={len(values)})"
            stable = [c.largest_stable() for c in keyed]
            runs = [r for c in keyed for r in c.runs.values()]
            rows.append([ARM_LABELS[arm], fmt(t), cell, ", ".join(fmt(v) if v else "below grid" for v in stable),
                         f"{sum(r.diverged for r in runs)} of {len(runs)}",
                         f"{sum(r.collapse_step is not None for r in runs)} of {len(runs)}"])
    return rows


def event_rows(runs: Sequence[LRRun]) -> list[list[str]]:
    rows = []
    for r in sorted(runs, key=lambda r: (ARMS.index(r.arm), r.temperature, r.learning_rate, r.seed)):
        if r.diverged or r.collapse_step is not None:
            how = "non-finite" if r.nonfinite else ("final loss above L0" if r.diverged else "stable")
            rows.append([r.name, ARM_LABELS[r.arm], fmt(r.temperature), fmt(r.learning_rate), str(r.seed), how,
                         str(r.divergence_step) if r.diverged else "-",
                         "-" if r.collapse_step is None else str(r.collapse_step)])
    return rows


def draw_lr_curves(curves: Curves, out: Path) -> str | None:
    """Final held-out loss against LR (log x), one panel per arm, one line per T: the mean over seeds of the capped
    loss with its t-interval band, the loss at init dashed."""
    if not curves.complete:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.cm as cm
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if any(k[1] == a for k in curves.complete)]
    fig, axes = plt.subplots(1, len(arms), figsize=(4.2 * len(arms), 3.6), sharey=True, squeeze=False)
    colors = cm.viridis(np.linspace(0, 0.9, max(len(curves.temperatures), 1)))
    for ax, arm in zip(axes[0], arms):
        for color, t in zip(colors, curves.temperatures):
            keyed = [c for (tt, a, _), c in curves.complete.items() if tt == t and a == arm]
            if not keyed:
                continue
            means, los, his = [], [], []
            for lr in curves.grid:
                values = [_capped(c, lr) for c in keyed]
                means.append(float(np.mean(values)))
                try:
                    i = mean_interval(values, "seeds")
                    los.append(i.lo), his.append(i.hi)
                except TooFew:
                    los.append(means[-1]), his.append(means[-1])
            ax.plot(curves.grid, means, "o-", color=color, label=f"T={fmt(t)} ({len(keyed)} seeds)")
            ax.fill_between(curves.grid, los, his, color=color, alpha=0.2)
            ax.axhline(float(np.mean([c.init_loss for c in keyed])), color=color, ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_title(ARM_LABELS[arm])
    axes[0][0].set_ylabel("final held-out loss (diverged = loss at init)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "lr_curves.png", dpi=120)
    plt.close(fig)
    return "Final held-out loss against learning rate, per arm and T (mean over seeds, 95% band; dotted: loss at init)"


def draw_max_logit(curves: Curves, out: Path) -> str | None:
    """Max attention logit against step (softmax arm, seed with the lowest number): at each T, the highest stable
    and the lowest unstable LR."""
    picks = []
    for t in curves.temperatures:
        keyed = sorted((s, c) for (tt, a, s), c in curves.complete.items() if tt == t and a == "softmax")
        if not keyed:
            continue
        curve = keyed[0][1]
        stable = [lr for lr, r in curve.runs.items() if r.stable]
        unstable = [lr for lr, r in curve.runs.items() if r.diverged]
        for lr, kind in ((max(stable) if stable else None, "highest stable"), (min(unstable) if unstable else None, "lowest unstable")):
            if lr is not None and curve.runs[lr].max_logit:
                picks.append((t, lr, kind, curve.runs[lr]))
    if not picks:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for t, lr, kind, run in picks:
        steps, values = zip(*run.max_logit)
        ax.plot(steps, values, "-" if kind == "highest stable" else "--", label=f"T={fmt(t)}, lr {fmt(lr)} ({kind})")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max attention logit (l / T)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "lr_max_logit.png", dpi=120)
    plt.close(fig)
    return "Max attention logit against step: the highest stable (solid) and lowest unstable (dashed) LR per T"


def mechanism_by_lr(curve: Curve) -> dict[str, dict[str, object]]:
    """Per run, what the max-logit growth and the collapse-before-divergence findings read (so that the pooled page
    can judge them from the JSON with this module's definitions): the first and last logged max logit, the
    divergence step (`LRRun.divergence_step`), the first step the collapse alert had fired, whether it was logged."""
    runs = sorted(curve.runs.items())
    return {
        "max_logit_ends_by_lr": {str(lr): [list(r.max_logit[0]), list(r.max_logit[-1])] if r.max_logit else []
                                 for lr, r in runs},
        "divergence_step_by_lr": {str(lr): r.divergence_step for lr, r in runs},
        "collapse_step_by_lr": {str(lr): r.collapse_step for lr, r in runs},
        "collapse_logged_by_lr": {str(lr): r.collapse_logged for lr, r in runs},
    }


SENSITIVITY_COLUMNS = ["arm", "T", "LR sensitivity", "largest stable LR per seed", "runs diverged", "runs collapsed"]


def lr_tables(data: dict) -> list[str]:
    """The section's tables (design checks, the findings, the sensitivity per arm and T) as markdown lines, from the
    section's JSON (`report.json`'s `lr_curves`): the report and a results page (study.report.readme) render them
    from the same data."""
    family = Family(int(data["family"]["size"]))
    return [
        "Definitions and rules: docs/findings.md, \"Training at a temperature from scratch\". Diverged: non-finite, "
        "or a final held-out loss above the loss at init; LR sensitivity: mean over the grid of min(loss, loss at "
        "init) minus the best; the seed is the unit.",
        "",
        table(["design check", "passed", "measured"],
              [[c["statement"], "yes" if c["passed"] else "NO", c["detail"]] for c in data["design_checks"]]),
        "",
        f"{family.describe()}.",
        "",
        table(["#", "claim", "statistic", f"value [{percent(family.level)} CI]", "verdict", "rule"],
              [[f["key"], f["claim"], f["statistic"], f["value"], f["verdict"], f["rule"]] for f in data["findings"]]),
        "",
        "LR sensitivity and the largest stable LR per T (95% t-intervals over seeds):",
        "",
        table(SENSITIVITY_COLUMNS, data["sensitivity"]),
        "",
    ]  # fmt: skip


# What makes two from-scratch runs the same experiment apart from their grid values (T, LR, seed, arm): a later
# analysis that pools reports (`study.report.pooled`) refuses reports that differ here.
SETTING_KEYS = (
    "model.n_layer", "model.n_head", "model.n_embd", "model.n_positions", "model.warmup_steps", "model.min_lr_ratio",
    "model.weight_decay", "model.independent_weight_decay", "model.adam_epsilon", "model.betas", "model.z_loss",
    "data.vocab_size", "data.block_size", "data.batch_size", "data.max_val_blocks", "trainer.max_steps",
    "trainer.gradient_clip_val",
)  # fmt: skip


def shared_settings(summaries: Sequence[Summary]) -> dict[str, object]:
    """The `SETTING_KEYS` values of the from-scratch runs; a key whose runs disagree reads "mixed"."""
    values: dict[str, set[str]] = {}
    for s in summaries:
        if s.run is None or not from_scratch(s):
            continue
        for key in SETTING_KEYS:
            values.setdefault(key, set()).add(json.dumps(s.run.setting(key), sort_keys=True))
    return {key: json.loads(next(iter(v))) if len(v) == 1 else "mixed" for key, v in values.items()}


def ngram_baselines(summaries: Sequence[Summary]) -> dict[str, float]:
    """The held-out losses of the n-gram baselines (`NgramBaseline`): one value per baseline, the same in every
    run that logged it (they share the tokenizer and the held-out set); {} when no run logged them."""
    found: dict[str, float] = {}
    for name, tag in (("unigram", tags.VAL_UNIGRAM_LOSS), ("bigram", tags.VAL_BIGRAM_LOSS)):
        values = {round(v, 9) for s in summaries for _, v in _series(s, tag)}
        if len(values) > 1:
            raise ValueError(f"the runs logged {len(values)} different {tag} values ({sorted(values)[:3]}...): they "
                             "did not share one tokenizer and held-out set, so no baseline is theirs")
        if values:
            found[name] = values.pop()
    return found


def baseline_lines(data: dict) -> list[str]:
    baselines = data.get("baselines") or {}
    if not baselines:
        return []
    said = ", ".join(f"{name} {fmt(value)}" for name, value in baselines.items())
    return [f"Held-out loss of the n-gram baselines (same tokenizer and held-out targets as val/loss): {said} nats.", ""]


@dataclass
class LRSection:
    markdown: str
    data: dict[str, object]


def lr_section(summaries: Sequence[Summary], out: Path | None = None, value_note: str = "") -> LRSection | None:
    """The report's learning-rate section, or None when the sweep is not a learning-rate sweep. ``value_note``
    follows each finding's value (the report's note on runs of several source hashes, `study.report.origin`)."""
    if not is_lr_sweep(summaries):
        return None
    runs = [lr_run(s) for s in summaries if from_scratch(s)]
    found, checks, family = lr_findings(runs)
    curves = gather(runs)
    figures = {}
    if out is not None:
        for name, draw in (("lr_curves.png", draw_lr_curves), ("lr_max_logit.png", draw_max_logit)):
            caption = draw(curves, out)
            if caption:
                figures[name] = caption
    data = {
        "baselines": ngram_baselines(summaries),
        "grid": curves.grid,
        "temperatures": curves.temperatures,
        "family": {"size": family.size, "level": family.level},
        "design_checks": [{"statement": c.statement, "passed": c.passed, "detail": c.detail} for c in checks],
        "findings": [{**f.as_dict(), "value": f"{f.as_dict()['value']}{value_note}"} for f in found],
        "sensitivity": sensitivity_rows(curves),
        "settings": shared_settings(summaries),
        "incomplete": [{"temperature": c.temperature, "arm": c.arm, "seed": c.seed,
                        "missing_lrs": [lr for lr in curves.grid if lr not in c.runs]} for c in curves.incomplete],
        "curves": [{"temperature": c.temperature, "arm": c.arm, "seed": c.seed, "sensitivity": c.sensitivity(),
                    "largest_stable_lr": c.largest_stable(), "init_loss": c.init_loss,
                    # per run, so that a later analysis (the pooled page) can recompute any curve statistic
                    "final_loss_by_lr": {str(lr): r.final_loss for lr, r in sorted(c.runs.items())},
                    "nonfinite_by_lr": {str(lr): r.nonfinite for lr, r in sorted(c.runs.items())},
                    **mechanism_by_lr(c)}
                   for c in curves.complete.values()],
    }
    parts = ["## Learning-rate curves (from scratch)", "", *baseline_lines(data), *lr_tables(data)]
    if curves.incomplete:
        parts += ["Incomplete curves (a learning rate missing; in no finding): "
                  + ", ".join(f"{ARM_LABELS.get(c.arm, c.arm)} T={fmt(c.temperature)} seed {c.seed}" for c in curves.incomplete), ""]
    events = event_rows(runs)
    parts += ["### Runs that diverged or collapsed, and when", ""]
    parts += [table(["run", "arm", "T", "lr", "seed", "outcome", "diverged at step", "collapse at step"], events)
              if events else "None.", ""]
    for name, caption in figures.items():
        parts += [f"### {caption}", "", f"![{caption}]({name})", ""]
    return LRSection("\n".join(parts), data)


__all__ = ["ARMS", "LRFinding", "LRRun", "LRSection", "design_checks", "gather", "interval_finding",
           "lr_findings", "lr_run", "lr_section", "lr_tables", "lr_sensitivity", "sign_test"]
