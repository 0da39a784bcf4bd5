"""The controls: planted settings whose verdict is known by construction must get it, through the study's measuring
code and the findings' own rules (study/report/controls.py)."""

from __future__ import annotations

import json
import math

import pytest

from study.report import controls as C
from study.report.stats import NOT_SUPPORTED, SUPPORTED


@pytest.fixture(scope="module")
def found():
    return C.controls()


def test_every_control_gets_its_expected_verdict(found):
    got = [(c.finding.claim, c.name, c.finding.verdict) for c in found]
    assert [c.finding.verdict for c in found] == [c.expected for c in found], got
    # both outcomes are reached for each claim: a rule that could only say one thing would fail here
    assert sorted(c.expected for c in found) == sorted([SUPPORTED, NOT_SUPPORTED] * 3)
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
    assert len(data["controls"]) == 6 and all(c["passed"] for c in data["controls"])
    text = path.read_text()
    section = text.split("## Controls")[1].split("\n## ")[0]
    assert section.count("| pass |") == 6 and "FAIL" not in section.split("|", 1)[1].replace("A FAIL means", "")
