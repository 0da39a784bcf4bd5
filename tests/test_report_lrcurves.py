"""The from-scratch learning-rate section: LR sensitivity against a hand computation, stable/diverged, the largest
stable LR, and each pre-registered rule (docs/findings.md) with cases that come out true and false."""

import math

import pytest

from study.report.lrcurves import (
    LRRun,
    design_checks,
    draw_lr_curves,
    finding_collapse_precedes_divergence,
    gather,
    lr_findings,
    lr_sensitivity,
    sign_test,
    sign_verdict,
)
from study.report.stats import Interval

GRID = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
L0 = 5.0


def test_lr_sensitivity_by_hand():
    # capped: [4, 3, 2.5, 5 (nan), 5 (6 > L0)]; mean 19.5 / 5 = 3.9; best 2.5 -> 1.4
    assert lr_sensitivity([4.0, 3.0, 2.5, math.nan, 6.0], L0) == pytest.approx(1.4)
    assert lr_sensitivity([2.0, 2.0, 2.0], L0) == 0.0  # a flat curve is insensitive
    assert lr_sensitivity([None, None], L0) == 0.0  # nothing trained: the best is L0 itself


def _run(t=1.0, lr=1e-2, seed=0, arm="softmax", final=3.0, nonfinite=False, l0=L0, **kw):
    return LRRun(f"T{t}_{arm}_lr{lr}_s{seed}", t, arm, seed, lr, l0, None if nonfinite else final, nonfinite, **kw)


def test_stable_and_diverged_defined_once():
    assert _run(final=4.9).stable
    assert _run(final=5.1).diverged  # above the loss at init
    assert _run(nonfinite=True).diverged
    assert _run(final=math.inf).diverged
    assert _run(final=5.0).stable  # equal to L0 is not above it


def test_divergence_step_and_collapse_before_it():
    stopped = _run(nonfinite=True, stop_step=7, collapse_step=5)
    assert stopped.divergence_step == 7 and stopped.collapse_before_divergence
    late = _run(nonfinite=True, stop_step=7, collapse_step=7)
    assert not late.collapse_before_divergence  # the same step is not before
    drifted = _run(final=6.0, train_loss=((0, 5.0), (5, 4.0), (10, 5.5), (15, 7.0)), collapse_step=5)
    assert drifted.divergence_step == 10 and drifted.collapse_before_divergence
    assert _run(final=3.0, collapse_step=2).divergence_step is None


def _curve_losses(temperature, seed, width):
    """A basin of the given width: loss 2 at the middle LR, rising towards the ends, diverged beyond ``width``."""
    out = {}
    for i, lr in enumerate(GRID):
        distance = abs(i - 2)
        out[lr] = None if distance > width else 2.0 + 0.5 * distance + 0.01 * seed
    return out


def _sweep(widths: dict[tuple[float, str], int], seeds=range(8), top_diverges=True):
    runs = []
    for (t, arm), width in widths.items():
        for s in seeds:
            for lr, loss in _curve_losses(t, s, width).items():
                if top_diverges and lr == GRID[-1] and t == 1.0 and arm == "softmax":
                    loss = None
                runs.append(_run(t, lr, s, arm, final=loss, nonfinite=loss is None, stop_step=3 if loss is None else None))
    return runs


def _by_key(found):
    return {f.key: f for f in found}


def test_narrower_curves_at_low_t_support_findings_1_2_and_4():
    runs = _sweep({(0.1, "softmax"): 0, (0.3, "softmax"): 1, (1.0, "softmax"): 1,
                   (0.1, "qk_norm"): 1, (0.3, "qk_norm"): 1, (1.0, "qk_norm"): 1})
    # seed-dependent noise so the intervals are not degenerate
    found, checks, family = lr_findings(runs)
    assert all(c.passed for c in checks), checks
    f = _by_key(found)
    assert f["1"].verdict == "supported", f["1"]
    assert f["2"].verdict == "supported", f["2"]  # lr* 1e-2 at T = 0.1 vs 3e-2 at T = 1 in all 8 seeds
    assert f["4a"].verdict == "supported", f["4a"]
    assert f["4b"].verdict == "supported", f["4b"]
    assert family.size == 6 and family.level == pytest.approx(1 - 0.05 / 6)
    assert f["3a"].verdict == "underpowered"  # no max logit in these synthetic runs


