"""study.report.power: the t-interval's power against a simulation and the normal closed form, the sign test's
against its closed form (every untied seed the claimed way) and a simulation, the seed searches at their edges."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from study.report import power
from study.report.lrcurves import sign_test


def _simulated_t_power(effect: float, sd: float, n: int, alpha: float, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    samples = rng.normal(effect, sd, size=(trials, n))
    t = samples.mean(axis=1) / (samples.std(axis=1, ddof=1) / math.sqrt(n))
    return float(np.mean(np.abs(t) > scipy_stats.t.ppf(1 - alpha / 2, n - 1)))


@pytest.mark.parametrize(("effect", "sd", "n", "alpha"), [(0.5, 1.0, 10, 0.05), (-0.03, 0.04, 6, 0.00625),
                                                          (0.0, 1.0, 8, 0.05)])
def test_t_power_matches_a_simulation(effect, sd, n, alpha):
    trials = 40_000
    simulated = _simulated_t_power(effect, sd, n, alpha, trials, seed=1)
    exact = power.t_power(effect, sd, n, alpha)
    # a binomial proportion's 5-sigma band around the exact value
    assert abs(simulated - exact) <= 5 * math.sqrt(exact * (1 - exact) / trials) + 1e-9
    if effect == 0:
        assert exact == pytest.approx(alpha, rel=1e-9)  # no effect: the test rejects at its level, exactly


def test_t_power_tends_to_the_normal_closed_form():
    """With many seeds the t statistic is normal: power = Phi(d sqrt(n) - z) + Phi(-d sqrt(n) - z)."""
    effect, sd, n, alpha = 0.1, 1.0, 4000, 0.01
    z = scipy_stats.norm.ppf(1 - alpha / 2)
    shift = effect * math.sqrt(n) / sd
    closed = scipy_stats.norm.cdf(shift - z) + scipy_stats.norm.cdf(-shift - z)
    assert power.t_power(effect, sd, n, alpha) == pytest.approx(closed, abs=2e-3)


def test_t_seeds_needed_is_the_first_n_that_reaches_the_power():
    effect, sd, alpha = 0.061, 0.055, 0.00625
    n = power.t_seeds_needed(effect, sd, alpha)
    assert power.t_power(effect, sd, n, alpha) >= 0.8 > power.t_power(effect, sd, n - 1, alpha)
    # the normal approximation's n = ((z_a/2 + z_power) sd / effect)^2 is a lower bound (t is heavier-tailed)
    z = scipy_stats.norm.ppf(1 - alpha / 2) + scipy_stats.norm.ppf(0.8)
    assert n >= math.ceil((z * sd / effect) ** 2)
    assert power.t_seeds_needed(1e-4, 1.0, alpha, most=50) is None  # beyond the search: said, not guessed


def test_smallest_effect_inverts_the_power():
    sd, n, alpha = 0.037, 20, 0.00125
    effect = power.smallest_effect(sd, n, alpha)
    assert power.t_power(effect, sd, n, alpha) == pytest.approx(0.8, abs=1e-9)
    assert power.t_power(0.9 * effect, sd, n, alpha) < 0.8


@pytest.mark.parametrize("untied_rate", [0.5, 27 / 35, 1.0])
def test_sign_power_with_every_untied_seed_claimed_is_a_binomial_tail(untied_rate):
    """All untied seeds lower: decided exactly when at least k are untied, k the fewest with 0.5^k <= alpha."""
    alpha = 0.00625
    k = math.ceil(math.log(alpha) / math.log(0.5))
    assert 0.5**k <= alpha < 0.5 ** (k - 1)
    for n in (k - 1, k, 12, 20):
        closed = float(scipy_stats.binom.sf(k - 1, n, untied_rate))
        assert power.sign_power(n, untied_rate, alpha) == pytest.approx(closed, abs=1e-12)


def test_sign_power_matches_a_simulation_when_some_seeds_go_the_other_way():
    n, untied_rate, claimed_rate, alpha, trials = 16, 0.7, 0.85, 0.01, 20_000
    rng = np.random.default_rng(2)
    untied = rng.binomial(n, untied_rate, size=trials)
    below = rng.binomial(untied, claimed_rate)
    table = {(u, b): sign_test(b, u - b, alpha)[0] in power.DECIDED for u in range(n + 1) for b in range(u + 1)}
    decided = np.mean([table[int(u), int(b)] for u, b in zip(untied, below)])
    exact = power.sign_power(n, untied_rate, alpha, claimed_rate)
    assert abs(decided - exact) <= 5 * math.sqrt(exact * (1 - exact) / trials)
    assert exact < power.sign_power(n, untied_rate, alpha)  # seeds the other way cost power


def test_sign_seeds_needed_at_the_edges():
    alpha = 0.00625  # needs 8 untied seeds, all lower
    assert power.sign_seeds_needed(1.0, alpha) == 8  # every seed untied: exactly the perfect count
    n = power.sign_seeds_needed(27 / 35, alpha)
    assert power.sign_power(n, 27 / 35, alpha) >= 0.8 > power.sign_power(n - 1, 27 / 35, alpha)
    assert power.sign_seeds_needed(0.0, alpha, most=30) is None  # no seed ever untied: never decided


@pytest.mark.parametrize(("call", "message"), [
    (lambda: power.t_power(0.1, 1.0, 1, 0.05), "at least 2 seeds"),
    (lambda: power.t_power(0.1, 0.0, 5, 0.05), "standard deviation must be positive"),
    (lambda: power.t_power(0.1, 1.0, 5, 1.5), "alpha must lie in"),
    (lambda: power.sign_power(5, 1.2, 0.05), "untied_rate must lie in"),
    (lambda: power.t_seeds_needed(0.1, 1.0, 0.05, power=1.0), "power must lie in"),
])
def test_bad_values_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


POOLED = Path(__file__).resolve().parents[1] / "docs" / "results" / "scratch-pooled" / "pooled.json"


def test_measured_reads_the_pooled_page():
    data = json.loads(POOLED.read_text())
    m = power.measured(data)
    new = data["finding1"]["seed_level"]
    assert m.slope == new["estimate"] and m.seeds == new["n"] == 35
    assert m.slope_sd / math.sqrt(m.seeds) == pytest.approx(new["se"], rel=1e-12)  # sd = se sqrt(n)
    assert (m.lower, m.tied, m.higher) == (27, 8, 0) and m.untied_rate == 27 / 35 and m.claimed_rate == 1.0
    del data["finding2"]
    with pytest.raises(ValueError, match="missing 'finding2'"):
        power.measured(data)


def test_main_prints_the_plan_table(capsys):
    assert power.main([str(POOLED), "--family", "8", "--looks", "5", "--seeds", "16"]) == 0
    out = capsys.readouterr().out
    assert "alpha = 0.05 / (8 findings x 5 looks) = 0.00125" in out
    m = power.measured(json.loads(POOLED.read_text()))
    sign_row = next(line for line in out.splitlines() if line.startswith("| finding 2"))
    assert f"| {power.sign_seeds_needed(27 / 35, 0.00125)} |" in sign_row
    assert f"{power.fmt(power.sign_power(16, m.untied_rate, 0.00125))} |" in sign_row
    with pytest.raises(SystemExit):
        power.main([str(POOLED), "--family", "0", "--looks", "5", "--seeds", "16"])
