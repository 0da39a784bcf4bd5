"""Intervals, the family they are judged in, and the verdict rules that every finding uses.

Every finding is a statistic with a confidence interval over the replicates it pools (runs = seeds of a setting,
or text windows for the probe) and a rule (`Rule`, or `BandRule` for "grows like x^a") whose verdict can come
out either way:

    supported      the interval lies beyond the null, on the claimed side, and does not exclude the claim;
    not supported  the interval excludes the claimed effect (it lies entirely short of it);
    inconclusive   otherwise (a row with too few replicates for an interval is labelled `TOO_FEW` instead);
    underpowered   inconclusive because the interval is wider than the rule can use (`decide`): the row says how
                   many replicates would decide it, and leaves the multiplicity family (`tests_something`).

Labels a row can carry instead, outside the family with its value kept (OUTSIDE_FAMILY): descriptive (a measurement
with no rule), numerically unreliable (fp32 off its fp64 reference), not computable (the statistic divides by a
quantity the data cannot tell from 0), design-dependent (a number the design sets, such as N* and the KS test's
head count).

Why these intervals. The findings pool 3-10 replicates. A percentile bootstrap over 3 values is their [min, max]
and covers about 75%, not 95%: resampling cannot see spread that 3 values do not show. Student's t does: its
quantile grows as the degrees of freedom fall (4.30 at 2 df), and it is exact for normal replicates at any n.

- `mean_interval`: Student's t over the replicates (n - 1 df).
- `difference_interval`: Welch's t (each group its own variance, Welch-Satterthwaite df), because a low-T group
  spreads more than the reference group.
- `proportion_difference_interval`: a difference of two fractions of events (unstable runs): exact
  Clopper-Pearson intervals per group at 1 - alpha/2, so never below the level (a t-interval on 0/1 values with
  no spread has zero width).
- `slope_interval`: the log-log slope is a linear contrast of the per-level mean log y. Unpaired levels (seeds):
  its variance from each level's own variance, Welch-Satterthwaite df (least squares over all runs with N - 2 df
  assumes equal variances and covered 90% when the spread differs between levels). Paired levels (the same texts
  at every T): one slope per replicate and Student's t over replicates.

`tests/test_report_stats.py` simulates these functions on normal and skewed replicates at n = 3, 5 and 10 and
requires 93% coverage for a nominal 95%. t-intervals assume near-symmetric replicates; on strongly skewed ones
(exponential) they cover less, which docs/findings.md states with the measured coverage.

The family. The report judges many findings at once, and its verdicts are read together, so the intervals are
Bonferroni-adjusted simultaneous intervals: in a family of m findings each interval is computed at level
1 - 0.05/m (`simultaneous`), and all m cover their true values together with probability >= 95%, whatever the
dependence between them. Holm's step-down is more powerful for p-values, but the verdicts here are read off
intervals (three-way and equivalence-band rules), and Holm has no matching simultaneous intervals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from scipy.special import stdtrit

CONFIDENCE = 0.95  # the family's level: all the report's findings together, and a single interval on its own
MIN_REPLICATES = 3  # one-sample and two-sample intervals: replicates per group
MIN_PER_LEVEL = 2  # slope intervals: replicates per level of x (with at least MIN_LEVELS levels)
MIN_LEVELS = 3

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
DESCRIPTIVE = "descriptive"  # a measurement beside the findings (the paper states a bound there, not a rate): no test
# Inconclusive because the design could not decide: the interval is wider than the rule's band (or the claimed effect),
# so "supported" (or, for a one-sided rule, excluding the claim) was out of reach whatever the data said.
UNDERPOWERED = "underpowered"
UNRELIABLE = "numerically unreliable"  # fp32 and the fp64 reference disagree where the rule reads: no test
# Labels of rows kept in the table, with their value, outside the family: each names why the row is not a test.
TOO_FEW = "too few"  # no interval: too few replicates or levels, or nothing logged
DIAGNOSTIC = "diagnostic"  # a measurement that explains another row; its shape is fixed by the design or mathematics
DEPTH_DIAGNOSTIC = "diagnostic (depth compounding)"  # steeper than one layer's law by construction: T in every layer
OBSERVED = "observed"  # what these runs did, where another design is the test
OBSERVED_ONE_RUN = "observed (one run per cell)"  # a bracket with one run per cell: no replicate to test it
OUTSIDE_REGIME = "outside the paper's regime"  # fitted where the paper states no such law
FRAGILE = "numerically fragile"  # the verdict differed between two numerics paths of the same runs
# The statistic divides by a quantity the data cannot tell from 0 (the from-scratch step-0 loss gap): no value to judge.
NOT_COMPUTABLE = "not computable"
# A number the design sets (N*, where a KS test over the pooled heads loses power, moves with the head count): value
# kept, no test.
DESIGN_DEPENDENT = "design-dependent"
LABELS = (TOO_FEW, DIAGNOSTIC, DEPTH_DIAGNOSTIC, OBSERVED, OBSERVED_ONE_RUN, OUTSIDE_REGIME, DESIGN_DEPENDENT,
          NOT_COMPUTABLE, FRAGILE)
OUTSIDE_FAMILY = (DESCRIPTIVE, UNDERPOWERED, UNRELIABLE, *LABELS)  # verdicts that test nothing
MAX_REPLICATES = 1000  # the search for the replicates a rule needs stops here ("more than 1000")

_LEVEL: ContextVar[float] = ContextVar("study_report_interval_level", default=CONFIDENCE)


def confidence() -> float:
    """The level each interval is computed at now: CONFIDENCE, or the Bonferroni level inside `simultaneous`."""
    return _LEVEL.get()


def percent(level: float) -> str:
    """0.95 -> "95%", 0.99375 -> "99.38%"."""
    return f"{100 * level:.4g}%"


@dataclass(frozen=True)
class Family:
    """The multiplicity correction of a set of findings: `size` intervals, each at `level`, cover together with
    probability >= `confidence` (Bonferroni)."""

    size: int
    confidence: float = CONFIDENCE
    method: str = "Bonferroni"

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size={self.size!r}: a family needs at least one finding")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence!r}: a level lies strictly between 0 and 1")

    @property
    def level(self) -> float:
        return 1 - (1 - self.confidence) / self.size

    def describe(self) -> str:
        return (
            f"{self.method}-adjusted simultaneous intervals over the family of the {self.size} findings in this table "
            "that test something: "
            f"each at {percent(self.level)} (1 - {fmt(1 - self.confidence)}/{self.size}), so that all {self.size} "
            f"cover together with probability >= {percent(self.confidence)}"
        )


Item = TypeVar("Item")


@contextmanager
def family_level(family: Family) -> Iterator[Family]:
    """Compute intervals at the family's Bonferroni level inside the block."""
    token = _LEVEL.set(family.level)
    try:
        yield family
    finally:
        _LEVEL.reset(token)


