"""Power of the from-scratch findings' two tests, for sizing a study's seeds before its runs.

- **A mean over seeds judged by its t-interval** (finding 1's slope of LR sensitivity against log10 T, and every
  per-seed difference judged the same way): the interval at level 1 - alpha excludes 0 exactly when the two-sided
  one-sample t-test rejects at alpha, so the probability of a decided verdict (supported or not supported) with n
  seeds is that test's power: under a true mean `effect` and a seed-level standard deviation `sd`, the t statistic
  is noncentral t with n - 1 degrees of freedom and noncentrality effect * sqrt(n) / sd.
- **The sign test over untied seeds** (finding 2, `study.report.lrcurves.sign_test`, the same rule): each seed is
  untied with probability `untied_rate`, and an untied seed goes the claimed way with probability `claimed_rate`;
  the probability of a decided verdict sums the exact binomial probabilities of every (untied, claimed) count
  that the rule decides.

Both are exact (no normal approximation); `seeds_needed` searches upwards from the fewest seeds the rule can judge.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from scipy import optimize
from scipy import stats as scipy_stats

from study.report.lrcurves import sign_test
from study.report.stats import fmt
from study.report.table import table

MIN_SEEDS = 2  # a t-interval needs one degree of freedom
DECIDED = ("supported", "not supported")


def _check(alpha: float, power: float | None = None) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if power is not None and not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power!r}")


@cache
def _decides(below: int, above: int, alpha: float) -> bool:
    return sign_test(below, above, alpha)[0] in DECIDED


def t_power(effect: float, sd: float, n: int, alpha: float) -> float:
    """P(the two-sided (1 - alpha) t-interval of the mean of n seeds excludes 0) when the true mean is `effect`."""
    _check(alpha)
    if n < MIN_SEEDS:
        raise ValueError(f"a t-interval needs at least {MIN_SEEDS} seeds, got n = {n}")
    if not sd > 0:
        raise ValueError(f"the seed-level standard deviation must be positive, got {sd!r}")
    df = n - 1
    critical = float(scipy_stats.t.ppf(1 - alpha / 2, df))
    ncp = effect * math.sqrt(n) / sd
    # P(T > c) + P(T < -c), the lower tail as the upper tail at -ncp (scipy's far lower tail can be NaN)
    tails = [float(scipy_stats.nct.sf(critical, df, shift)) for shift in (ncp, -ncp)]
    return sum(0.0 if math.isnan(tail) else tail for tail in tails)


def sign_power(n: int, untied_rate: float, alpha: float, claimed_rate: float = 1.0) -> float:
    """P(`sign_test` decides, supported or not supported) over n seeds: each untied with probability
    `untied_rate`, an untied one going the claimed way with probability `claimed_rate`."""
    _check(alpha)
    for name, rate in (("untied_rate", untied_rate), ("claimed_rate", claimed_rate)):
        if not 0 <= rate <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {rate!r}")
    total = 0.0
    for untied in range(n + 1):
        p_untied = float(scipy_stats.binom.pmf(untied, n, untied_rate))
        for below in range(untied + 1):
            if _decides(below, untied - below, alpha):
                total += p_untied * float(scipy_stats.binom.pmf(below, untied, claimed_rate))
    return total


def t_seeds_needed(effect: float, sd: float, alpha: float, power: float = 0.8, most: int = 1000) -> int | None:
    """The fewest seeds whose t-interval decides with probability >= `power` (None: more than `most`)."""
    _check(alpha, power)
    return next((n for n in range(MIN_SEEDS, most + 1) if t_power(effect, sd, n, alpha) >= power), None)


def sign_seeds_needed(untied_rate: float, alpha: float, power: float = 0.8, claimed_rate: float = 1.0,
                      most: int = 1000) -> int | None:
    """The fewest seeds whose sign test decides with probability >= `power` (None: more than `most`)."""
    _check(alpha, power)
    return next((n for n in range(1, most + 1) if sign_power(n, untied_rate, alpha, claimed_rate) >= power), None)


def smallest_effect(sd: float, n: int, alpha: float, power: float = 0.8) -> float:
    """The smallest true mean (in the units of `sd`'s variable) that n seeds' t-interval decides with probability
    `power`: what a study that cannot afford more seeds can detect."""
    _check(alpha, power)
    high = sd
    while t_power(high, sd, n, alpha) < power:  # the power rises with the effect without bound
        high *= 2
    return float(optimize.brentq(lambda e: t_power(e, sd, n, alpha) - power, 0.0, high, xtol=1e-12 * sd))


@dataclass(frozen=True)
class Measured:
    """What a pooled page (`study report --pool`'s JSON) measured, as the power calculation reads it."""

    slope: float  # finding 1's seed-level mean slope of LR sensitivity against log10 T
    slope_sd: float  # its seed-level standard deviation: the standard error times sqrt(n)
    slope_old: float  # the same over the whole extended grid (the old definition)
    slope_old_sd: float
    seeds: int
    lower: int  # finding 2: seeds with lr* lower at the lowest T, tied, higher
    tied: int
    higher: int

    @property
    def untied_rate(self) -> float:
        return (self.lower + self.higher) / (self.lower + self.tied + self.higher)

    @property
    def claimed_rate(self) -> float:
        return self.lower / (self.lower + self.higher)


def measured(pooled: dict) -> Measured:
    """The pooled page's numbers the power calculation uses (its JSON as `study.report.pooled` writes it)."""
    try:
        new, old, sign = pooled["finding1"]["seed_level"], pooled["finding1_old"]["seed_level"], pooled["finding2"]
        return Measured(new["estimate"], new["se"] * math.sqrt(new["n"]), old["estimate"],
                        old["se"] * math.sqrt(old["n"]), new["n"], sign["lower"], sign["tied"], sign["higher"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"not a pooled page's JSON (study report --pool): missing {err}") from None


def plan_rows(m: Measured, alpha: float, seeds: int, power: float = 0.8) -> list[list[str]]:
    """One row per test: what it assumes, the seeds it needs, its power and smallest detectable effect at `seeds`."""
    rows = []
    for what, effect, sd in (("finding 1 (LR sensitivity over 3e-4 ... 3e-1): slope vs log10 T", m.slope, m.slope_sd),
                             ("finding 1, old definition (whole grid): slope vs log10 T", m.slope_old, m.slope_old_sd)):
        needed = t_seeds_needed(effect, sd, alpha, power)
        rows.append([what, f"mean {fmt(effect)}, seed SD {fmt(sd)}", "more than 1000" if needed is None else str(needed),
                     fmt(t_power(effect, sd, seeds, alpha)), fmt(smallest_effect(sd, seeds, alpha, power))])
    needed = sign_seeds_needed(m.untied_rate, alpha, power, m.claimed_rate)
    rows.append(["finding 2 (largest stable LR): sign test",
                 f"untied {m.lower + m.higher} of {m.seeds}, {m.lower} of them lower",
                 "more than 1000" if needed is None else str(needed),
                 fmt(sign_power(seeds, m.untied_rate, alpha, m.claimed_rate)), "-"])
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="power_plan", description="seeds for the from-scratch findings from a pooled "
                                "page's measurements (docs/findings.md's pre-registrations quote its table)")
    p.add_argument("pooled", help="the pooled page's JSON (study report --pool)")
    p.add_argument("--family", type=int, required=True, help="judged findings in the new study's family")
    p.add_argument("--looks", type=int, required=True, help="analyses of these claims, the new one included")
    p.add_argument("--seeds", type=int, required=True, help="the seeds the new study can afford")
    p.add_argument("--power", type=float, default=0.8)
    args = p.parse_args(argv)
    for name in ("family", "looks", "seeds"):
        if getattr(args, name) < (2 if name == "seeds" else 1):
            p.error(f"--{name} = {getattr(args, name)}: too small")
    m = measured(json.loads(Path(args.pooled).read_text()))
    alpha = 0.05 / (args.family * args.looks)
    print(f"alpha = 0.05 / ({args.family} findings x {args.looks} looks) = {fmt(alpha)}; power {fmt(args.power)}; "
          f"at {args.seeds} seeds:\n")
    print(table(["test", "measured (pooled page)", "seeds needed", f"power at {args.seeds} seeds",
                 f"smallest effect detectable at {args.seeds} seeds"], plan_rows(m, alpha, args.seeds, args.power)))
    return 0
