"""The frozen-model findings (study analyze's results.json -> report rows): synthetic per-window results where each
claim is true give "supported", where it is false "not supported", and too few windows "inconclusive"; Lemma 1
is measured, never judged."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from study.report import frozen as Z
from study.report.build import judged, report_text
from study.report.findings import DESCRIPTIVE
from study.report.stats import (
    DESIGN_DEPENDENT,
    INCONCLUSIVE,
    NOT_SUPPORTED,
    SUPPORTED,
    UNDERPOWERED,
    Interval,
)

TEMPS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
SEP_NS = [1, 2, 4, 8, 16, 32, 64, 128]
LENGTHS = [32, 64, 128, 256]


def results(windows: int = 20, n_star_ratio: float = 0.06, separability: float = 0.78, slope: float = -1.0,
            drop: float = 100.0, noise: float = 0.05, seed: int = 0, dilution: float = -0.9,
            n_star_slope: float = 1.0) -> dict:
    """A results.json as `study analyze --windows` writes it (only the per-window blocks the report reads)."""
    rng = np.random.default_rng(seed)

    def jitter() -> float:
        return float(np.exp(noise * rng.standard_normal()))

    g, sat = [], []
    for _ in range(windows):
        scale = jitter()
        low = {t: scale * 0.02 * t**slope * jitter() for t in TEMPS if t < 0.1}
        rest = max(low.values()) / (drop * jitter())
        g.append([[low.get(t, rest), low.get(t, rest) * 0.9] for t in TEMPS])
        sat.append([0.1 if t < 0.1 else 0.0 for t in TEMPS])
    max_weight = [[0.5 * n**dilution * jitter() for n in LENGTHS] for _ in range(windows)]
    return {
        "source": {"model": "synthetic"},
        "choices": {"temperatures": TEMPS, "epsilons": [1e-3, 0.1], "alphas": [0.01, 0.05], "lengths": LENGTHS},
        "alg3_critical_n_by_window": {
            "lengths": LENGTHS,
            "n_star_over_length": {
                # N* = n_star_ratio * L_max * (L / L_max)^n_star_slope, as N*/L
                "0.01": [[n_star_ratio * (n / LENGTHS[-1]) ** (n_star_slope - 1) * jitter() for n in LENGTHS]
                         for _ in range(windows)],
                "0.05": [[1.5 * n_star_ratio * (n / LENGTHS[-1]) ** (n_star_slope - 1) * jitter() for n in LENGTHS]
                         for _ in range(windows)],
            },
        },
        "alg4_separability_by_window": {
            "ns": SEP_NS,
            "median_over_heads": [[1.0 if n < 16 else min(1.0, separability * jitter()) for n in SEP_NS]
                                  for _ in range(windows)],
        },
        "alg5_gradient_by_window": {"g_max_over_heads": g, "saturated_fraction": sat},
        "lemma1_fixed_query_by_window": {
            "lengths": LENGTHS,
            "max_weight": max_weight,
            "normalized_entropy": [[0.6 for _ in LENGTHS] for _ in range(windows)],
            "scaled_max": [[n * w for n, w in zip(LENGTHS, row)] for row in max_weight],
            "log10_range_bound": [[3.0 for _ in LENGTHS] for _ in range(windows)],
            "log10_paper_bound": [[40.0 for _ in LENGTHS] for _ in range(windows)],
        },
    }


def ruled(finding):
    """The verdict a row's rule reads: a design-dependent N* row keeps it in its rule text (its label is the verdict)."""
    if finding.verdict != DESIGN_DEPENDENT:
        return finding.verdict
    assert finding.claim.startswith("3. critical N*"), finding.claim  # only the N* rows are design-dependent
    return finding.rule.split("which would read ", 1)[1].split(":", 1)[0]


def by_name(found) -> dict:
    """Rows by short name, each with the verdict its rule reads (`ruled`): the tests below check the rules."""
    keys = {"3. critical N* grows": "n_star_slope", "3. critical": "n_star", "4. N_s/N": "separability", "5. gradient sensitivity": "slope", "5. g drops": "drop",
            "1. Lemma 1": "lemma1"}
    return {next(v for k, v in keys.items() if f.claim.startswith(k)): replace(f, verdict=ruled(f)) for f in found}


def test_every_claim_true_is_supported_with_the_paper_value_and_experiment():
    found = by_name(Z.frozen_findings(results()))
    for name in ("n_star", "n_star_slope", "separability", "slope", "drop"):
        assert found[name].verdict == SUPPORTED, (name, found[name].value)
    for f in found.values():
        assert f.experiment == "frozen" and f.paper_value
    assert "saturated rows at T=0.001: 0.1" in found["slope"].value


