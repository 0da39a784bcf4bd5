"""The controls: planted settings whose verdict is known by construction must get it, through the study's measuring
code and the findings' own rules (study/report/controls.py)."""

from __future__ import annotations

import json
import math

import pytest

from study.report import controls as C
from study.report.stats import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED


@pytest.fixture(scope="module")
def found():
    return C.controls()


def test_every_control_gets_its_expected_verdict(found):
    got = [(c.finding.claim, c.name, c.finding.verdict) for c in found]
    assert [c.finding.verdict for c in found] == [c.expected for c in found], got
    # both outcomes are reached for each claim: a rule that could only say one thing would fail here (the bracket,
    # a rule without an interval, also reaches its third outcome: the same learning rates stable at both T)
    assert sorted(c.expected for c in found) == sorted([SUPPORTED, NOT_SUPPORTED] * 12 + [INCONCLUSIVE])
    assert all(c.passed for c in found)


def test_the_controls_are_judged_at_the_single_interval_level_even_inside_a_family():
    """The controls' verdicts do not depend on the findings' Bonferroni level (they are outside the family): judged
    once per process, whatever level is in force when the report asks for them."""
    from study.report.stats import Family, family_level

    with family_level(Family(20)):
        inside = C.controls()
    assert all(c.finding.interval is None or c.finding.interval.level == pytest.approx(0.95) for c in inside)


@pytest.mark.slow
def test_near_uniform_rows_measure_one_over_t_and_saturated_rows_do_not():
    """The measurements themselves, not only the verdicts: near-uniform rows give T x g constant (1/T exactly, up to
    the tiny logits' first-order effect); saturated rows give g rising with T at low T."""
    for levels in (C.g_levels(C.NEAR_UNIFORM_SCALE), C.jacobian_levels(C.NEAR_UNIFORM_SCALE)):
        scaled = [t * v for t, vs in levels.items() for v in vs[:1]]
        assert max(scaled) / min(scaled) == pytest.approx(1, abs=0.01)
    for levels in (C.g_levels(C.SATURATED_SCALE), C.jacobian_levels(C.SATURATED_SCALE)):
        means = {t: math.exp(sum(map(math.log, vs)) / len(vs)) for t, vs in levels.items()}  # as the slope averages
        assert means[0.25] < means[0.5] < means[1.0]


@pytest.mark.parametrize("opposed", [0, 3, 8])
def test_the_planted_top_n_geometry_has_the_n_s_it_was_built_for(opposed):
    """Theorem 2's control is known by construction: N_s counted by the definition, row by row and without the
    analysis's code (s = sum over the top N of alpha_i x_i, r = min over the other visible keys of |s - alpha_j x_j|,
    N_s = #{i in the top N: |s - alpha_i x_i| < r}), is N - opposed in every row with a key outside the top N, after
    the rotation and on vectors already of norm 1 (the analysis's sphere)."""
    import torch

    weights, vectors = C.planted_separability(opposed, window=5)
    w, x = weights[0, 0], vectors[0, 0]
    assert torch.allclose(x.norm(dim=-1), torch.ones(len(x), dtype=x.dtype))
    n = C.SEPARABILITY_N
    for row in range(n, C.SEPARABILITY_LENGTH):
        a = w[row, : row + 1]
        assert a.sum().item() == pytest.approx(1)
        top = torch.argsort(a, descending=True, stable=True)[:n]
        rest = [j for j in range(row + 1) if j not in set(top.tolist())]
        s = (a[top, None] * x[top]).sum(0)
        r = min((s - a[j] * x[j]).norm().item() for j in rest)
        n_s = sum((s - a[i] * x[i]).norm().item() < r for i in top.tolist())
        assert n_s == n - opposed


def test_the_critical_n_control_finds_the_planted_n0_in_every_window_and_length():
    """Through Algorithm 3's own results step: each window's KS test finds N* = the planted first N where d = E
    (27 heads: three times larger d below it is told apart, equal d and E never are)."""
    for first_equal in (C._small_ratio, C._large_ratio, C._fixed):
        block = C.critical_results(first_equal)["alg3_critical_n_by_window"]
        expected = [[first_equal(w, li, n) for li, n in enumerate(C.CRITICAL_LENGTHS)] for w in range(C.WINDOWS)]
        assert block["n_star"][str(C.ALPHA)] == expected, first_equal.__name__


def test_the_separability_control_reads_the_planted_share_per_window():
    """Through Algorithm 4's own step: each window's value is its planted (N - opposed) / N."""
    for opposed in C.SEPARABILITY_OPPOSED.values():
        got = C.separability_results(opposed)["alg4_separability_by_window"]["median_over_heads"]
        assert [row[0] for row in got] == pytest.approx([(C.SEPARABILITY_N - m) / C.SEPARABILITY_N for m in opposed])


