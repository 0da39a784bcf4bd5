"""Every finding can fail: synthetic runs where the claim is true give "supported", runs where it is false give
"not supported" (or "inconclusive"), and too few replicates give "inconclusive". Built as the report's in-memory
input (`Summary` objects), not by training."""

from __future__ import annotations

import math

import numpy as np
import pytest

from study.report import findings as F
from study.report import summary as S
from study.report.stats import (
    INCONCLUSIVE,
    NOT_SUPPORTED,
    SUPPORTED,
    Interval,
    Rule,
    TooFew,
    mean_interval,
    slope_interval,
)
from study.report.summary import Summary

SEEDS = (0, 1, 2)
TEMPS = (0.01, 0.1, 1.0)


def run(t: float, seed: int = 0, k: int | None = None, ppl: float | None = 100.0, state="finished", clip=None, **values):
    return Summary(
        name=f"T{t:g}_k{'all' if k is None else k}_softmax_s{seed}",
        temperature=t,
        top_k=k,
        seed=seed,
        state=state,
        clip=clip,
        final={"val/ppl": ppl},
        values=values,
    )


def noise(seed: int, scale: float = 0.05) -> float:
    return float(np.random.default_rng(seed).normal(0, scale))


# ---- the rule itself -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lo, hi, expected",
    [
        (-1.2, -0.3, SUPPORTED),  # excludes the null, reaches the claim
        (-0.3, -0.1, NOT_SUPPORTED),  # an effect, but short of the claim: the claim is excluded
        (-0.8, 0.2, INCONCLUSIVE),  # neither excluded
        (0.1, 0.4, NOT_SUPPORTED),  # the wrong sign
        (float("nan"), 0.0, INCONCLUSIVE),
    ],
)
def test_rule_is_three_way(lo, hi, expected):
    assert Rule(null=0.0, claimed=-0.5, direction=-1).verdict(Interval((lo + hi) / 2, lo, hi, 3)) == expected


def test_intervals_need_replicates_and_cover_the_truth():
    with pytest.raises(TooFew, match="2 runs"):
        mean_interval([1.0, 2.0])
    iv = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert iv.lo < 2.5 < iv.hi and iv.estimate == 2.5
    # slope of y = 3 T^-1 with multiplicative noise, 3 seeds per T
    levels = {t: [3 / t * math.exp(noise(s + 10 * i)) for s in SEEDS] for i, t in enumerate(TEMPS)}
    iv = slope_interval(levels)
    assert iv.lo < -1 < iv.hi and abs(iv.estimate + 1) < 0.1
    with pytest.raises(TooFew, match="2 levels"):
        slope_interval({0.1: [1, 2], 1.0: [1, 2]})
    assert str(Interval(1.23456, 1.0, 2.0, 3)) == "1.235 [1, 2]"


# ---- claim 5 ---------------------------------------------------------------------------------------------------
def test_bound_finding_fails_when_rows_exceed_the_stated_bound():
    exceed = [run(0.01, s, frac_above_sqrt2=0.3 + noise(s)) for s in SEEDS]
    holds = [run(1.0, s, frac_above_quarter_T=0.001 * s) for s in SEEDS]  # at T=1 the bound is 1/(4T)
    mixed = [run(0.1, s, frac_above_sqrt2=[0.0, 0.05, 0.0][s]) for s in SEEDS]
    found = {f.claim.split(" at ")[1]: f for f in F.bound_findings(exceed + holds + mixed)}
    assert found["T=0.01 (= sqrt 2)"].verdict == NOT_SUPPORTED
    assert found["T=1 (= 1/(4T))"].verdict == SUPPORTED
    assert found["T=0.1 (= sqrt 2)"].verdict == INCONCLUSIVE
    too_few = F.bound_findings([run(0.01, 0, frac_above_sqrt2=0.5)])
    assert too_few[0].verdict == INCONCLUSIVE and "too few" in too_few[0].value


@pytest.mark.parametrize("key", [S.JACOBIAN, S.GRAD_QK])
def test_one_over_t_finding_fails_on_saturated_rows(key):
    claim = "x"
    true = [run(t, s, **{key: 0.2 / t * math.exp(noise(s + 7 * i)), S.SATURATED: 0.0}) for i, t in enumerate(TEMPS) for s in SEEDS]
    # saturated rows: the Jacobian collapses at low T instead of growing (slope >= 0)
    false = [run(t, s, **{key: 0.05 * math.exp(noise(s + 7 * i)), S.SATURATED: 0.9}) for i, t in enumerate(TEMPS) for s in SEEDS]
    assert F.slope_finding(claim, "s", true, key).verdict == SUPPORTED
    verdict = F.slope_finding(claim, "s", false, key)
    assert verdict.verdict == NOT_SUPPORTED and "saturated rows at T=0.01: 0.9" in verdict.value
    two_levels = [r for r in true if r.temperature != 0.1]
    assert F.slope_finding(claim, "s", two_levels, key).verdict == INCONCLUSIVE