@pytest.mark.parametrize(("changes", "name", "side"), [
    (dict(n_star_ratio=0.8), "n_star", "above the range"),  # the KS test merges only near N = L
    (dict(n_star_ratio=0.004), "n_star", "below the range"),
    (dict(separability=0.47), "separability", "below the range"),
    (dict(separability=0.97), "separability", "above the range"),
    (dict(slope=-0.15), "slope", "shallower than T^-1"),  # a flat probe
    (dict(slope=-2.0), "slope", "steeper than T^-1"),  # steeper is not "like 1/T" either
    (dict(drop=18.0), "drop", "below the range"),
    (dict(drop=2000.0), "drop", "above the range"),
    (dict(n_star_slope=0.3), "n_star_slope", "shallower than L^1"),  # N* grows more slowly than L
    (dict(n_star_slope=1.6), "n_star_slope", "steeper than L^1"),
])
def test_a_false_claim_is_not_supported_and_says_which_way(changes, name, side):
    found = by_name(Z.frozen_findings(results(**changes)))
    assert found[name].verdict == NOT_SUPPORTED, found[name].value
    assert side in found[name].value
    others = [f.verdict for key, f in found.items() if key not in (name, "lemma1")]
    assert all(v == SUPPORTED for v in others)


def test_noisy_windows_near_an_edge_are_inconclusive_and_two_windows_too_few():
    edge = by_name(Z.frozen_findings(results(separability=0.85, noise=0.1)))
    assert edge["separability"].verdict == INCONCLUSIVE
    few = by_name(Z.frozen_findings(results(windows=2)))
    for name in ("n_star", "separability", "drop"):
        assert few[name].verdict == INCONCLUSIVE and "too few" in few[name].value


def test_n_star_never_reached_counts_as_n_equal_l_and_is_named():
    res = results(n_star_ratio=0.06, noise=0.0)
    res["alg3_critical_n_by_window"]["n_star_over_length"]["0.01"][0][-1] = None
    finding = Z.n_star_finding(res)
    assert "1 window(s) never reached" in finding.value
    # geometric mean of 19 x 0.06 and one 1.0
    assert float(finding.value.split()[0]) == pytest.approx(math.exp((19 * math.log(0.06)) / 20), rel=1e-3)


def test_n_star_slope_is_the_fitted_exponent_with_n_star_over_l_per_length():
    """N* = 0.06 L^0.7 * 256^0.3 exactly: the slope is 0.7 (not supported: shallower than L^1, the interval of equal
    slopes has no width), and N*/L is given at every L; points that never reached p >= alpha leave the fit."""
    res = results(n_star_slope=0.7, noise=0.0)
    finding = Z.n_star_slope_finding(res)
    assert float(finding.value.split()[0]) == pytest.approx(0.7, abs=1e-9)
    assert ruled(finding) == NOT_SUPPORTED and "shallower than L^1" in finding.value
    assert f"32: {0.06 * (32 / 256) ** -0.3:.3g}, 64:" in finding.value and "256: 0.06" in finding.value
    assert finding.paper_value.startswith("N* proportional to L") and finding.experiment == "frozen"
    res["alg3_critical_n_by_window"]["n_star_over_length"]["0.01"][0][0] = None
    finding = Z.n_star_slope_finding(res)
    assert "1 (window, L) point(s) never reached p >= 0.01 (left out of the fits)" in finding.value
    assert float(finding.value.split()[0]) == pytest.approx(0.7, abs=1e-9)  # the window's other 3 L still fit 0.7
    # one length: no slope
    one = results()
    block = one["alg3_critical_n_by_window"]
    block["lengths"], block["n_star_over_length"] = [256], {a: [r[-1:] for r in v] for a, v in block["n_star_over_length"].items()}
    finding = Z.n_star_slope_finding(one)
    assert ruled(finding) == INCONCLUSIVE and "a slope needs two or more" in finding.value


def test_an_analysis_of_critical_and_dilution_only_gives_their_findings():
    res = results()
    del res["alg4_separability_by_window"], res["alg5_gradient_by_window"]
    assert set(by_name(Z.frozen_findings(res))) == {"n_star", "n_star_slope", "lemma1"}


def test_slope_interval_is_paired_over_windows_and_its_estimate_is_the_fitted_exponent():
    finding = Z.gradient_slope_finding(results(slope=-0.8, noise=0.0))
    assert float(finding.value.split()[0]) == pytest.approx(-0.8, abs=1e-9)


