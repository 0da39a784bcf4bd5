"""README.md's scorecard is written from a committed report.json (scripts/readme_results.py): the script fills
the marked block, `--check` fails when the page and the JSON differ, and bad inputs are refused by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from study.report.findings import Finding
from study.report.readme import BEGIN, END, README, RESULTS, begin_marker, main, render
from study.report.scorecard import report_json
from study.report.stats import Family, Interval
from tests.test_sweep import ROOT

PAGE = f"# Project\n\nText before.\n\n{BEGIN}\nan old table\n{END}\n\nText after.\n"


def results(tmp_path, value="-1.02 [-1.3, -0.74]"):
    found = [Finding("5. W_q, W_k gradients grow like 1/T", "slope 0", "slope", value, "supported", "rule",
                     "1/T (slope -1)", "probe", Interval(-1.02, -1.3, -0.74, 8))]  # fmt: skip
    path = tmp_path / "main.json"
    data = report_json("default", "logs/default", {"finished": 18}, found, [], Family(10), model="SmolLM2-135M-Instruct")
    path.write_text(json.dumps(data))
    return path


def test_the_script_writes_the_block_and_check_fails_on_a_difference(tmp_path, capsys):
    page = tmp_path / "README.md"
    page.write_text(PAGE)
    path = results(tmp_path)
    assert main(["--json", str(path), "--readme", str(page), "--check"]) == 1  # the old table
    assert "differs" in capsys.readouterr().err
    assert main(["--json", str(path), "--readme", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Project\n\nText before.\n\n") and text.endswith(f"{END}\n\nText after.\n")
    block = text.split(begin_marker(str(path)) + "\n")[1].split("\n" + END)[0]  # the marker names its JSON
    assert block == render(json.loads(path.read_text()), str(path))
    assert "| 5. W_q, W_k gradients grow like 1/T | 1/T (slope -1) | -1.02 [-1.3, -0.74] | supported | probe |" in block
    assert "ours [99.5% CI]" in block and "SmolLM2-135M-Instruct" in block and "18 finished" in block
    assert main(["--json", str(path), "--readme", str(page), "--check"]) == 0
    results(tmp_path, value="-1.05 [-1.3, -0.8]")  # a new report: the committed page no longer matches
    assert main(["--json", str(path), "--readme", str(page), "--check"]) == 1


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"schema": 1}', "lacks title, runs, family, scorecard"),
        ('{"schema": 99, "title": "x", "runs": {}, "family": {}, "scorecard": []}', "schema=99"),
    ],
)
def test_bad_results_files_are_refused_by_name(tmp_path, capsys, content, message):
    page, path = tmp_path / "README.md", tmp_path / "main.json"
    page.write_text(PAGE)
    if content is not None:
        path.write_text(content)
    assert main(["--json", str(path), "--readme", str(page)]) == 2
    err = capsys.readouterr().err
    assert "main.json" in err and message in err
    assert page.read_text() == PAGE


def test_a_page_without_exactly_one_block_is_refused(tmp_path, capsys):
    page, path = tmp_path / "README.md", results(tmp_path)
    for text in ("# no markers\n", PAGE + PAGE, f"{END}\n{BEGIN}\n"):
        page.write_text(text)
        assert main(["--json", str(path), "--readme", str(page)]) == 2
        assert "README.md" in capsys.readouterr().err and page.read_text() == text


def test_the_script_runs_from_a_checkout(tmp_path):
    page = tmp_path / "README.md"
    page.write_text(PAGE)
    cmd = [sys.executable, str(ROOT / "scripts" / "readme_results.py"), "--json", str(results(tmp_path)), "--readme", str(page)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| supported | probe |" in page.read_text()


def test_readme_scorecard_is_the_committed_results():
    """The front page's numbers are the main job's: README.md's block is what docs/results/main.json renders to."""
    if not RESULTS.is_file():
        pytest.skip("docs/results/main.json is not committed yet: run `make demo`, copy "
                    "logs/default/report/report.json there and run `python scripts/readme_results.py`")
    assert README.read_text().count(BEGIN) == 1
    assert main(["--check"]) == 0, "README.md differs from docs/results/main.json: run scripts/readme_results.py"


