"""The report's intervals cover what they claim: the project's own interval functions, simulated on replicates from
known distributions at the replicate counts the study uses (n = 3, 5, 10), must cover the true value at least 93%
of the time for a nominal 95%, each alone and (Bonferroni) a family together. Seeded, closed-form intervals, a few
thousand draws per case."""

from __future__ import annotations

import math

import numpy as np
import pytest

from study.report.stats import (
    CONFIDENCE,
    Family,
    Interval,
    TooFew,
    confidence,
    difference_interval,
    family_level,
    mean_interval,
    proportion_difference_interval,
    simultaneous,
    slope_interval,
)

SIMULATIONS = 2000
FLOOR = 0.93  # the least coverage accepted for a nominal 95%
COUNTS = (3, 5, 10)
TEMPS = np.array([0.01, 0.1, 1.0])  # the main job's T grid: three levels a decade apart
SLOPE = -1.0


def normal(rng, size):
    return rng.normal(0.0, 1.0, size)


def skewed(rng, size):
    """Gamma with shape 8, standardised: skewness 0.71 (a fraction or norm bounded on one side)."""
    return (rng.gamma(8.0, 1.0, size) - 8.0) / math.sqrt(8.0)


DISTRIBUTIONS = {"normal": normal, "skewed": skewed}