def test_lemma1_is_described_not_judged():
    for dilution in (-1.0, 0.0):  # fully diluted and an attention sink: neither is a verdict
        finding = Z.lemma1_measurement(results(dilution=dilution, noise=0.01))
        assert finding.verdict == DESCRIPTIVE and finding.experiment == "frozen"
        assert float(finding.value.split()[6]) == pytest.approx(dilution, abs=0.02)
    # log10 of n x max weight at n = 256 with dilution -0.9: 256 * 0.5 * 256^-0.9; the paper's constant 10^40
    finding = Z.lemma1_measurement(results(noise=0.0))
    assert f"10^{40 - math.log10(0.5 * 256**0.1):.3g}" in finding.value


def test_range_rule_edges_and_bad_ranges():
    rule = Z.RangeRule(0.7, 0.85)
    assert rule.verdict(Interval(0.78, 0.72, 0.84, 20)) == SUPPORTED
    assert rule.verdict(Interval(0.6, 0.55, 0.65, 20)) == NOT_SUPPORTED
    assert rule.verdict(Interval(0.7, 0.65, 0.75, 20)) == INCONCLUSIVE
    assert rule.verdict(None) == INCONCLUSIVE
    with pytest.raises(ValueError, match="low < high"):
        Z.RangeRule(0.85, 0.7)
    with pytest.raises(ValueError, match="low > 0"):
        Z.RangeRule(0.0, 1.0, log=True)


def test_report_reads_the_sweeps_analyze_results(tmp_path):
    assert Z.load_analysis(tmp_path) is None and Z.frozen_findings(None) == []
    (tmp_path / "analyze").mkdir()
    (tmp_path / "analyze" / "results.json").write_text(json.dumps(results()))
    loaded = Z.load_analysis(tmp_path)
    text = report_text("t", str(tmp_path), [], [], {}, None, [], judged([], None, loaded))
    assert "3. critical N* ~ 0.06 L (frozen synthetic" in text and "| descriptive |" in text
    (tmp_path / "analyze" / "results.json").write_text("{broken")
    assert Z.load_analysis(tmp_path) is None


def test_frozen_rows_carry_their_interval_at_the_level_their_rule_names():
    """report.json's frozen rows hold the interval the value shows (ratios on their own scale), and the rule text
    names the level the interval was computed at (the family's, not a fixed 95%)."""
    from study.report.stats import percent

    found, family = judged([], None, results())
    frozen = [f for f in found if f.experiment == "frozen" and f.verdict != "descriptive"]
    assert len(frozen) == 5
    for f in frozen:
        assert f.interval is not None and f.interval.level == pytest.approx(family.level), f.claim
        assert percent(f.interval.level) in f.rule, (f.claim, f.rule)
        assert "95%" not in f.rule
    n_star = next(f for f in found if f.claim.startswith("3. critical N* ~"))
    assert n_star.interval.lo <= 0.06 <= n_star.interval.hi  # on the ratio's scale, as the value shows it
    assert n_star.value.startswith(str(n_star.interval))


def test_algorithm5_tightness_is_g_times_4t_per_low_t():
    """g x 4T: 1 where g reaches the entrywise bound 1/(4T); the synthetic g = 0.02 / T gives 0.08 at every T."""
    found = by_name(Z.frozen_findings(results(noise=0.0)))
    assert "tightness g x 4T (1 = Corollary 3's bound) 0.001: 0.08, 0.003: 0.08, 0.01: 0.08, 0.03: 0.08" in found["slope"].value
    tight = Z.tightness([0.001, 0.1, 1.0], [[250.0, 2.5, 0.25]])  # at the bound at 0.001; T >= 0.1 is outside
    assert tight == {0.001: pytest.approx(1.0)}


def test_noisy_frozen_rows_are_underpowered_with_the_windows_that_would_decide_them():
    noisy = by_name(Z.frozen_findings(results(windows=3, noise=0.6)))
    assert noisy["separability"].verdict == UNDERPOWERED
    assert "needs about" in noisy["separability"].value and "text windows" in noisy["separability"].value
    precise = by_name(Z.frozen_findings(results(windows=20, noise=0.02)))
    assert precise["separability"].verdict == SUPPORTED


def test_n_star_on_one_grid_value_has_no_interval():
    """Every window at the same N* (a discrete grid): no zero-width interval, no verdict, out of the family."""
    same = results()
    same["alg3_critical_n_by_window"]["n_star_over_length"]["0.01"] = [[0.0625] * len(LENGTHS) for _ in range(3)]
    found = by_name(Z.frozen_findings(same))
    assert found["n_star"].verdict == INCONCLUSIVE and found["n_star"].interval is None
    assert "same grid value" in found["n_star"].value