def test_probe_finding_uses_paired_batches():
    def probe(power):
        results = [
            {"temperature": t, "saturated_fraction": 0.1, "batches": [{"grad_attn_qk": t**power * (1 + 0.05 * b)} for b in range(4)]}
            for t in TEMPS
        ]
        return {"model": "tiny", "results": results}

    assert F.probe_finding(probe(-1.0)).verdict == SUPPORTED
    assert F.probe_finding(probe(0.0)).verdict == NOT_SUPPORTED
    assert F.probe_finding(None) is None
    # A gradient that vanishes at the lowest T is the opposite of the claim: it must not be dropped and the rest
    # fitted (which gave "supported", slope -1, before).
    vanishing = probe(-1.0)
    vanishing["results"].insert(0, {"temperature": 0.001, "saturated_fraction": 1.0,
                                    "batches": [{"grad_attn_qk": 0.0} for _ in range(4)]})
    finding = F.probe_finding(vanishing)
    assert finding.verdict == INCONCLUSIVE and "<= 0 at level(s) 0.001" in finding.value


# ---- claims 1 and 6 --------------------------------------------------------------------------------------------
def test_dilution_is_a_measurement_not_a_verdict():
    """Lemma 1 is a bound: diluted rows and attention sinks are both measured, neither is judged."""
    diluted = [run(1.0, s, dilution_slope=-0.9 + noise(s)) for s in SEEDS]
    sink = [run(1.0, s, dilution_slope=0.0 + noise(s, 0.01)) for s in SEEDS]
    for runs, estimate in ((diluted, -0.9), (sink, 0.0)):
        finding = F.dilution_finding(runs)
        assert finding.verdict == F.DESCRIPTIVE and finding.experiment == "training" and finding.paper_value
        assert float(finding.value.split()[0]) == pytest.approx(estimate, abs=0.02)
    assert F.dilution_finding(diluted[:2]).value.startswith("too few")


def test_selection_drift_finding():
    towards = [run(t, s, selection_drift=0.1 + noise(s, 0.01)) for t in TEMPS for s in SEEDS]
    none = [run(t, s, selection_drift=noise(s + 3 * i, 0.005)) for i, t in enumerate(TEMPS) for s in SEEDS]
    assert F.drift_finding(towards).verdict == SUPPORTED
    assert F.drift_finding(none).verdict == NOT_SUPPORTED


def test_instability_finding_can_fail_and_zero_events_is_inconclusive():
    def runs(low_spikes, ref_spikes, state_low="finished"):
        return [run(0.01, s, spikes=low_spikes[s], state=state_low) for s in SEEDS] + [
            run(1.0, s, spikes=ref_spikes[s]) for s in SEEDS
        ]

    assert F.instability_finding(runs([2, 1, 3], [0, 0, 0])).verdict == SUPPORTED
    assert F.instability_finding(runs([0, 0, 0], [0, 0, 0], state_low="diverged")).verdict == SUPPORTED
    zero = F.instability_finding(runs([0, 0, 0], [0, 0, 0]))
    assert zero.verdict == INCONCLUSIVE and "zero events" in zero.value
    assert F.instability_finding(runs([0, 0, 0], [1, 1, 0])).verdict == NOT_SUPPORTED
    # Zero events can refute the claim too, given enough runs: 0 of 12 bounds the low-T fraction at 0.22 < 0.25.
    calm = [run(0.01, s, spikes=0) for s in range(12)] + [run(1.0, s, spikes=0) for s in range(12)]
    finding = F.instability_finding(calm)
    assert finding.verdict == NOT_SUPPORTED and "0.2209" in finding.value
    few = F.instability_finding(calm[:8] + calm[12:20])  # 0 of 8: bound 0.31, still allows 0.25
    assert few.verdict == INCONCLUSIVE and "upper bound 0.3123" in few.value
    # clipped runs are used only when no unclipped run exists, and the claim says so
    clipped = [run(0.01, s, spikes=1, clip=1.0) for s in SEEDS] + [run(1.0, s, spikes=0, clip=1.0) for s in SEEDS]
    assert "clipped" in F.instability_finding(clipped).claim