def tests_something(item: object) -> bool:
    """Whether a judged item belongs to the multiplicity family: an interval, or a finding whose verdict was read off
    an interval. Descriptive rows, rows without an interval (too few replicates; the learning-rate bracket) and
    underpowered rows (the design could not decide them), like every label in OUTSIDE_FAMILY, stay in the table but
    test nothing."""
    if isinstance(item, Interval):
        return True
    verdict = getattr(item, "verdict", None)
    return verdict not in OUTSIDE_FAMILY and getattr(item, "interval", None) is not None


def simultaneous(judge: Callable[[], list[Item]], confidence: float = CONFIDENCE) -> tuple[list[Item], Family]:
    """Judge a family of findings with Bonferroni-adjusted intervals.

    The family is the findings that test something (`tests_something`), and whether a finding is underpowered depends
    on the level (a wider interval is more often wider than its band), so the level is found by iteration. `judge`
    builds the findings at the level in force: first at `confidence` alone (the narrowest intervals: no more rows test
    something at any Bonferroni level, an upper bound m on the family), then at 1 - (1 - confidence)/m; while fewer
    rows than m test something at that level, m falls to their count and the findings are judged again. Should a
    smaller m make more rows decidable than it counts, the previous (larger, so conservative) m is kept: every
    interval is then at a level no lower than its family's Bonferroni level. Intervals are closed-form, so the passes
    are cheap.
    """
    size = sum(map(tests_something, judge()))
    if size == 0:
        return judge(), Family(1, confidence)  # nothing to adjust for
    previous: tuple[list[Item], Family] | None = None
    while True:
        family = Family(size, confidence)
        with family_level(family):
            found = judge()
        members = sum(map(tests_something, found))
        if previous is not None and members > size:
            return previous
        if members >= size or members == 0:
            return found, family
        previous, size = (found, family), members


