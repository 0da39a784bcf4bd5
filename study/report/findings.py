"""The findings: each of the paper's claims as a test that can fail, and the sanity checks beside them.

Each finding names its null hypothesis, its statistic, a t-interval over replicates (seeds / runs of one setting,
or text batches for the probe; `study.report.stats` says which and why) and a three-way verdict
(`study.report.stats.Rule`). The report judges them as one family, each interval at the Bonferroni level. Statements that
hold by mathematics (the Jacobian's exact maximum 1/(2T); the entropy of the renormalised top-k weights is
non-decreasing in k for a fixed row) are `SanityCheck`s: they test the code, not the paper. docs/findings.md
describes every finding and its rule.

Runs are grouped as follows: sensitivity, dilution, stability and perplexity findings use the softmax runs that
keep every visible key (k = all), so that top-k selection does not change the quantity measured; the reference
temperature is the grid's T closest to 1 and "low T" is the grid's smallest T. A sweep may add arms beside its main
grid (another optimizer, a learning-rate sweep): every finding uses the main arm (the most common optimizer and
learning rate), except the learning-rate stability finding, which compares the arms.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from study import tags
from study.report import sources
from study.report import summary as S
from study.report.probe import FP64_TOLERANCE
from study.report.stats import (
    CONFIDENCE,
    DEPTH_DIAGNOSTIC,
    DESCRIPTIVE,
    DIAGNOSTIC,
    INCONCLUSIVE,
    MIN_LEVELS,
    NOT_COMPUTABLE,
    NOT_SUPPORTED,
    OBSERVED,
    OBSERVED_ONE_RUN,
    OUTSIDE_REGIME,
    SUPPORTED,
    TOO_FEW,
    UNDERPOWERED,
    UNRELIABLE,
    BandRule,
    Family,
    Interval,
    Rule,
    TooFew,
    calm_runs_needed,
    confidence,
    decide,
    events_needed,
    family_level,
    fmt,
    least_squares_slope,
    loglog_slope,
    mean_interval,
    percent,
    proportion_difference_interval,
    slope_interval,
)
from study.report.summary import Summary, largest_stable_lr  # noqa: F401 (the one definition, re-exported)

SLOPE_RULE = Rule(null=0.0, claimed=-0.5, direction=-1)  # "grows like 1/T": slope 0 = no effect, -1 = the claim
ONE_OVER_T = BandRule(claimed=-1.0, width=0.25)  # training's "grows like 1/T": a slope within -1 +- 0.25
DEPTH_RULE = Rule(null=0.0, claimed=-0.05, direction=-1)  # change of the T-slope per extra low-T layer crossed
GAP_RULE = Rule(null=0.0, claimed=0.5, direction=1)  # fraction of the step-0 loss gap that training leaves
GAP_TEST_STEPS = 100  # fewer fine-tuning steps than this leave a step-0 gap by design: the gap row is observed only
DRIFT_RULE = Rule(null=0.0, claimed=0.05, direction=1)  # change of H(top-k)/log k over training
UNSTABLE_RULE = Rule(null=0.0, claimed=0.25, direction=1)  # unstable-run fraction, low T minus reference T


@dataclass
class Finding:
    claim: str
    null: str
    statistic: str
    value: str  # "estimate [lo, hi]" or why there is no interval
    verdict: str
    rule: str
    paper_value: str = ""  # what the paper states or measured, for the scorecard ("1/T", "N* ~ 0.06 L")
    experiment: str = ""  # where the number comes from: "frozen", "probe" or "training"
    interval: Interval | None = None  # the interval behind `value` (None: too few replicates), for report.json
    # Whether the row is in the Bonferroni family (`study.report.stats.tests_something`); set once the family is
    # judged. Descriptive, underpowered and interval-less rows stay in the table outside it.
    family: bool = True


@dataclass
class SanityCheck:
    statement: str
    value: str
    passed: bool | None  # None: nothing to check


def k_all(summaries: list[Summary]) -> list[Summary]:
    return [s for s in summaries if s.top_k is None and s.normalizer == "softmax"]


def main_arm(summaries: list[Summary]) -> list[Summary]:
    """The runs of the sweep's main grid: the most common (optimizer, learning rate) pair. Arms beside it (an SGD
    arm, a learning-rate sweep) would otherwise be pooled as replicates of the main setting."""
    counts: dict[tuple, int] = {}
    for s in summaries:
        counts[(s.optimizer, s.learning_rate)] = counts.get((s.optimizer, s.learning_rate), 0) + 1
    if len(counts) <= 1:
        return list(summaries)
    main = max(counts, key=lambda key: counts[key])
    return [s for s in summaries if (s.optimizer, s.learning_rate) == main]


def reference_t(summaries: list[Summary]) -> float | None:
    temps = {s.temperature for s in summaries}
    return min(temps, key=lambda t: abs(math.log(t))) if temps else None


def per_seed_levels(summaries: list[Summary], value: Callable[[Summary], float | None]) -> dict[float, list[float]]:
    """{T: values in seed order} over the seeds with a finite value at every T: paired levels, for quantities whose
    runs of one seed share what varies between seeds (the step-0 gradients: one model, the seed's first batch)."""
    by_seed: dict[int, dict[float, float]] = {}
    for s in summaries:
        v = value(s)
        if s.seed is not None and v is not None and math.isfinite(v):
            by_seed.setdefault(s.seed, {})[s.temperature] = v
    temps = sorted({s.temperature for s in summaries})
    seeds = [seed for seed, vs in sorted(by_seed.items()) if all(t in vs for t in temps)]
    return {t: [by_seed[seed][t] for seed in seeds] for t in temps} if seeds else {}


def per_t(summaries: list[Summary], value: Callable[[Summary], float | None]) -> dict[float, list[float]]:
    out: dict[float, list[float]] = {}
    for s in summaries:
        v = value(s)
        if v is not None and math.isfinite(v):
            out.setdefault(s.temperature, []).append(v)
    return dict(sorted(out.items()))


def _judge(
    claim: str, null: str, statistic: str, rule: Rule, compute: Callable[[], Interval], show=str, paper_value: str = "",
    experiment: str = "",
) -> Finding:  # fmt: skip
    """Run one interval computation; too few replicates (or nothing logged) labels the finding `TOO_FEW`."""
    try:
        interval = compute()
    except TooFew as err:
        why = f"too few: {err}"
        return Finding(claim, null, statistic, why, TOO_FEW, rule.describe(), paper_value, experiment)
    verdict, note = decide(rule, interval)
    value = show(interval) + (f"; {UNDERPOWERED}: {note}" if note else "")
    return Finding(claim, null, statistic, value, verdict, rule.describe(), paper_value, experiment, interval)


def _training(finding: Finding, paper_value: str) -> Finding:
    finding.paper_value, finding.experiment = paper_value, "training"
    return finding


def _saturation_note(runs: list[Summary], key: str = S.SATURATED, when: str = "at the end") -> str:
    """The fraction of saturated rows (max weight > 0.99) at each T the row fits: where rows saturate, the softmax
    Jacobian goes to 0 and no 1/T law can hold, so every 1/T row shows it."""
    sat = per_t(runs, lambda s: s.values.get(key))
    if not sat:
        return f"; saturated rows {when}: not logged"
    return f"; saturated rows {when} by T: " + ", ".join(f"{t:g}: {fmt(sum(v) / len(v), 2)}" for t, v in sat.items())


def relabel(finding: Finding, label: str, why: str) -> Finding:
    """The row kept with its value, outside the family, under ``label``: what its rule alone would have read stays in
    the value, and the rule column says why it is not a test. A row with no value stays `TOO_FEW`."""
    if finding.verdict == TOO_FEW:
        return finding
    if finding.verdict != label:
        finding.value += f"; its rule alone would read: {finding.verdict}"
    finding.verdict, finding.rule = label, f"{label}: {why} (outside the family; its rule: {finding.rule})"
    return finding


# The paper's regime for "grows like 1/T": the temperatures at and below this (it reports 1/T for T < 0.1).
PAPER_REGIME = 0.1
STEP0_GRADIENT = "float64 gradient at step 0 (each seed's first batch; Fp64GradientCheck)"


def gradient_source(runs: list[Summary]) -> tuple[list[Summary], Callable[[Summary], dict[str, dict[int, float]]], str]:
    """(runs, their per-layer gradient norms, a note) for the gradient slopes: the float64 step-0 norms where every
    run has them (the same on every machine's kernels: no level is left out), else the float32 medians over the
    logged training steps at the levels the fp64 check does not contradict (`fp64_valid_runs`: logs written before
    the check logged its norms)."""
    if runs and all(s.step0_grads for s in runs):
        return runs, lambda s: s.step0_grads, ""
    kept, note = fp64_valid_runs(runs)
    return kept, lambda s: s.layer_grads, note


def step0(runs: list[Summary]) -> bool:
    """Whether the gradient slopes of these runs are fitted on the float64 step-0 norms (`gradient_source`)."""
    return bool(runs) and all(s.step0_grads for s in runs)


# ---- claim 5: gradient sensitivity ------------------------------------------------------------------------------
def local_slopes(levels: dict[float, list[float]]) -> str:
    """Log-log slopes between adjacent T of the per-T geometric means: the regimes a single fit would average."""
    means = {t: math.exp(sum(math.log(v) for v in vs) / len(vs)) for t, vs in levels.items() if vs and min(vs) > 0}
    temps = sorted(means)
    parts = [f"{a:g}-{b:g}: {fmt(loglog_slope([a, b], [means[a], means[b]]), 3)}" for a, b in zip(temps, temps[1:])]
    return "; local slopes " + ", ".join(parts) if len(parts) > 1 else ""


def band_finding(claim: str, statistic: str, levels: dict[float, list[float]], paper_value: str = "1/T",
                 paired: bool = False) -> Finding:  # fmt: skip
    """A training "grows like 1/T" claim under the two-sided band: the log-log slope of the per-T geometric mean
    against T (`slope_interval`: unpaired over runs, or ``paired``, one slope per seed, where each level's list holds
    the same seeds in the same order), with its side when outside the band and the local slopes between adjacent T."""
    found: list[Interval] = []

    def compute() -> Interval:
        found.append(slope_interval(levels, what="seeds" if paired else "runs", paired=paired))
        return found[-1]

    finding = _judge(claim, "slope 0 (no dependence on T)", statistic, ONE_OVER_T, compute)
    side = ONE_OVER_T.side(found[0]) if found else ""
    finding.value += (f"; {side}" if side else "") + local_slopes(levels)
    finding.paper_value, finding.experiment = paper_value, "training"
    return finding


def fp64_unreliable(runs: list[Summary], ratio_key: str) -> dict[float, float]:
    """{T: fp32/fp64} where the step-0 fp64 check (`Fp64GradientCheck`, once per setting) differs from 1 by more
    than the probe's `FP64_TOLERANCE`: the ratio furthest from 1 over the runs at that T that ran the check."""
    worst: dict[float, float] = {}
    for s in runs:
        ratio = s.values.get(ratio_key)
        if ratio is None:
            continue
        bad = not math.isfinite(ratio) or ratio <= 0 or abs(ratio - 1) > FP64_TOLERANCE
        if bad and (s.temperature not in worst or _distance(ratio) > _distance(worst[s.temperature])):
            worst[s.temperature] = ratio
    return worst


def fp64_checked(levels: dict[float, list[float]], runs: list[Summary], ratio_key: str | None) -> tuple[dict, str]:
    """The levels fp64 does not contradict, and the note naming the ones left out (as the probe leaves them)."""
    bad = fp64_unreliable(runs, ratio_key) if ratio_key else {}
    return {t: v for t, v in levels.items() if t not in bad}, _left_out(bad)


def _left_out(bad: dict[float, float], gradient: str = "fp32 gradient") -> str:
    """The note naming the levels fp64 contradicts, with their fp32/fp64 ratios ("" for none); `gradient` says
    whose ratio it is where the row's own gradient is not the one checked."""
    if not bad:
        return ""
    return (f"; left out, {gradient} {UNRELIABLE} (|fp32/fp64 - 1| > {fmt(FP64_TOLERANCE)} at step 0): "
            + ", ".join(f"T={fmt(t)} ({fmt(r, 3)})" for t, r in sorted(bad.items())))


def slope_finding(claim: str, statistic: str, runs: list[Summary], key: str, ratio_key: str | None = None) -> Finding:
    """A "grows like 1/T" claim on one per-run value (`band_finding`), with the saturated rows at the lowest T it
    fits; with ``ratio_key``, the levels whose step-0 fp32 gradient fp64 contradicts are left out of the fit."""
    levels, note = fp64_checked(per_t(runs, lambda s: s.values.get(key)), runs, ratio_key)
    finding = band_finding(claim, statistic, levels)
    finding.value += note + _saturation_note([s for s in runs if s.temperature in levels])
    return finding


# whose ratio `fp64_valid_runs` names: the whole network's norm ratio lies between its layers' extremes, so where
# the per-layer check ran its worst layer is the number, and the whole network's stands in for runs logged before it
LAYERS_GRADIENT = "fp32 gradient (worst of the whole network and every layer)"


def fp64_valid_runs(runs: list[Summary]) -> tuple[list[Summary], str]:
    """The runs at the levels where every layer's step-0 fp32 gradient agrees with fp64, and the note naming the
    levels left out (with the worse of the two ratios). The per-layer slopes (table, figure, depth and excess rows)
    fit these only. Every layer and group is read from the check's worst per-layer ratio (`FP64_LAYERS`); runs
    logged before that ratio existed have the whole network's (`FP64_QK`) only, a proxy: where it is off, the
    layers whose gradients cross the most low-T layers are."""
    bad = fp64_unreliable(runs, S.FP64_QK)
    for t, ratio in fp64_unreliable(runs, S.FP64_LAYERS).items():
        if t not in bad or _distance(ratio) > _distance(bad[t]):
            bad[t] = ratio
    return [s for s in runs if s.temperature not in bad], _left_out(bad, LAYERS_GRADIENT)


def _distance(ratio: float) -> float:
    """How far an fp32/fp64 ratio is from 1, in log (a non-finite or non-positive one the furthest)."""
    return abs(math.log(ratio)) if math.isfinite(ratio) and ratio > 0 else math.inf


def probe_findings(probe: dict | None) -> list[Finding]:
    """The probe's single-layer test, one finding per chosen layer (`study.report.probe`); none without a probe."""
    from study.report.probe import single_layer_findings

    return [Finding(**fields) for fields in single_layer_findings(probe)]


# ---- claims 1 and 6: dilution and selection -------------------------------------------------------------------
def dilution_finding(summaries: list[Summary]) -> Finding:
    """Lemma 1 in training, as a measurement: Lemma 1 bounds n alpha_i between constants (exp(-+2D/T), huge on
    real rows) and so predicts no slope; the max weight against n is shown with its interval, without a verdict."""
    runs = k_all(summaries)
    t_ref = reference_t(runs)
    values = [s.values.get(S.DILUTION_SLOPE) for s in runs if s.temperature == t_ref]
    try:
        value = str(mean_interval(values))
    except TooFew as err:
        value = f"too few: {err}"
    return Finding(
        f"1. Lemma 1 in training: the max weight against the visible keys n (T={fmt(t_ref)})",
        "none (a bound, not a rate)",
        "log-log slope of the mean max weight vs n (rows binned by n), mean over runs",
        value,
        DESCRIPTIVE,
        "descriptive: Lemma 1 bounds n x alpha_i between exp(-2D/T) and exp(2D/T) and says nothing about the slope; "
        "1/n (slope -1) is the fully diluted row, 0 no dilution",
        paper_value="C1/n <= alpha <= C2/n (a bound)",
        experiment="training",
    )


def per_seed_means(runs: list[Summary], value: Callable[[Summary], float | None]) -> list[float]:
    """One value per seed: the mean of `value` over that seed's runs (every T). Runs that share a seed share their
    data (initialisation draws, batch order, validation texts), so they are not independent replicates; the seeds
    are (tests/test_report_findings.py simulates the coverage of both readings on clustered data)."""
    by_seed: dict[int, list[float]] = {}
    for s in runs:
        v = value(s)
        if s.seed is not None and v is not None and math.isfinite(v):
            by_seed.setdefault(s.seed, []).append(v)
    return [float(np.mean(vs)) for _, vs in sorted(by_seed.items())]


def drift_finding(summaries: list[Summary]) -> Finding:
    runs = k_all(summaries)
    values = per_seed_means(runs, lambda s: s.values.get(S.SELECTION_DRIFT))

    def compute() -> Interval:
        if runs and not values:
            raise TooFew(f"{len(runs)} runs, none with H(top-k) on the validation batches at step 0 (BaselineValidation) "
                         "and at the end")
        return mean_interval(values, what="seeds")

    return _training(_judge(
        f"6. the selected set drifts towards uniform over training (fixed k={sources.SELECTION_K})",
        "no change",
        f"H(top-{sources.SELECTION_K})/log {sources.SELECTION_K} on the validation batches after the last step minus "
        "at step 0 (the same held-out texts; the step-0 value is the setting's, shared by its seeds), per run; mean "
        "over each seed's runs (all T), t-interval over seeds (the independent unit)",
        DRIFT_RULE,
        compute,
    ), "selection tends to uniform")


# ---- claim 6: stability and perplexity ------------------------------------------------------------------------
def _low_and_ref(summaries: list[Summary]) -> tuple[list[Summary], list[Summary], float | None, float | None]:
    runs = k_all(summaries)
    unclipped = [s for s in runs if s.clip is None]
    runs = unclipped or runs
    t_ref = reference_t(runs)
    t_low = min((s.temperature for s in runs), default=None)
    if t_low == t_ref:
        return [], [], t_low, t_ref
    return [s for s in runs if s.temperature == t_low], [s for s in runs if s.temperature == t_ref], t_low, t_ref


def instability_finding(summaries: list[Summary]) -> Finding:
    low, ref, t_low, t_ref = _low_and_ref(summaries)
    clipped = any(s.clip is not None for s in low + ref)
    claim = "6. low temperature makes training unstable" + (" (runs clipped: can hide it)" if clipped else "")
    statistic = f"unstable-run fraction (diverged, spike or skipped step) T={fmt(t_low)} minus T={fmt(t_ref)}"

    def compute() -> Interval:
        if low and ref and not any(s.unstable for s in low + ref):
            # No event to resample: bound each fraction by the exact one-sided upper limit for 0 events in n
            # runs, 1 - alpha^(1/n) (at 95%: about 3/n, "the rule of three"; alpha shrinks in a Bonferroni family).
            # Enough calm runs bound the difference below the claimed effect (not supported); fewer cannot.
            alpha = 1 - confidence()
            upper_low, upper_ref = 1 - alpha ** (1 / len(low)), 1 - alpha ** (1 / len(ref))
            return Interval(0.0, -upper_ref, upper_low, len(low) + len(ref), confidence(), unit="runs per group")
        events_low, events_ref = sum(s.unstable for s in low), sum(s.unstable for s in ref)
        return proportion_difference_interval(events_low, len(low), events_ref, len(ref), what="runs per group")

    finding = _training(_judge(claim, "equal fractions", statistic, UNSTABLE_RULE, compute),
                        "low T makes training unstable")  # fmt: skip
    iv = finding.interval
    if iv is not None and finding.verdict in (INCONCLUSIVE, UNDERPOWERED) and not any(s.unstable for s in low + ref):
        # Zero events: the interval's low-T end is the exact upper bound, which only more calm runs can lower below
        # the claimed effect (its half-width is not what decides here).
        finding.verdict = UNDERPOWERED
        finding.value = (f"no unstable run in either group ({len(low)} vs {len(ref)} runs): the low-T fraction's "
                         f"{percent(iv.level)} upper bound {fmt(iv.hi)} still allows the claimed "
                         f"{fmt(UNSTABLE_RULE.claimed)}; {UNDERPOWERED}: needs about "
                         f"{calm_runs_needed(UNSTABLE_RULE.claimed, iv.level)} calm runs per group")  # fmt: skip
    elif iv is not None and finding.verdict == UNDERPOWERED:
        needed = events_needed(sum(s.unstable for s in low), len(low), sum(s.unstable for s in ref), len(ref),
                               UNSTABLE_RULE.claimed)  # fmt: skip
        head = finding.value.split(f"; {UNDERPOWERED}")[0]
        finding.value = (f"{head}; {UNDERPOWERED}: half-width {fmt(iv.half_width, 2)} > the claimed effect "
                         f"{fmt(UNSTABLE_RULE.claimed)}: needs about {needed or f'more than {len(low)}'} runs per group "
                         "at the observed fractions")  # fmt: skip
    return finding


GAP_NEGLIGIBLE = 0.01  # a step-0 gap below this fraction of the reference T's step-0 val/loss is about 0


def step0_gap_about_zero(gaps: list[float], reference_losses: list[float]) -> str:
    """Why the step-0 loss gap (low T minus the reference T, per seed, nats) is about 0, or "" when it is not.

    The recovery fraction divides by that gap. Runs from one random initialisation start with near-uniform attention
    whatever T, so their gap is rounding: the fraction is then noise over noise, and its interval can lie anywhere.
    About 0 is either of: the gap's CONFIDENCE t-interval over seeds contains 0 (the seeds do not agree on its sign),
    or its mean magnitude is below GAP_NEGLIGIBLE of the reference loss at step 0. The second is a fraction of the
    loss, far below a gap that a temperature opens in a pretrained model and far above what rounding gives a shared
    initialisation, so no machine's rounding moves a row across it; it decides with fewer than 3 seeds too.
    """
    if not gaps:
        return ""
    mean, scale = float(np.mean(gaps)), float(np.mean(reference_losses))
    if abs(mean) < GAP_NEGLIGIBLE * abs(scale):
        return f"|gap| {fmt(abs(mean), 3)} nats < {fmt(GAP_NEGLIGIBLE)} x the reference step-0 loss {fmt(scale, 3)}"
    try:
        with family_level(Family(1)):
            iv = mean_interval(gaps, what="seeds")
    except TooFew:
        return ""
    return f"the gap's {percent(iv.level)} interval {iv} contains 0" if iv.lo <= 0 <= iv.hi else ""


def recovery_finding(summaries: list[Summary]) -> Finding:
    """Training measured from its step-0 baseline: the fraction of the step-0 validation-loss gap between low T and
    the reference T that is still there after the same fine-tuning, per seed (each low-T run against the reference
    run of its seed). 0: training erased the damage the temperature did to the frozen model; 1: training did
    nothing to the gap. The ratio of final perplexities alone mostly restates the frozen model's gap. NOT_COMPUTABLE
    (outside the family) when the step-0 gap is about 0 (`step0_gap_about_zero`): from-scratch runs share one
    initialisation, so there is no gap to close."""
    low, ref, t_low, t_ref = _low_and_ref(summaries)
    ref_by_seed = {s.seed: s for s in ref if not s.diverged}
    ratios: dict[str, list[float]] = {"step 0": [], "final": []}

    def remaining(s: Summary) -> float | None:
        r = ref_by_seed.get(s.seed)
        if s.diverged or r is None:
            return None
        start, end = s.values.get(S.VAL_LOSS_BASELINE), s.final.get(tags.VAL_LOSS)
        ref_start, ref_end = r.values.get(S.VAL_LOSS_BASELINE), r.final.get(tags.VAL_LOSS)
        if None in (start, end, ref_start, ref_end) or not start - ref_start > 0:
            return None  # no baseline, or no gap to close
        ratios["step 0"].append(math.exp(start - ref_start))
        ratios["final"].append(math.exp(end - ref_end))
        return (end - ref_end) / (start - ref_start)

    values = [remaining(s) for s in low]
    diverged = sum(s.diverged for s in low + ref)
    pairs = [(s.values.get(S.VAL_LOSS_BASELINE), r.values.get(S.VAL_LOSS_BASELINE)) for s in low
             if (r := ref_by_seed.get(s.seed)) is not None and not s.diverged]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    about_zero = step0_gap_about_zero([a - b for a, b in pairs], [b for _, b in pairs])

    def compute() -> Interval:
        if low and all(v is None for v in values):
            raise TooFew(f"{len(low)} low-T runs, none with a step-0 validation (BaselineValidation) beside a "
                         f"reference run of its seed and a step-0 gap to close")
        return mean_interval(values, what="seeds")

    finding = _judge(
        "6. (derived) low T hurts training: fine-tuning leaves most of the step-0 loss gap",
        "the gap closes (0 of it left)",
        f"(final - step-0 val/loss gap) / step-0 gap, T={fmt(t_low)} vs T={fmt(t_ref)}, per seed"
        + (f" ({diverged} diverged runs left out)" if diverged else ""),
        GAP_RULE,
        compute,
    )
    if about_zero:
        finding.verdict, finding.interval = NOT_COMPUTABLE, None
        finding.value = f"step-0 gap about 0 ({about_zero}, {len(pairs)} seeds): no gap to close"
        finding.rule += (f"; {NOT_COMPUTABLE} (outside the family) when the step-0 gap is about 0: its "
                         f"{percent(CONFIDENCE)} interval over seeds contains 0, or it is below {fmt(GAP_NEGLIGIBLE)} "
                         "x the reference step-0 loss")
    if ratios["step 0"]:
        step0, final = (math.exp(sum(map(math.log, v)) / len(v)) for v in ratios.values())
        finding.value += f"; val/ppl ratio T={fmt(t_low)} / T={fmt(t_ref)}: {fmt(step0)} at step 0, {fmt(final)} after"
    finding.paper_value, finding.experiment = "not measured (claim 6: low T makes training harder)", "training"
    steps = [s.steps for s in low + ref if s.steps is not None]
    if steps and max(steps) < GAP_TEST_STEPS:
        relabel(finding, OBSERVED, f"{max(steps)} steps cannot be expected to close a step-0 gap (the row is a test "
                f"from {GAP_TEST_STEPS} steps on: configs/sweeps/smollm2-long.yaml)")
    return finding


def _outcome(runs: list[Summary]) -> bool | None:
    """True: every run stable; False: every run diverged (`study.report.summary.diverged`); None: no run, or mixed."""
    if not runs:
        return None
    stable = [s.stable for s in runs]
    return True if all(stable) else False if not any(stable) else None


def stability_by_lr(summaries: list[Summary]) -> dict[str, dict[float, dict[float, list[Summary]]]]:
    """{optimizer: {T: {learning rate: runs}}} over the softmax k = all runs of every arm."""
    out: dict[str, dict[float, dict[float, list[Summary]]]] = {}
    for s in k_all(summaries):
        if s.learning_rate is not None:
            out.setdefault(s.optimizer, {}).setdefault(s.temperature, {}).setdefault(s.learning_rate, []).append(s)
    return out


def lr_stability_findings(summaries: list[Summary]) -> list[Finding]:
    """Per optimizer with a learning-rate sweep: does low T lower the largest stable learning rate? A bracket
    over the learning-rate grid (each cell: every run stable, or every run unstable), not an interval."""
    out = []
    for optimizer, by_t in sorted(stability_by_lr(summaries).items()):
        if len({lr for cells in by_t.values() for lr in cells}) < 2 or len(by_t) < 2:
            continue
        t_low, t_ref = min(by_t), min(by_t, key=lambda t: abs(math.log(t)))
        if t_low == t_ref:
            continue
        low, ref = by_t[t_low], by_t[t_ref]
        lrs = sorted(set(low) & set(ref))
        only_low = [lr for lr in lrs if _outcome(low[lr]) is False and _outcome(ref[lr]) is True]
        only_ref = [lr for lr in lrs if _outcome(ref[lr]) is False and _outcome(low[lr]) is True]
        verdict = (SUPPORTED if only_low and not only_ref else NOT_SUPPORTED if only_ref and not only_low
                   else INCONCLUSIVE)  # fmt: skip
        seeds = sorted({len(r) for cells in (low, ref) for r in cells.values()})
        value = (f"largest stable lr T={fmt(t_low)}: {fmt(largest_stable_lr(low))}, T={fmt(t_ref)}: "
                 f"{fmt(largest_stable_lr(ref))}; lr diverged only at T={fmt(t_low)}: "
                 f"{', '.join(fmt(lr) for lr in only_low) or 'none'}; only at T={fmt(t_ref)}: "
                 f"{', '.join(fmt(lr) for lr in only_ref) or 'none'} (runs per cell: {'/'.join(map(str, seeds))})")  # fmt: skip
        finding = Finding(
                f"6. low temperature lowers the largest stable learning rate ({optimizer})",
                "the same learning rates are stable at both T",
                f"stability (not diverged: non-finite, or a final val/loss above step 0's) per learning rate, "
                f"T={fmt(t_low)} vs T={fmt(t_ref)}",
                value,
                verdict,
                f"supported if at some learning rate every T={fmt(t_ref)} run is stable and every T={fmt(t_low)} run "
                "diverged, and at none the reverse; not supported if only the reverse occurs; inconclusive otherwise "
                "(a bracket on the learning-rate grid, not an interval: outside the Bonferroni family)",
                paper_value="low T makes training unstable",
                experiment="training",
            )
        if seeds == [1]:
            relabel(finding, OBSERVED_ONE_RUN, "one run per (T, learning rate) cell: no replicate, and a run's fate is "
                    "deterministic given its gradients; seeds per cell would make it a test")
        out.append(finding)
    return out


# ---- claim 5 per layer: where a whole-network slope comes from ---------------------------------------------------
def layer_levels(runs: list[Summary], group: str, layer: int,
                 grads: Callable[[Summary], dict[str, dict[int, float]]] = lambda s: s.layer_grads) -> dict[float, list[float]]:
    return per_t(runs, lambda s: grads(s).get(group, {}).get(layer))


def _geometric_slope(levels: dict[float, list[float]]) -> float | None:
    means = {t: math.exp(sum(math.log(v) for v in vs) / len(vs)) for t, vs in levels.items() if vs and min(vs) > 0}
    return loglog_slope(list(means), list(means.values()))


def layer_slopes(summaries: list[Summary]) -> dict[str, dict[int, float]]:
    """{group: {layer: log-log slope against T of the per-T geometric mean of the layer's gradient norm}} (main
    arm, k = all): the point estimates of the per-layer table and figure."""
    runs, grads, _ = gradient_source(k_all(main_arm(summaries)))
    out: dict[str, dict[int, float]] = {}
    for group in S.LAYER_GROUPS:
        for layer in sorted({layer for s in runs for layer in grads(s).get(group, {})}):
            slope = _geometric_slope(layer_levels(runs, group, layer, grads))
            if slope is not None:
                out.setdefault(group, {})[layer] = slope
    return out


def depth_trends(runs: list[Summary], group: str,
                 grads: Callable[[Summary], dict[str, dict[int, float]]] = lambda s: s.layer_grads) -> list[float]:
    """Per seed: the least-squares change of a layer's T-slope per extra low-T layer its gradient crosses (layer l
    of n crosses n - l: its own attention and every layer above it). Seeds share data order across T, so each
    seed's runs give one slope per layer. A model with fewer than 3 layers has no trend to fit (`TooFew`)."""
    layers = sorted({layer for s in runs for layer in grads(s).get(group, {})})
    if len(layers) < 3:
        raise TooFew(f"{len(layers)} layers logged: a trend over depth needs 3 (a deeper model would decide it)")
    n_layers = layers[-1] + 1
    trends = []
    for seed in sorted({s.seed for s in runs if s.seed is not None}):
        mine = [s for s in runs if s.seed == seed]
        points = []
        for layer in layers:
            pairs = [(s.temperature, grads(s).get(group, {}).get(layer)) for s in mine]
            slope = loglog_slope([t for t, _ in pairs], [v for _, v in pairs])
            if slope is not None:
                points.append((n_layers - layer, slope))
        if len(points) >= 3:
            trends.append(least_squares_slope([p[0] for p in points], [p[1] for p in points]))
    return trends


EXCESS_CONTROLS = ("W_v", "W_o")  # the attention projections whose gradients pass no attention-logit derivative


def excess_slopes(summaries: list[Summary]) -> dict[str, dict[int, Interval | str]]:
    """{control: {layer: the excess T-slope of W_q/W_k's gradient over the control's, or why there is none}}.

    Per seed (its runs share data across T) and layer, the log-log slope of |grad W_q,W_k| against T minus that of
    |grad control|: the part of the layer's T-dependence that goes through the attention logits (W_v and W_o see
    the same low-T layers above them, but not d alpha / d logits). Mean over seeds with a t-interval at the level in
    force; 0 means nothing specific to the logits, a negative value a steeper W_q/W_k gradient. Levels the whole
    network's or any layer's fp64 check contradicts are left out where the fit is not on the float64 step-0 norms
    (`gradient_source`)."""
    runs, grads, _ = gradient_source(k_all(main_arm(summaries)))
    seeds = sorted({s.seed for s in runs if s.seed is not None})
    layers = sorted({layer for s in runs for layer in grads(s).get("W_q,W_k", {})})
    out: dict[str, dict[int, Interval | str]] = {}
    for control in EXCESS_CONTROLS:
        if not any(grads(s).get(control) for s in runs):
            continue
        for layer in layers:
            per_seed = []
            for seed in seeds:
                mine = [s for s in runs if s.seed == seed]
                temps = [s.temperature for s in mine]
                qk = loglog_slope(temps, [grads(s).get("W_q,W_k", {}).get(layer) for s in mine])
                other = loglog_slope(temps, [grads(s).get(control, {}).get(layer) for s in mine])
                if qk is not None and other is not None:
                    per_seed.append(qk - other)
            try:
                out.setdefault(control, {})[layer] = mean_interval(per_seed, what="seeds")
            except TooFew as err:
                out.setdefault(control, {})[layer] = f"too few: {err}"
    return out


def depth_findings(summaries: list[Summary]) -> list[Finding]:
    """One per parameter group logged per layer: does the T-slope steepen with the low-T layers crossed?"""
    return list(depth_findings_by_group(summaries).values())


def depth_findings_by_group(summaries: list[Summary]) -> dict[str, Finding]:
    runs, grads, note = gradient_source(k_all(main_arm(summaries)))
    gradient = STEP0_GRADIENT if step0(runs) else "median over the logged steps"
    out = {}
    for group in S.LAYER_GROUPS:
        if not any(grads(s).get(group) for s in runs):
            continue
        finding = _judge(
            f"5. (depth) the {group} gradient's T-slope steepens with each low-T layer it crosses",
            "no change with depth (0 per layer)",
            f"change of the log-log slope of |grad {group}| vs T per extra low-T layer crossed (least squares over "
            f"layers, per seed; {gradient}; k = all)",
            DEPTH_RULE,
            lambda group=group: mean_interval(depth_trends(runs, group, grads), what="seeds"),
        )
        finding.value += note
        finding.paper_value, finding.experiment = "not a claim of the paper (its 1/T is per layer)", "training"
        out[group] = finding
    return out


def whole_network_finding(runs: list[Summary]) -> Finding:
    """The W_q/W_k gradient over every layer against T: with T in every layer it crosses every low-T layer above
    each W_q, so it is steeper than one layer's law by design; a diagnostic beside the last-layer and depth rows."""
    claim = "5. (whole network, T in every layer) W_q, W_k gradients grow like 1/T in training"
    if step0(runs):
        levels = per_seed_levels(runs, lambda s: s.values.get(S.STEP0_QK))
        finding = band_finding(claim, f"log-log slope of |grad W_q, W_k| over all layers vs T, {STEP0_GRADIENT}; "
                               "one slope per seed (k = all)", levels, paired=True)
        finding.value += _saturation_note(runs, S.SATURATED_STEP0, "at step 0")
    else:
        finding = slope_finding(claim, "log-log slope of the median |grad W_q, W_k| over all layers vs T (k = all)",
                                runs, S.GRAD_QK, S.FP64_QK)
    return relabel(finding, DEPTH_DIAGNOSTIC, "each W_q's gradient crosses every low-T layer above it, so the slope "
                   "compounds over depth by design; the last-layer row tests one layer's 1/T")


def last_layer_finding(summaries: list[Summary]) -> Finding | None:
    """The per-layer claim where training can test it: the last layer's W_q/W_k gradient crosses only its own
    low-T attention (no low-T layer above it compounds the backward signal). On the float64 step-0 gradients it is
    judged in the paper's regime, T <= `PAPER_REGIME`, given `MIN_LEVELS` levels there; with fewer, over every level
    and labelled `OUTSIDE_REGIME`."""
    runs = k_all(main_arm(summaries))
    grads = (lambda s: s.step0_grads) if step0(runs) else (lambda s: s.layer_grads)
    layers = sorted({layer for s in runs for layer in grads(s).get("W_q,W_k", {})})
    if not layers:
        return None
    last = layers[-1]
    if step0(runs):  # one model and the seed's first batch at every T: one slope per seed
        levels, note = per_seed_levels(runs, lambda s: grads(s).get("W_q,W_k", {}).get(last)), ""
        statistic = f"log-log slope of |grad W_q, W_k| of layer {last} vs T, {STEP0_GRADIENT}; one slope per seed (k = all)"
    else:  # the float32 medians, at the levels where the last layer's fp32 gradient agrees with fp64 at step 0
        levels, note = fp64_checked(layer_levels(runs, "W_q,W_k", last, grads), runs, S.FP64_LAST_QK)
        statistic = f"log-log slope of the median |grad W_q, W_k| of layer {last} vs T (k = all)"
    regime = {t: v for t, v in levels.items() if t <= PAPER_REGIME}
    in_regime = len(regime) >= MIN_LEVELS
    span = regime if in_regime else levels
    where = f"T = {fmt(min(span))}-{fmt(max(span))}" if span else "no T"
    finding = band_finding(
        f"5. the last layer's W_q/W_k gradient grows like 1/T in training (layer {last}: one low-T layer; {where})",
        statistic,
        span,
        paired=step0(runs),
    )
    if in_regime and len(levels) > len(regime):
        whole = _geometric_slope(levels)
        finding.value += f"; over every T ({fmt(min(levels))}-{fmt(max(levels))}): slope {fmt(whole, 3)}"
    finding.value += note + _saturation_note([s for s in runs if s.temperature in span],
                                             S.SATURATED_STEP0 if step0(runs) else S.SATURATED,
                                             "at step 0" if step0(runs) else "at the end")
    if not in_regime and finding.verdict != TOO_FEW:
        relabel(finding, OUTSIDE_REGIME, f"{len(regime)} levels at T <= {fmt(PAPER_REGIME)}, where the paper states "
                f"1/T; a slope over T up to {fmt(max(levels))} tests another regime")
    return finding


def depth_statement(summaries: list[Summary]) -> str:
    """What the per-layer data say, in one sentence, from the depth findings' verdicts."""
    found = {group: f.verdict for group, f in depth_findings_by_group(summaries).items()}
    if not found:
        return "No per-layer gradient norms were logged (GradientNormMonitor `by: [block_kind]`)."
    steeper = [g for g, v in found.items() if v == SUPPORTED]
    if len(steeper) == len(found):
        return ("Gradients grow geometrically with the number of low-T layers they cross, for every parameter type "
                f"logged ({', '.join(found)}): the whole-network slope measures depth, not one layer's 1/T.")
    return (f"The T-slope steepens with the low-T layers crossed for {', '.join(steeper) or 'no group'}; "
            + ", ".join(f"{g}: {v}" for g, v in found.items() if g not in steeper) + ".")


def findings(summaries: list[Summary], probe: dict | None = None) -> list[Finding]:
    main = main_arm(summaries)
    runs = k_all(main)
    jacobian = relabel(slope_finding(
        "5. attention sensitivity |d alpha/d l| grows like 1/T in training",
        "log-log slope of the mean spectral norm of sampled rows' Jacobians vs T (k = all; as T -> 0 rows saturate "
        "and it tends to a constant, so the fit is read against the local slopes)",
        runs,
        S.JACOBIAN,
    ), DIAGNOSTIC, "one power law fitted across saturated rows (whose Jacobian tends to 0) and unsaturated ones (1/T "
       "by the chain rule): the local slopes and saturated fractions are the reading, not the one slope")
    out = [jacobian, whole_network_finding(runs)]
    last = last_layer_finding(main)
    if last is not None:
        out.append(last)
    out += depth_findings(main)
    out += probe_findings(probe)
    out += [dilution_finding(main), drift_finding(main)]
    out += [instability_finding(main), *lr_stability_findings(summaries), recovery_finding(main)]
    return out


# ---- sanity checks --------------------------------------------------------------------------------------------
def sanity_checks(summaries: list[Summary]) -> list[SanityCheck]:
    out = []
    ratios = [s.values[S.JACOBIAN_MAX] * 2 * s.temperature for s in summaries if s.values.get(S.JACOBIAN_MAX)]
    out.append(
        SanityCheck(
            "every sampled softmax Jacobian norm <= 1/(2T) (its exact maximum)",
            f"max over runs of max norm x 2T = {fmt(max(ratios))}" if ratios else "not logged",
            (max(ratios) <= 1 + 1e-6) if ratios else None,
        )
    )
    entries = [s.values[S.ENTRY_RATIO_MAX] for s in summaries if s.values.get(S.ENTRY_RATIO_MAX) is not None]
    out.append(
        SanityCheck(
            "every sampled Jacobian entry <= 1/(4T) (Corollary 3 read entrywise; its spectral reading is false: "
            "a = (1/2, 1/2) gives 1/(2T))",
            f"max over runs of the largest entry x 4T = {fmt(max(entries))}" if entries else "not logged",
            (max(entries) <= 1 + 1e-6) if entries else None,
        )
    )
    broken = [s.name for s in summaries if s.selection_by_k and not _monotone(s.selection_by_k)]
    checked = sum(bool(s.selection_by_k) for s in summaries)
    out.append(
        SanityCheck(
            "within each run, H(renormalised top-k) is non-decreasing in k (true by construction)",
            f"{checked - len(broken)} of {checked} runs" + (f"; fails: {', '.join(broken)}" if broken else ""),
            (not broken) if checked else None,
        )
    )
    return out


def _monotone(by_k: dict[int, float]) -> bool:
    values = [by_k[k] for k in sorted(by_k)]
    return all(b >= a - 1e-6 for a, b in zip(values, values[1:]))