def test_perplexity_finding():
    hurt = [run(0.01, s, ppl=200 * math.exp(noise(s))) for s in SEEDS] + [run(1.0, s, ppl=100 * math.exp(noise(s + 5))) for s in SEEDS]
    same = [run(0.01, s, ppl=100 * math.exp(noise(s, 0.01))) for s in SEEDS] + [run(1.0, s, ppl=100 * math.exp(noise(s + 5, 0.01))) for s in SEEDS]
    f = F.perplexity_finding(hurt)
    assert f.verdict == SUPPORTED and f.value.startswith("2.")  # shown as a ratio
    assert F.perplexity_finding(same).verdict == NOT_SUPPORTED
    assert F.perplexity_finding(hurt[:2] + hurt[3:]).verdict == INCONCLUSIVE  # 2 low-T runs


# ---- sanity checks and identical runs --------------------------------------------------------------------------
def test_sanity_checks_catch_broken_code():
    ok = [run(0.1, 0, jacobian_max=4.9), run(1.0, 0, jacobian_max=0.5)]
    broken = [run(0.1, 0, jacobian_max=6.0)]
    assert F.sanity_checks(ok)[0].passed is True
    assert F.sanity_checks(broken)[0].passed is False
    r = run(1.0, 0)
    r.selection_by_k = {1: 0.0, 4: 1.2, 16: 1.1}  # entropy falling with k: impossible for the same rows
    assert F.sanity_checks([r])[1].passed is False


def test_top1_runs_are_counted_once():
    runs = [run(t, s, k=1) for t in TEMPS for s in (0, 1)] + [run(t, 0) for t in TEMPS]
    kept = S.dedupe(runs)
    top1 = [r for r in kept if r.top_k == 1]
    assert len(kept) == 5 and {r.temperature for r in top1} == {1.0}
    assert sorted(top1[0].same_as) == ["T0.01_k1_softmax_s0", "T0.1_k1_softmax_s0"]


def test_spikes_are_counted_from_step_zero():
    assert S.count_spikes([(0, 5.0), (1, 6.5), (2, 4.0), (3, float("nan"))]) == 2
    assert S.count_spikes([(0, 5.0), (1, 5.5)]) == 0


def test_report_warns_when_runs_also_vary_an_axis_the_findings_pool_over(tmp_path):
    """A sweep over learning_rate as well: the report says the findings pool its values; without it, no caution."""
    from study.report.build import other_axes, report_text
    from study.report.read import RunData

    def with_params(s, **params):
        s.run = RunData(s.name, tmp_path, {"temperature": s.temperature, "seed": s.seed, **params}, {}, {}, {})
        return s

    runs = [with_params(run(t, seed), learning_rate=lr) for t in TEMPS for seed in SEEDS for lr in (1e-3, 3e-3)]
    assert other_axes(runs) == ["learning_rate"]
    assert "also vary `learning_rate`" in report_text("x", "x", runs, runs, {}, None, [])
    same = [with_params(run(t, seed), learning_rate=1e-3) for t in TEMPS for seed in SEEDS]
    assert other_axes(same) == [] and "Caution" not in report_text("x", "x", same, same, {}, None, [])


# ---- the two-sided band rule for "grows like x^a" ---------------------------------------------------------------
@pytest.mark.parametrize(
    "lo, hi, expected, side",
    [
        (-1.1, -0.9, SUPPORTED, ""),  # a slope of -1: inside -1 +- 0.25
        (-0.35, -0.25, NOT_SUPPORTED, "shallower than T^-1"),  # -0.3: too flat
        (-4.9, -4.5, NOT_SUPPORTED, "steeper than T^-1"),  # -4.7: far steeper, which contradicts 1/T as well
        (-1.4, -1.0, INCONCLUSIVE, ""),  # straddles the band's lower edge
        (float("nan"), -1.0, INCONCLUSIVE, ""),
    ],
)
def test_band_rule_is_two_sided(lo, hi, expected, side):
    from study.report.stats import BandRule

    rule = BandRule(claimed=-1.0, width=0.25)
    interval = Interval((lo + hi) / 2, lo, hi, 3)
    assert rule.verdict(interval) == expected
    assert rule.side(interval) == side


def test_band_rule_needs_a_band():
    from study.report.stats import BandRule

    with pytest.raises(ValueError, match="width=0"):
        BandRule(claimed=-1.0, width=0)