def fmt(value: float | None, digits: int = 4) -> str:
    """A number to `digits` significant digits (``-`` for None)."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


class TooFew(ValueError):
    """Not enough replicates for an interval; the message says how many there were and how many are needed."""


@dataclass(frozen=True)
class Interval:
    estimate: float
    lo: float
    hi: float
    n: int  # independent replicates behind the interval (seeds, runs or text windows)
    level: float = CONFIDENCE  # its confidence level (higher than CONFIDENCE inside a Bonferroni family)
    # What the interval's width is made of, so that the replicates needed for a narrower one can be computed from the
    # observed spread (`replicates_needed`): the standard error, its degrees of freedom, and the replicates per
    # group (per level of a slope) with their name. None where the interval is not a t-interval.
    se: float | None = field(default=None, compare=False)
    df: float | None = field(default=None, compare=False)
    per_group: int | None = field(default=None, compare=False)
    unit: str = field(default="runs", compare=False)

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def __str__(self) -> str:
        return f"{fmt(self.estimate)} [{fmt(self.lo)}, {fmt(self.hi)}]"


@dataclass(frozen=True)
class Rule:
    """A three-way decision on an interval.

    ``direction`` is +1 when the claim says the statistic is larger than ``null``, -1 when smaller; ``claimed``
    is the smallest effect (on that side) that counts as the claim.
    """

    null: float
    claimed: float
    direction: int
    display: Callable[[float], float] | None = None  # how values are shown in `describe` (e.g. exp of a log ratio)

    def verdict(self, interval: Interval | None) -> str:
        if interval is None or not (math.isfinite(interval.lo) and math.isfinite(interval.hi)):
            return INCONCLUSIVE
        lo, hi = sorted((self.direction * interval.lo, self.direction * interval.hi))
        null, claimed = self.direction * self.null, self.direction * self.claimed
        if hi < claimed:
            return NOT_SUPPORTED
        if lo > null:
            return SUPPORTED
        return INCONCLUSIVE

    def decisive_half_width(self) -> float | None:
        """The widest interval (half-width) that can lie short of the claimed effect when the true effect is the
        null: beyond it the claim cannot be excluded whatever the data. None when null and claim coincide."""
        return abs(self.claimed - self.null) if self.claimed != self.null else None

    def margin(self) -> str:
        return f"the claimed effect {fmt(abs(self.claimed - self.null), 3)}"

    def describe(self) -> str:
        side = ">" if self.direction > 0 else "<"
        show = self.display or (lambda v: v)
        null, claimed = fmt(show(self.null)), fmt(show(self.claimed))
        level = percent(confidence())
        if self.null == self.claimed:
            other = "<" if self.direction > 0 else ">"
            return f"supported if the {level} interval lies {side} {null}, not supported if it lies {other} {null}"
        return (
            f"null {null}; claim {side}= {claimed}: supported if the {level} interval is {side} {null} and reaches "
            f"{claimed}, not supported if it lies short of {claimed}"
        )


@dataclass(frozen=True)
class BandRule:
    """A two-sided rule for "grows like x^a": an equivalence band around the claimed exponent.

    The claim is a rate, so a slope far steeper than claimed contradicts it as much as a flat one does:

        supported      the interval lies inside [claimed - width, claimed + width];
        not supported  the interval lies entirely outside the band (`side` says which way);
        inconclusive   otherwise (it straddles an edge of the band), and whenever there is no interval.
    """

    claimed: float
    width: float
    quantity: str = "T"  # the variable the exponent is on, for messages ("T", "n", "L")

    def __post_init__(self) -> None:
        if not self.width > 0:
            raise ValueError(f"width={self.width!r}: the band needs a positive half-width")

    @property
    def band(self) -> tuple[float, float]:
        return self.claimed - self.width, self.claimed + self.width

    def verdict(self, interval: Interval | None) -> str:
        if interval is None or not (math.isfinite(interval.lo) and math.isfinite(interval.hi)):
            return INCONCLUSIVE
        lo, hi = sorted((interval.lo, interval.hi))
        low, high = self.band
        if low <= lo and hi <= high:
            return SUPPORTED
        if hi < low or lo > high:
            return NOT_SUPPORTED
        return INCONCLUSIVE

    def decisive_half_width(self) -> float:
        """The widest interval (half-width) that fits inside the band: wider, "supported" is out of reach."""
        return self.width

    def margin(self) -> str:
        return f"band {fmt(self.width, 3)}"

    def side(self, interval: Interval | None) -> str:
        """Which way a slope outside the band lies ("" when it is not entirely outside)."""
        if self.verdict(interval) != NOT_SUPPORTED:
            return ""
        # a negative exponent: more negative is a faster growth as the variable falls (T^-4.7 is steeper than T^-1);
        # a positive one: larger is a faster growth as it rises (L^0.3 is shallower than L^1)
        below = max(interval.lo, interval.hi) < self.band[0]
        steeper = below if self.claimed < 0 else not below
        return f"{'steeper' if steeper else 'shallower'} than {self.quantity}^{fmt(self.claimed)}"

    def describe(self) -> str:
        low, high = self.band
        return (
            f"supported if the {percent(confidence())} interval lies within [{fmt(low)}, {fmt(high)}] (the claimed "
            f"exponent {fmt(self.claimed)} +- {fmt(self.width)}), not supported if it lies entirely outside that band"
        )


def replicates_needed(interval: Interval, half_width: float, level: float | None = None) -> int | None:
    """The replicates per group (per level of a slope) at which a t-interval with the observed spread would be no
    wider than `half_width` at `level` (default: the interval's own, the family's level): the standard error shrinks
    like 1/sqrt(r) and the degrees of freedom grow like r - 1, with the t quantile, not a normal approximation.
    None where the interval carries no spread (not a t-interval) or more than MAX_REPLICATES would be needed."""
    if interval.se is None or interval.df is None or not interval.per_group or interval.per_group < 2:
        return None
    quantile = 0.5 + (interval.level if level is None else level) / 2
    r0 = interval.per_group
    for r in range(r0, MAX_REPLICATES + 1):
        df = max(interval.df * (r - 1) / (r0 - 1), 1.0)
        if float(stdtrit(df, quantile)) * interval.se * math.sqrt(r0 / r) <= half_width:
            return r
    return None


def calm_runs_needed(claimed: float, level: float | None = None) -> int:
    """Runs per group, all calm, whose exact one-sided upper bound on the event fraction, 1 - alpha^(1/n), lies
    below `claimed`: n > log(alpha) / log(1 - claimed)."""
    alpha = 1 - (confidence() if level is None else level)
    return math.floor(math.log(alpha) / math.log(1 - claimed)) + 1


def events_needed(events_a: int, n_a: int, events_b: int, n_b: int, half_width: float) -> int | None:
    """Runs per group at which the exact interval of `proportion_difference_interval`, at the observed fractions,
    would be no wider than `half_width` (None: more than MAX_REPLICATES)."""
    for n in range(max(n_a, n_b), MAX_REPLICATES + 1):
        iv = proportion_difference_interval(round(events_a * n / n_a), n, round(events_b * n / n_b), n)
        if iv.half_width <= half_width:
            return n
    return None


def power_note(rule: Rule | BandRule, interval: Interval | None) -> str:
    """Why a rule could not decide with an interval this wide, and what would, from the observed spread ("" when
    the interval is narrow enough for the rule to decide either way)."""
    target = rule.decisive_half_width() if interval is not None else None
    if target is None or interval is None or not interval.half_width > target:
        return ""
    needed = replicates_needed(interval, target)
    if needed is not None:
        what = f"needs about {needed} {interval.unit}"
    elif interval.se is not None:
        what = f"needs more than {MAX_REPLICATES} {interval.unit}"
    else:
        what = "needs more replicates"
    text = f"half-width {fmt(interval.half_width, 2)} > {rule.margin()}: {what} (at {percent(interval.level)})"
    if isinstance(rule, Rule):
        text += f"; the smallest effect it could exclude is {fmt(interval.half_width, 2)}"
    return text


def decide(rule: Rule | BandRule, interval: Interval | None) -> tuple[str, str]:
    """(verdict, note): the rule's verdict, or UNDERPOWERED with what would decide it where the verdict is
    inconclusive because the interval is wider than the rule can use. Decided rows stay decided."""
    verdict = rule.verdict(interval)
    if verdict == INCONCLUSIVE and (note := power_note(rule, interval)):
        return UNDERPOWERED, note
    return verdict, ""


def _clean(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def _t_interval(
    estimate: float, variance: float, df: float, n: int, per_group: int | None = None, unit: str = "runs"
) -> Interval:
    """estimate +- t_{df}(1 - alpha/2) sqrt(variance), at the level in force (`confidence()`).

    A zero variance (every replicate equal) gives the degenerate interval [estimate, estimate]: the data show
    no spread to widen it by.
    """
    level = confidence()
    if variance > 0:
        half = float(stdtrit(df, 0.5 + level / 2)) * math.sqrt(variance)
    else:
        half = 0.0
    se = math.sqrt(variance) if variance > 0 else 0.0
    return Interval(float(estimate), float(estimate) - half, float(estimate) + half, n, level, se, float(df),
                    per_group if per_group is not None else n, unit)  # fmt: skip


def _satterthwaite(parts: np.ndarray, dfs: np.ndarray) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent variance estimates `parts`."""
    used = parts > 0
    return float(parts.sum() ** 2 / np.sum(parts[used] ** 2 / dfs[used])) if used.any() else math.inf


