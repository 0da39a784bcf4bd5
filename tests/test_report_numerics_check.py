"""`study report --numerics-check`: the same design on two numerics paths, every verdict compared."""

from __future__ import annotations

from study.report.build import Sweep, judged, judged_on_two_paths
from study.report.markdown import numerics_sentence
from study.report.stats import FRAGILE, SUPPORTED
from tests.test_report_findings import step0_runs

LAST = "5. the last layer's W_q/W_k gradient"


def by_claim(found):
    return {LAST if f.claim.startswith(LAST) else f.claim: f for f in found}


def test_a_verdict_that_differs_between_paths_is_fragile_in_both_and_leaves_the_family():
    """Path A's last layer grows like 1/T, path B's (the same design, other rounding) like T^-2: the row is labelled
    numerically fragile on both sides, with the other path's reading in its value, and the family shrinks by it;
    the depth rows, which agree, keep their verdicts."""
    a, b = Sweep(step0_runs(-1.0), None, None), Sweep(step0_runs(-2.0), None, None)
    alone = by_claim(judged(a.primary, None)[0])
    assert alone[LAST].verdict == SUPPORTED and alone[LAST].family
    (found, family), check = judged_on_two_paths(a, b, "logs/b")
    rows = by_claim(found)
    assert rows[LAST].verdict == FRAGILE and not rows[LAST].family
    assert "logs/b: not supported" in rows[LAST].rule and "its rule alone would read: supported" in rows[LAST].value
    assert family.size == judged(a.primary, None)[1].size - 1
    assert check["fragile"] == [next(c for c in (f.claim for f in found) if c.startswith(LAST))]
    assert any("(depth) the W_q,W_k" in c for c in check["same_verdict"]) and check["unmatched"] == []
    (other, _), other_check = judged_on_two_paths(b, a, "logs/a")  # the other way round: the same row
    assert by_claim(other)[LAST].verdict == FRAGILE and other_check["fragile"] == check["fragile"]
    assert "1 differed and are labelled numerically fragile" in numerics_sentence({"numerics_check": check})


def test_identical_paths_leave_every_verdict_and_the_family_as_they_were():
    a = Sweep(step0_runs(-1.0), None, None)
    (found, family), check = judged_on_two_paths(a, Sweep(step0_runs(-1.0), None, None), "logs/same")
    alone, alone_family = judged(a.primary, None)
    assert [f.verdict for f in found] == [f.verdict for f in alone] and family == alone_family
    assert check["fragile"] == [] and len(check["same_verdict"]) == len(found)
    assert "No second numerics path" in numerics_sentence({})


def test_the_command_refuses_a_check_folder_that_is_not_a_sweep(tmp_path, capsys):
    from study.report.command import main

    sweep = tmp_path / "s"
    (sweep / "run").mkdir(parents=True)
    (sweep / "run" / "status.json").write_text("{}")
    assert main([str(sweep), "--numerics-check", str(tmp_path / "nope")]) == 2
    assert "--numerics-check" in capsys.readouterr().err and not (sweep / "report").exists()


