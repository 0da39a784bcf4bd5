"""Intervals and the three-way verdict rule that every finding uses.

Every finding is a statistic with a bootstrap confidence interval (`scipy.stats.bootstrap`, percentile method,
95 %, a fixed seed so a report is reproducible) over the replicates it pools (runs = seeds of a setting, or
text batches for the probe), and a `Rule` that names the null value and the smallest effect that counts as the
claim. The verdict can come out either way:

    supported      the interval lies beyond the null, on the claimed side, and does not exclude the claim;
    not supported  the interval excludes the claimed effect (it lies entirely short of it);
    inconclusive   otherwise, and whenever there are too few replicates for an interval.

The percentile bootstrap is used rather than BCa because with 3-5 seeds BCa's acceleration estimate is itself
noise and fails outright on constant samples; with so few replicates any interval is rough, which is why the
minimum counts below are enforced and stated in the report.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 9999
SEED = 0
MIN_REPLICATES = 3  # one-sample and two-sample intervals: replicates per group
MIN_PER_LEVEL = 2  # slope intervals: replicates per level of x (with at least MIN_LEVELS levels)
MIN_LEVELS = 3

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"


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
    n: int  # replicates behind the interval (runs or batches)

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

    def describe(self) -> str:
        side = ">" if self.direction > 0 else "<"
        show = self.display or (lambda v: v)
        null, claimed = fmt(show(self.null)), fmt(show(self.claimed))
        if self.null == self.claimed:
            other = "<" if self.direction > 0 else ">"
            return f"supported if the 95% interval lies {side} {null}, not supported if it lies {other} {null}"
        return (
            f"null {null}; claim {side}= {claimed}: supported if the 95% interval is {side} {null} and reaches "
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

    def side(self, interval: Interval | None) -> str:
        """Which way a slope outside the band lies ("" when it is not entirely outside)."""
        if self.verdict(interval) != NOT_SUPPORTED:
            return ""
        # a more negative exponent means a faster growth as the variable falls (T^-4.7 is steeper than T^-1)
        below = max(interval.lo, interval.hi) < self.band[0]
        return f"{'steeper' if below else 'shallower'} than {self.quantity}^{fmt(self.claimed)}"

    def describe(self) -> str:
        low, high = self.band
        return (
            f"supported if the 95% interval lies within [{fmt(low)}, {fmt(high)}] (the claimed exponent "
            f"{fmt(self.claimed)} +- {fmt(self.width)}), not supported if it lies entirely outside that band"
        )


def _bootstrap(samples: tuple, statistic: Callable, paired: bool = False) -> tuple[float, float]:
    from scipy.stats import bootstrap

    with warnings.catch_warnings():
        # constant resamples (a group of identical runs) give a degenerate interval, which is what we want
        warnings.simplefilter("ignore")
        res = bootstrap(
            samples,
            statistic,
            paired=paired,
            vectorized=False,
            n_resamples=N_RESAMPLES,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(SEED),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _clean(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def mean_interval(values: Sequence[float], what: str = "runs") -> Interval:
    """Mean with a bootstrap interval over replicates (one value per run)."""
    x = _clean(values)
    if len(x) < MIN_REPLICATES:
        raise TooFew(f"{len(x)} {what} (need {MIN_REPLICATES})")
    lo, hi = _bootstrap((x,), np.mean)
    return Interval(float(np.mean(x)), lo, hi, len(x))


def difference_interval(a: Sequence[float], b: Sequence[float], what: str = "runs") -> Interval:
    """mean(a) - mean(b), the two groups resampled independently."""
    x, y = _clean(a), _clean(b)
    if min(len(x), len(y)) < MIN_REPLICATES:
        raise TooFew(f"{len(x)} vs {len(y)} {what} (need {MIN_REPLICATES} in each)")
    lo, hi = _bootstrap((x, y), lambda u, v: np.mean(u) - np.mean(v))
    return Interval(float(np.mean(x) - np.mean(y)), lo, hi, len(x) + len(y))


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log y on log x over positive finite points; None with fewer than 2 distinct x."""
    pts = [(x, y) for x, y in zip(xs, ys) if x > 0 and y is not None and math.isfinite(y) and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    return _slope([p[0] for p in pts], [p[1] for p in pts])


def slope_interval(per_level: dict[float, Sequence[float]], what: str = "runs", paired: bool = False) -> Interval:
    """Log-log slope of the geometric mean of y per level x against x, with a bootstrap interval.

    Unpaired (runs): each level's replicates are resampled independently (a stratified bootstrap over seeds).
    Paired (probe batches): the same batches are measured at every level, so batch indices are resampled jointly.
    Non-positive values have no logarithm: a level holding one makes the slope undefined, and says so (dropping
    the level would fit the others and could turn a vanishing quantity into support for its growth).
    """
    zero = [x for x, v in sorted(per_level.items()) if x > 0 and len(_clean(v)) and not (_clean(v) > 0).all()]
    if zero:
        raise TooFew(f"a value <= 0 at level(s) {', '.join(f'{x:g}' for x in zero)}: no log-log slope")
    levels = {x: _clean(v) for x, v in sorted(per_level.items()) if x > 0 and len(_clean(v))}
    counts = [len(v) for v in levels.values()]
    if len(levels) < MIN_LEVELS or min(counts) < MIN_PER_LEVEL:
        raise TooFew(f"{len(levels)} levels with {counts} {what} (need {MIN_LEVELS} levels x {MIN_PER_LEVEL})")
    xs = list(levels)

    def stat(*samples):
        return _slope(xs, [float(np.exp(np.mean(np.log(s)))) for s in samples])

    if paired and len(set(counts)) != 1:
        raise TooFew(f"paired levels of unequal sizes {counts}")
    lo, hi = _bootstrap(tuple(levels.values()), stat, paired=paired)
    return Interval(stat(*levels.values()), lo, hi, sum(counts))