def mean_interval(values: Sequence[float], what: str = "runs") -> Interval:
    """Mean with Student's t-interval over independent replicates (one value per run), n - 1 degrees of freedom."""
    x = _clean(values)
    if len(x) < MIN_REPLICATES:
        raise TooFew(f"{len(x)} {what} (need {MIN_REPLICATES})")
    return _t_interval(float(np.mean(x)), float(np.var(x, ddof=1)) / len(x), len(x) - 1, len(x), unit=what)


def geometric_interval(values: Sequence[float], what: str = "runs") -> Interval:
    """The geometric mean of positive replicates with the t-interval of their mean log, mapped back: for positive
    quantities that span decades (norms, perplexities, ratios), whose linear interval would run below zero. The
    interval is not symmetric around the estimate; its spread fields stay None (they are on the log scale)."""
    x = _clean(values)
    if (x <= 0).any():
        raise TooFew(f"a value <= 0 among the {what}: no geometric mean")
    iv = mean_interval(np.log(x), what)
    return Interval(math.exp(iv.estimate), math.exp(iv.lo), math.exp(iv.hi), iv.n, iv.level, unit=what)


def difference_interval(a: Sequence[float], b: Sequence[float], what: str = "runs") -> Interval:
    """mean(a) - mean(b) with Welch's t-interval (unequal variances, Welch-Satterthwaite degrees of freedom)."""
    x, y = _clean(a), _clean(b)
    if min(len(x), len(y)) < MIN_REPLICATES:
        raise TooFew(f"{len(x)} vs {len(y)} {what} (need {MIN_REPLICATES} in each)")
    parts = np.array([np.var(x, ddof=1) / len(x), np.var(y, ddof=1) / len(y)])
    df = _satterthwaite(parts, np.array([len(x) - 1, len(y) - 1], dtype=float))
    return _t_interval(float(np.mean(x) - np.mean(y)), float(parts.sum()), df, len(x) + len(y), min(len(x), len(y)),
                       f"{what} per group")  # fmt: skip