@pytest.mark.parametrize("study", ["smollm2-full", "smollm2-long", "smollm2-tgrid"])
def test_the_fuller_studys_pages_are_their_committed_results(study):
    """docs/results/<study>.md's scorecard is what its committed report (<study>.json) renders to: the fuller study
    the 200-step run of the main settings and its T grid between 0.1 and 1."""
    page, results = ROOT / "docs" / "results" / f"{study}.md", ROOT / "docs" / "results" / f"{study}.json"
    assert results.is_file() and page.is_file(), f"the {study} study's committed report or page is missing"
    assert main(["--json", str(results), "--readme", str(page), "--check"]) == 0, (
        f"docs/results/{study}.md differs from its JSON: run scripts/readme_results.py --json ... --readme ...")
    assert begin_marker(f"docs/results/{study}.json") in page.read_text()  # not main.json's marker


def test_a_learning_rate_sweeps_page_leads_with_its_own_findings(tmp_path):
    """A report.json with `lr_curves` (the from-scratch sweep) renders its design checks, findings and sensitivity
    table before the scorecard, from the JSON alone: the results page and the report show the same tables."""
    from study.report.lrcurves import SENSITIVITY_COLUMNS, lr_tables

    data = json.loads(results(tmp_path).read_text())
    data["lr_curves"] = {
        "family": {"size": 6, "level": 1 - 0.05 / 6},
        "design_checks": [{"statement": "basin: the best LR at T = 1 lies inside the grid", "passed": True,
                           "detail": "best mean final loss 4.2 at lr 0.01"}],
        "findings": [{"key": "1", "claim": "LR sensitivity rises as T falls", "statistic": "slope", "value": "-0.3 [-0.5, -0.1]",
                      "verdict": "supported", "rule": "supported if the interval < 0"}],
        "sensitivity": [["softmax", "1", "0.41 [0.3, 0.5]", "0.1, 0.3", "3 of 8", "0 of 8"]],
    }  # fmt: skip
    block = render(data, "docs/results/scratch.json")
    lines = block.split("\n")
    lr_at, card_at = lines.index("#### Learning-rate curves (from scratch)"), lines.index("#### The paper's claims on the same runs")
    assert lr_at < card_at and "\n".join(lr_tables(data["lr_curves"])) in block
    assert "| 1 | LR sensitivity rises as T falls | slope | -0.3 [-0.5, -0.1] | supported |" in block
    assert "| " + " | ".join(SENSITIVITY_COLUMNS) + " |" in block and "| softmax | 1 | 0.41 [0.3, 0.5] |" in block
    assert "| basin: the best LR at T = 1 lies inside the grid | yes |" in block
    assert "each at 99.17%" in block


@pytest.mark.parametrize("study", ["scratch", "scratch-replication", "scratch-replication-2"])
def test_the_from_scratch_studys_page_is_its_committed_results(study):
    """docs/results/<study>.md's tables (the learning-rate section, then the scorecard) are what its committed
    report (<study>.json) renders to, and the page shows the section's two figures."""
    page, results = ROOT / "docs" / "results" / f"{study}.md", ROOT / "docs" / "results" / f"{study}.json"
    assert results.is_file() and page.is_file(), f"the {study} study's committed report or page is missing"
    assert main(["--json", str(results), "--readme", str(page), "--check"]) == 0, (
        f"docs/results/{study}.md differs from its JSON: run scripts/readme_results.py --json ... --readme ...")
    text = page.read_text()
    assert begin_marker(f"docs/results/{study}.json") in text and "#### Learning-rate curves (from scratch)" in text
    for figure in (f"{study}/lr_curves.png", f"{study}/lr_max_logit.png"):
        assert f"({figure})" in text and (page.parent / figure).stat().st_size > 1000


def test_readme_from_scratch_sentence_is_the_pooled_page_opening():
    """The README's from-scratch result is the pooled page's opening, generated (study report --pool), not typed."""
    from study.report.readme import POOLED, POOLED_BEGIN, POOLED_END, pooled_opening

    if not POOLED.is_file():
        pytest.skip("docs/results/scratch-pooled/pooled.json is not committed yet")
    lines = README.read_text().split("\n")
    begin, end = lines.index(POOLED_BEGIN), lines.index(POOLED_END)
    assert "\n".join(lines[begin + 1 : end]) == pooled_opening(POOLED)


def test_the_pooled_block_is_replaced_and_refused_when_broken():
    from study.report.readme import POOLED_BEGIN, POOLED_END, ReadmeError, splice_pooled

    page = f"intro\n{POOLED_BEGIN}\nold sentence\n{POOLED_END}\nrest"
    assert splice_pooled(page, "new sentence") == f"intro\n{POOLED_BEGIN}\nnew sentence\n{POOLED_END}\nrest"
    assert splice_pooled("no block here", "x") == "no block here"
    with pytest.raises(ReadmeError, match="exactly one"):
        splice_pooled(page + f"\n{POOLED_END}", "x")