def coverage(draw_interval, truth: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(SIMULATIONS):
        iv = draw_interval(rng)
        hits += iv.lo <= truth <= iv.hi
    return hits / SIMULATIONS


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_mean_interval_covers(dist, n):
    draw = DISTRIBUTIONS[dist]
    assert coverage(lambda rng: mean_interval(5.0 + 2.0 * draw(rng, n)), 5.0, n) >= FLOOR


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_difference_interval_covers_with_unequal_spreads(dist, n):
    """The low-T group spreads 4x more than the reference group (Welch's case)."""
    draw = DISTRIBUTIONS[dist]
    assert coverage(lambda rng: difference_interval(3.0 + 4.0 * draw(rng, n), 1.0 + draw(rng, n)), 2.0, n) >= FLOOR


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_stratified_slope_interval_covers(dist, n):
    """Independent runs at each T, y = 2 T^-1 x noise, the log noise 10x wider at low T than at T = 1."""
    draw, spread = DISTRIBUTIONS[dist], (0.5, 0.2, 0.05)

    def interval(rng):
        return slope_interval({t: 2.0 * t**SLOPE * np.exp(s * draw(rng, n)) for t, s in zip(TEMPS, spread)})

    assert coverage(interval, SLOPE, n) >= FLOOR


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_paired_slope_interval_covers(dist, n):
    """The same n texts at every T: each text has its own level and its own slope (mean -1) plus noise."""
    draw = DISTRIBUTIONS[dist]

    def interval(rng):
        level, slope = rng.normal(0.0, 1.0, n), SLOPE + 0.3 * draw(rng, n)
        return slope_interval(
            {t: np.exp(level + slope * math.log(t) + 0.1 * draw(rng, n)) for t in TEMPS}, what="texts", paired=True
        )

    assert coverage(interval, SLOPE, n) >= FLOOR


@pytest.mark.parametrize("n", COUNTS)
def test_proportion_difference_interval_covers_exactly(n):
    """Exact coverage (every outcome weighted by its binomial probability, no simulation) of the difference of two
    event fractions, at n runs per group, over a grid of true fractions: never below 95%."""
    from scipy.stats import binom

    intervals = {(a, b): proportion_difference_interval(a, n, b, n) for a in range(n + 1) for b in range(n + 1)}
    for p_a in (0.0, 0.05, 0.2, 0.5, 0.8, 1.0):
        for p_b in (0.0, 0.1, 0.5, 0.9):
            weight_a, weight_b = binom.pmf(range(n + 1), n, p_a), binom.pmf(range(n + 1), n, p_b)
            covered = sum(
                weight_a[a] * weight_b[b] for (a, b), iv in intervals.items() if iv.lo - 1e-12 <= p_a - p_b <= iv.hi + 1e-12
            )
            assert covered >= 0.95 - 1e-9, (n, p_a, p_b, covered)
    # 0/1 outcomes without spread: a t-interval has zero width, this one does not
    assert difference_interval([1.0] * 3, [0.0] * 3).lo == 1.0
    assert proportion_difference_interval(3, 3, 0, 3).lo < 0 < proportion_difference_interval(10, 10, 0, 10).lo
    with pytest.raises(ValueError, match="events=4 of n=3"):
        proportion_difference_interval(4, 3, 0, 3)
    with pytest.raises(TooFew, match="2 vs 3 runs"):
        proportion_difference_interval(1, 2, 0, 3)


def test_the_coverage_check_can_fail():
    """A normal-quantile interval (1.96 s/sqrt n) at n = 3, and the percentile bootstrap the report used to use
    (about [min, max] of 3 values), both fall well short of the floor: the checks above can catch an interval that
    is too narrow."""

    def z_interval(rng):
        x = normal(rng, 3)
        half = 1.96 * x.std(ddof=1) / math.sqrt(3)
        return Interval(x.mean(), x.mean() - half, x.mean() + half, 3)

    assert coverage(z_interval, 0.0, 0) < 0.90
    rng = np.random.default_rng(1)
    samples = normal(rng, (SIMULATIONS, 3))  # the percentile bootstrap, vectorised: 999 resamples per sample
    resampled = np.take_along_axis(samples[:, None, :], rng.integers(0, 3, (SIMULATIONS, 999, 3)), axis=2).mean(2)
    lo, hi = np.percentile(resampled, [2.5, 97.5], axis=1)
    assert np.mean((lo <= 0) & (0 <= hi)) < 0.85


def test_bonferroni_family_covers_jointly():
    """Six findings at 3 replicates each: unadjusted they all cover together about 0.95^6 = 74% of the time;
    at the family's Bonferroni level, at least 95% (it is conservative)."""
    rng = np.random.default_rng(7)
    family = Family(6)
    joint, unadjusted = 0, 0
    for _ in range(SIMULATIONS // 2):
        samples = [normal(rng, 3) for _ in range(family.size)]
        unadjusted += all(mean_interval(x).lo <= 0 <= mean_interval(x).hi for x in samples)
        with family_level(family):
            joint += all((iv := mean_interval(x)).lo <= 0 <= iv.hi for x in samples)
    assert joint / (SIMULATIONS // 2) >= 0.95 - 0.01  # 1000 draws: one standard error of slack
    assert unadjusted / (SIMULATIONS // 2) < 0.80


def test_intervals_match_closed_forms():
    """Student's t, Welch's t and the slope's contrast against scipy's own t-tests and a least-squares fit."""
    from scipy import stats

    x, y = np.array([1.0, 2.0, 4.0]), np.array([3.0, 5.0, 9.0, 1.0])
    ref = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    iv = mean_interval(x)
    assert math.isclose(iv.lo, ref.low) and math.isclose(iv.hi, ref.high) and iv.estimate == pytest.approx(7 / 3)
    ref = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    iv = difference_interval(x, y)
    assert math.isclose(iv.lo, ref.low) and math.isclose(iv.hi, ref.high)
    # balanced levels with equal spreads: the contrast's variance is the within-level pooled one; the middle of
    # three log-spaced levels has weight 0 in the slope, so Welch-Satterthwaite gives 2 (n - 1) = 2 df
    levels = {0.01: [90.0, 110.0], 0.1: [9.0, 11.0], 1.0: [0.9, 1.1]}
    iv = slope_interval(levels)
    fit = stats.linregress(np.log(np.repeat(list(levels), 2)), np.log(np.concatenate(list(levels.values()))))
    pooled_se = fit.stderr * math.sqrt(4 / 3)  # linregress divides the residuals by N - 2 = 4; levels by N - 3 = 3
    assert iv.estimate == pytest.approx(fit.slope)
    assert iv.hi - iv.estimate == pytest.approx(stats.t.ppf(0.975, 2) * pooled_se)
    # paired: one slope per replicate, Student's t over them
    paired = slope_interval({0.01: [100.0, 50.0, 80.0], 0.1: [10.0, 8.0, 9.0], 1.0: [1.0, 1.5, 1.2]}, paired=True)
    per_text = [stats.linregress(np.log(TEMPS), np.log(v)).slope for v in ([100, 10, 1.0], [50, 8, 1.5], [80, 9, 1.2])]
    ref = stats.ttest_1samp(per_text, 0.0).confidence_interval(0.95)
    assert math.isclose(paired.lo, ref.low) and math.isclose(paired.hi, ref.high)


def test_equal_replicates_give_a_point_and_too_few_are_refused():
    assert mean_interval([2.0, 2.0, 2.0]) == Interval(2.0, 2.0, 2.0, 3)
    assert difference_interval([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]).hi == pytest.approx(t_half_width(1.0, 2))  # Welch: 2 df
    with pytest.raises(TooFew, match="2 vs 3 runs"):
        difference_interval([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(TooFew, match=r"unequal sizes \[2, 3, 2\]"):
        slope_interval({0.01: [1, 2], 0.1: [1, 2, 3], 1.0: [1, 2]}, paired=True)


def t_half_width(sd: float, df: int, n: int = 3) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, df)) * sd / math.sqrt(n)


def test_simultaneous_judges_the_family_at_the_bonferroni_level():
    seen: list[float] = []

    def judge() -> list[Interval]:
        seen.append(confidence())
        return [mean_interval([1.0, 2.0, 3.0]) for _ in range(4)]

    found, family = simultaneous(judge)
    assert seen == [CONFIDENCE, 1 - 0.05 / 4] and family.size == 4 and confidence() == CONFIDENCE
    assert all(iv.level == pytest.approx(0.9875) for iv in found)
    assert found[0].hi - found[0].estimate > mean_interval([1.0, 2.0, 3.0]).hi - 2.0  # wider than 95%
    assert "4 findings" in family.describe() and "98.75%" in family.describe()
    with pytest.raises(ValueError, match="size=0"):
        Family(0)


# ---- power: rows the design could not decide ----------------------------------------------------------------------
def sample_with_sd(n: int, mean: float, sd: float) -> np.ndarray:
    """n values with exactly this mean and sample standard deviation."""
    z = np.linspace(-1.0, 1.0, n)
    return mean + sd * (z - z.mean()) / np.std(z, ddof=1)


def test_replicates_needed_is_the_smallest_count_whose_t_interval_fits():
    from study.report.stats import replicates_needed

    iv = mean_interval(sample_with_sd(3, -1.0, 0.4), what="seeds")
    needed = replicates_needed(iv, 0.25)
    assert needed is not None and needed > 3
    # the same spread at the count it names fits the band; one fewer does not (t quantile at n - 1 df, not z)
    assert mean_interval(sample_with_sd(needed, -1.0, 0.4)).half_width <= 0.25
    assert mean_interval(sample_with_sd(needed - 1, -1.0, 0.4)).half_width > 0.25
    with family_level(Family(17)):  # a stricter level needs more
        strict = replicates_needed(mean_interval(sample_with_sd(3, -1.0, 0.4), what="seeds"), 0.25)
    assert strict > needed
    assert replicates_needed(Interval(0.0, -1.0, 1.0, 3), 0.25) is None  # no spread recorded: not a t-interval


def test_a_band_rule_is_underpowered_only_when_its_interval_is_wider_than_the_band():
    from study.report.stats import INCONCLUSIVE, NOT_SUPPORTED, UNDERPOWERED, BandRule, decide

    band = BandRule(-1.0, 0.25)
    wide = mean_interval(sample_with_sd(3, -1.0, 0.4), what="seeds")  # straddles both edges: cannot fit the band
    verdict, note = decide(band, wide)
    assert verdict == UNDERPOWERED and note.startswith(f"half-width {wide.half_width:.2g} > band 0.25: needs about ")
    assert "seeds" in note
    narrow_straddling = Interval(-0.8, -0.9, -0.7, 10, se=0.04, df=9, per_group=10)  # fits, but crosses -0.75
    assert decide(band, narrow_straddling) == (INCONCLUSIVE, "")
    far = Interval(-5.0, -7.0, -3.0, 9, se=0.5, df=4, per_group=3)  # wider than the band but decided: stays decided
    assert decide(band, far) == (NOT_SUPPORTED, "")


def test_a_one_sided_rule_names_the_smallest_effect_its_interval_could_exclude():
    from study.report.stats import INCONCLUSIVE, UNDERPOWERED, Rule, decide

    rule = Rule(null=0.0, claimed=0.05, direction=1)
    verdict, note = decide(rule, Interval(0.0, -0.2, 0.2, 3, se=0.05, df=2, per_group=3))
    assert verdict == UNDERPOWERED and "> the claimed effect 0.05" in note
    assert "the smallest effect it could exclude is 0.2" in note
    assert decide(rule, Interval(0.03, -0.01, 0.07, 3, se=0.01, df=2, per_group=3)) == (INCONCLUSIVE, "")


def test_underpowered_rows_leave_the_family_and_the_rest_set_its_level():
    from study.report.stats import UNDERPOWERED, BandRule, decide, tests_something

    band = BandRule(-1.0, 0.25)
    precise = sample_with_sd(10, -1.0, 0.05)  # decided at any level
    noisy = sample_with_sd(3, -1.0, 0.4)  # underpowered at any level
    seen = []

    class Row:
        def __init__(self, values):
            self.interval = mean_interval(values, what="seeds")
            self.verdict = decide(band, self.interval)[0]

    def judge():
        seen.append(confidence())
        return [Row(precise), Row(precise), Row(noisy)]

    found, family = simultaneous(judge)
    assert [r.verdict for r in found] == ["supported", "supported", UNDERPOWERED]
    assert [tests_something(r) for r in found] == [True, True, False]
    assert family.size == 2 and seen[-1] == pytest.approx(1 - 0.05 / 2)  # the noisy row does not widen the others
    assert found[0].interval.level == pytest.approx(1 - 0.05 / 2)


def test_the_family_keeps_a_conservative_level_when_a_smaller_one_would_change_its_membership():
    """A row decidable only at the smaller family's level would make that level too small for its own family: the
    iteration keeps the larger (earlier) one instead of oscillating."""
    from study.report.stats import UNDERPOWERED, BandRule, decide

    band = BandRule(0.0, 1.0)

    class Row:
        def __init__(self, values):
            self.interval = mean_interval(values)
            self.verdict = decide(band, self.interval)[0]

    def judge():
        # the last row's half-width crosses 1 between the level of a family of 1 and of 3
        return [Row(sample_with_sd(20, 0.0, 0.1)), Row(sample_with_sd(3, 0.9, 0.7)), Row(sample_with_sd(3, 0.0, 0.1))]

    found, family = simultaneous(judge)
    members = sum(r.verdict != UNDERPOWERED for r in found)
    assert family.size >= members  # Bonferroni over at least as many rows as test something: never anti-conservative
    assert all(r.interval.level >= 1 - 0.05 / max(members, 1) for r in found)