def test_wider_curves_at_low_t_do_not_support_findings_1_and_2():
    runs = _sweep({(0.1, "softmax"): 2, (0.3, "softmax"): 1, (1.0, "softmax"): 1})
    f = _by_key(lr_findings(runs)[0])
    assert f["1"].verdict == "not supported", f["1"]
    assert f["2"].verdict == "not supported", f["2"]


def test_sign_test_needs_enough_untied_seeds():
    assert sign_test(3, 0, 0.05 / 6)[0] == "underpowered"  # 0.5^3 > alpha: no count of 3 could decide
    assert sign_test(8, 0, 0.05 / 6)[0] == "supported"
    assert sign_test(0, 8, 0.05 / 6)[0] == "not supported"
    assert sign_test(5, 4, 0.05 / 6)[0] == "inconclusive"


def test_sign_verdict_both_ways():
    assert sign_verdict(Interval(1, 0.5, 1.5, 5), +1) == "supported"
    assert sign_verdict(Interval(-1, -1.5, -0.5, 5), +1) == "not supported"
    assert sign_verdict(Interval(-1, -1.5, -0.5, 5), -1) == "supported"
    assert sign_verdict(Interval(0, -1, 1, 5), -1) == "inconclusive"


def test_design_checks_fail_without_a_basin_or_a_high_end_failure():
    flat = _sweep({(1.0, "softmax"): 2}, top_diverges=False)  # everything stable: no failure at the high end
    checks = design_checks(gather(flat))
    assert [c.passed for c in checks] == [True, False]
    found = lr_findings(flat)[0]
    assert all(f.verdict.startswith("underpowered: the grid does not bracket") for f in found)


def test_collapse_precedes_divergence_rule_true_false_and_underpowered():
    level = 1 - 0.05 / 6
    collapsed_first = [_run(lr=lr, seed=s, nonfinite=True, stop_step=9, collapse_step=4) for s in range(10) for lr in (0.1,)]
    assert finding_collapse_precedes_divergence(collapsed_first, level).verdict == "supported"
    never = [_run(lr=0.1, seed=s, nonfinite=True, stop_step=9) for s in range(10)]
    assert finding_collapse_precedes_divergence(never, level).verdict == "not supported"
    assert finding_collapse_precedes_divergence(never[:4], level).verdict == "underpowered"
    value = finding_collapse_precedes_divergence(collapsed_first + [_run(seed=1, collapse_step=3)], level).value
    assert "10 of 10" in value and "control: 1 of 1 stable runs collapsed" in value
    unlogged = [_run(lr=0.1, seed=s, nonfinite=True, stop_step=9, collapse_logged=False) for s in range(10)]
    finding = finding_collapse_precedes_divergence(unlogged, level)
    assert finding.verdict == "underpowered" and "not logged" in finding.value  # never "not supported" by absence


def test_logit_growth_rule_reads_the_max_logit_series():
    runs = []
    for s in range(4):
        for t in (0.1, 1.0):
            for lr in GRID:
                growth = (10 if t == 0.1 else 2) * (1 + 0.05 * s)  # faster at lower T
                diverged = lr == GRID[-1] and t == 1.0
                runs.append(_run(t, lr, s, final=None if diverged else 3.0 + abs(math.log10(lr) + 2), nonfinite=diverged,
                                 max_logit=((0, 1.0), (10, growth))))
    f = _by_key(lr_findings(runs)[0])
    assert f["3a"].verdict == "supported", f["3a"]
    assert "reference LR 0.03" in f["3a"].value  # the largest LR stable everywhere


@pytest.mark.slow  # matplotlib's import and one figure: seconds
def test_incomplete_curves_are_left_out_and_the_figure_draws(tmp_path):
    runs = _sweep({(0.1, "softmax"): 1, (1.0, "softmax"): 1}, seeds=range(3))
    curves = gather(runs[:-1])  # the last run missing: its curve is incomplete
    assert len(curves.incomplete) == 1 and len(curves.complete) == 5
    assert draw_lr_curves(curves, tmp_path) and (tmp_path / "lr_curves.png").stat().st_size > 1000