def proportion_difference_interval(events_a: int, n_a: int, events_b: int, n_b: int, what: str = "runs") -> Interval:
    """p_a - p_b for counts of events (e.g. unstable runs out of n), from two exact Clopper-Pearson intervals.

    A t-interval is wrong on 0/1 outcomes: a group without spread (3 of 3 runs unstable) gives a zero-width
    interval. Here each group's exact interval is taken at 1 - alpha/2 and the difference of their ends covers
    p_a - p_b with probability >= 1 - alpha (Bonferroni over the two groups): conservative, never below the level,
    and like Fisher's exact test it cannot separate 3 of 3 from 0 of 3 at 95%.
    """
    from scipy.stats import binomtest

    for events, n in ((events_a, n_a), (events_b, n_b)):
        if not (isinstance(events, int | np.integer) and isinstance(n, int | np.integer) and 0 <= events <= n):
            raise ValueError(f"events={events!r} of n={n!r}: need whole counts with 0 <= events <= n")
    if min(n_a, n_b) < MIN_REPLICATES:
        raise TooFew(f"{n_a} vs {n_b} {what} (need {MIN_REPLICATES} in each)")
    level = confidence()
    groups = ((events_a, n_a), (events_b, n_b))
    ends = [binomtest(int(k), int(n)).proportion_ci(0.5 + level / 2, method="exact") for k, n in groups]
    (lo_a, hi_a), (lo_b, hi_b) = ((float(e.low), float(e.high)) for e in ends)
    return Interval(events_a / n_a - events_b / n_b, lo_a - hi_b, hi_a - lo_b, n_a + n_b, level)


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of y on x (the caller takes logs where the claim is about a power law)."""
    return float(np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)[0])


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log y on log x over positive finite points; None with fewer than 2 distinct x."""
    pts = [(x, y) for x, y in zip(xs, ys) if x > 0 and y is not None and math.isfinite(y) and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    return least_squares_slope(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]))