def test_the_planted_runs_are_read_back_through_summarize():
    """The drift and gap controls go through the summary of a run's scalars: the values the findings pool are the
    planted ones (drift per run, and the fraction of the step-0 gap left per low-T run)."""
    from study.report.summary import SELECTION_DRIFT, VAL_LOSS_BASELINE

    drift = C.drift_runs(0.1)
    assert len(drift) == 3 * C.SEEDS
    assert [r.values[SELECTION_DRIFT] for r in drift] == pytest.approx(
        [0.1 + C._jitter(r.seed) / 2 for r in drift])
    gap = C.gap_runs(0.9)
    low = {r.seed: r for r in gap if r.temperature == 0.1}
    ref = {r.seed: r for r in gap if r.temperature == 1.0}
    for seed in range(C.SEEDS):
        start = low[seed].values[VAL_LOSS_BASELINE] - ref[seed].values[VAL_LOSS_BASELINE]
        end = low[seed].final[C.tags.VAL_LOSS] - ref[seed].final[C.tags.VAL_LOSS]
        assert end / start == pytest.approx(0.9 + C._jitter(seed))


def test_the_depth_controls_per_layer_norms_are_read_back_through_summarize():
    """The planted per-layer W_q and W_k series come back from `layer_gradients` as the planted attention-logit norm
    of each layer (sqrt(q^2 + k^2)), at every T and seed."""
    for run in C.depth_runs(-0.2):
        change = -0.2 + C._jitter(run.seed) / 2
        assert sorted(run.layer_grads["W_q,W_k"]) == list(range(C.DEPTH_LAYERS))
        for layer, norm in run.layer_grads["W_q,W_k"].items():
            assert norm == pytest.approx(run.temperature ** (-0.3 + change * (C.DEPTH_LAYERS - layer)))


def test_the_bracket_controls_runs_are_read_back_through_summarize():
    """The SGD bracket's planted runs come back from `summarize` as the sweep's runs do: optimizer and learning rate
    from the sweep's axes, a diverged run unstable, a calm one stable (no spike in its loss curve)."""
    runs = C.bracket_runs(lambda t, lr: lr >= 1 or t < 1)
    assert len(runs) == len(C.BRACKET_TEMPERATURES) * len(C.BRACKET_LRS) * C.BRACKET_SEEDS
    for run in runs:
        assert (run.optimizer, run.top_k) == ("sgd", None) and run.learning_rate in C.BRACKET_LRS
        assert run.unstable == (run.learning_rate >= 1 or run.temperature < 1)
        assert run.diverged == run.unstable
        if not run.diverged:
            assert run.values[C.SPIKES] == 0 and run.steps == C.STEPS


def test_the_frozen_gradient_control_is_one_over_t_on_near_uniform_rows():
    """Algorithm 5 through the frozen analysis's own step: T x g is the same at every T (max over heads, per
    window) for rows near uniform even at T = 0.01."""
    g = C.frozen_gradient_results(C.FROZEN_NEAR_UNIFORM_SCALE)["alg5_gradient_by_window"]["g_max_over_heads"]
    for window in g:
        scaled = [t * per_t[0] for t, per_t in zip(C.FROZEN_TEMPERATURES, window)]
        assert max(scaled) / min(scaled) == pytest.approx(1, abs=1e-3)


def test_a_wrong_expectation_is_reported_as_a_failure(found):
    """What the report shows when a control's verdict differs from the expected one."""
    wrong = C.Control(found[0].name, NOT_SUPPORTED, found[0].finding)
    assert not wrong.passed
    section = "\n".join(C.section([wrong]))
    assert "| FAIL |" in section and C.controls_json([wrong])[0]["passed"] is False


@pytest.mark.slow
def test_the_report_carries_the_control_section(tmp_path):
    """build_report (what `make quick` runs at the end of its sweep) writes the section and report.json's controls."""
    from study.report import build_report
    from tests.test_report_scorecard import fake_sweep

    path = build_report(fake_sweep(tmp_path))
    data = json.loads((path.parent / "report.json").read_text())
    assert [c["verdict"] for c in data["controls"]] == [c["expected"] for c in data["controls"]]
    assert len(data["controls"]) == 25 and all(c["passed"] for c in data["controls"])
    text = path.read_text()
    section = text.split("## Controls")[1].split("\n## ")[0]
    assert section.count("| pass |") == 25 and "FAIL" not in section.split("|", 1)[1].replace("A FAIL means", "")