def _summary(params, scalars, state="finished", loaded=None):
    from pathlib import Path

    from study.report.read import RunData
    from study.report.summary import summarize

    resolved = {"model": {"model_name_or_path": loaded, "learning_rate": params["learning_rate"], "optimizer": "adamw"}}
    run = RunData("r", Path("."), params, {"state": state, "global_step": 4}, resolved, scalars)
    return summarize(run)


def test_runs_from_summaries_keep_their_arm_and_their_own_loss_at_init():
    from study import tags
    from study.report.lrcurves import is_lr_sweep, lr_run

    base = {"temperature": 0.1, "top_k": None, "normalizer": "softmax", "seed": 2, "learning_rate": 0.03}
    stopped = _summary({**base, "qk_norm": True}, {tags.VAL_LOSS: [(0, 7.5)]}, state="diverged")
    run = lr_run(stopped)
    assert (run.arm, run.init_loss, run.nonfinite, run.diverged, run.seed) == ("qk_norm", 7.5, True, True, 2)
    folded = lr_run(_summary({**base, "temperature_in": "init"}, {tags.VAL_LOSS: [(0, 7.4), (10, 5.0)]}))
    assert (folded.arm, folded.init_loss, folded.final_loss, folded.stable) == ("init_scale", 7.4, 5.0, True)
    assert lr_run(_summary(base, {tags.VAL_LOSS: [(0, 7.4), (10, 5.0)]})).arm == "softmax"
    assert lr_run(_summary({**base, "output_gate": True}, {tags.VAL_LOSS: [(0, 7.4), (10, 5.0)]})).arm == "output_gate"
    sweep = [_summary({**base, "learning_rate": lr}, {}) for lr in (1e-3, 1e-2, 1e-1)]
    assert is_lr_sweep(sweep)
    fine_tuned = [_summary({**base, "learning_rate": lr}, {}, loaded="gpt2") for lr in (1e-3, 1e-2, 1e-1)]
    assert not is_lr_sweep(fine_tuned)  # a fine-tuning sweep over LRs gets no from-scratch section


def test_the_learning_rate_section_and_the_findings_bracket_cannot_disagree_on_stable():
    """One definition of stable (study.report.summary.diverged) for every table: planted runs where the old two
    differed. At T = 1 one run at lr 1 spikes yet ends below its loss at init (the findings' bracket called it
    unstable, the learning-rate section stable); at T = 0.03 every run at lr 1 ends finite but above its loss at
    init (the section called it diverged, the bracket stable). The old pages gave lr* at T = 1 as 0.1 in one table
    and 1 in the other."""
    from study.report import markdown as md
    from study.report import summary as S
    from study.report.findings import lr_stability_findings
    from study.report.lrcurves import lr_section

    def summary(t, lr, seed):
        above = t == 0.03 and lr == 1.0
        s = S.Summary(f"T{t}_lr{lr}_s{seed}", t, None, seed=seed, learning_rate=lr, final={"val/loss": 6.0 if above else 4.0},
                      values={S.VAL_LOSS_BASELINE: L0, S.SPIKES: 2 if (t, lr, seed) == (1.0, 1.0, 0) else 0})
        return s

    runs = [summary(t, lr, seed) for t in (0.03, 1.0) for lr in (0.01, 0.1, 1.0) for seed in range(3)]
    section = lr_section(runs)
    per_seed = {}
    for c in section.data["curves"]:
        per_seed.setdefault(c["temperature"], set()).add(c["largest_stable_lr"])
    assert per_seed == {0.03: {0.1}, 1.0: {1.0}}
    (bracket,) = lr_stability_findings(runs)
    assert "largest stable lr T=0.03: 0.1, T=1: 1;" in bracket.value and bracket.verdict == "supported"
    table = md.stability_table(runs)
    assert "| 0.03 | 0.01: 0/3, 0.1: 0/3, 1: 3/3 | 0.1 |" in table and "| 1 | 0.01: 0/3, 0.1: 0/3, 1: 0/3 | 1 |" in table
    # the per-T table's "diverged" column counts the same runs
    assert S.Summary("x", 1.0, None, final={"val/loss": 6.0}, values={S.VAL_LOSS_BASELINE: L0}).diverged
    assert not S.Summary("x", 1.0, None, values={S.VAL_LOSS_BASELINE: L0, S.SPIKES: 3}).diverged