def slope_interval(per_level: dict[float, Sequence[float]], what: str = "runs", paired: bool = False) -> Interval:
    """Log-log slope of the geometric mean of y per level x against x, with a t-interval.

    The slope of the per-level mean log y on log x is a fixed linear contrast of the level means,
    sum_i c_i mean_i with c_i = (u_i - mean u) / sum (u_j - mean u)^2 and u = log x.
    Unpaired (runs: independent replicates at each level): its variance is sum_i c_i^2 s_i^2 / n_i, each level
    with its own variance (low T spreads more than T = 1), and Welch-Satterthwaite degrees of freedom.
    Paired (probe batches: the same texts at every level): one slope per replicate, sum_i c_i log y_ij, and a
    one-sample t-interval over replicates, so what the texts share cancels.
    Non-positive values have no logarithm: a level holding one makes the slope undefined, and says so (dropping
    the level would fit the others and could turn a vanishing quantity into support for its growth).
    """
    zero = [x for x, v in sorted(per_level.items()) if x > 0 and len(_clean(v)) and not (_clean(v) > 0).all()]
    if zero:
        raise TooFew(f"a value <= 0 at level(s) {', '.join(f'{x:g}' for x in zero)}: no log-log slope")
    levels = {x: np.log(_clean(v)) for x, v in sorted(per_level.items()) if x > 0 and len(_clean(v))}
    counts = [len(v) for v in levels.values()]
    if len(levels) < MIN_LEVELS or min(counts) < MIN_PER_LEVEL:
        raise TooFew(f"{len(levels)} levels with {counts} {what} (need {MIN_LEVELS} levels x {MIN_PER_LEVEL})")
    if paired and len(set(counts)) != 1:
        raise TooFew(f"paired levels of unequal sizes {counts}")
    u = np.log(np.array(list(levels)))
    c = (u - u.mean()) / np.sum((u - u.mean()) ** 2)
    if paired:
        per_replicate = c @ np.stack(list(levels.values()))  # one slope per replicate (text batch)
        n = len(per_replicate)
        # n: the independent replicates (text windows), not windows x levels: the interval has n - 1 df
        return _t_interval(float(per_replicate.mean()), float(np.var(per_replicate, ddof=1)) / n, n - 1, n, n, what)
    means = np.array([v.mean() for v in levels.values()])
    parts = np.array([ci**2 * np.var(v, ddof=1) / len(v) for ci, v in zip(c, levels.values())])
    df = _satterthwaite(parts, np.array(counts, dtype=float) - 1)
    return _t_interval(float(c @ means), float(parts.sum()), df, sum(counts), min(counts), f"{what} per level")
