"""The scorecard heads report.md and report.json holds the same rows: built from each finding's paper value,
interval, verdict and experiment, judged as one Bonferroni family."""

from __future__ import annotations

import json
import math

import pytest

from study import tags
from study.report.findings import Finding, SanityCheck
from study.report.scorecard import SCHEMA, report_json, scorecard_markdown, scorecard_rows
from study.report.stats import SUPPORTED, Family, Interval
from tests.test_report import write_fake_run

TEMPS = (0.01, 0.03, 0.1)  # three levels in the paper's regime (T <= 0.1): the last-layer row is judged


def finding(claim="5. gradients grow like 1/T", value="-1 [-1.2, -0.8]", paper="1/T (slope -1)", experiment="probe"):
    return Finding(claim, "slope 0", "slope", value, SUPPORTED, "rule", paper, experiment, Interval(-1.0, -1.2, -0.8, 4))


def test_scorecard_rows_and_markdown():
    rows = scorecard_rows([finding(), finding("6. low T | unstable", "too few: 2 runs", "", "")])
    assert rows[0] == {"claim": "5. gradients grow like 1/T", "paper": "1/T (slope -1)", "ours": "-1 [-1.2, -0.8]",
                       "verdict": SUPPORTED, "experiment": "probe", "family": True}  # fmt: skip
    assert rows[1]["paper"] == "-" and rows[1]["experiment"] == "-"  # an unfilled field shows, it is not hidden
    family = Family(2)
    text = scorecard_markdown(rows, {"level": family.level, "describe": family.describe()})
    lines = text.splitlines()
    assert lines[0] == "| claim | paper | ours [97.5% CI] | verdict | experiment |"
    assert lines[2] == "| 5. gradients grow like 1/T | 1/T (slope -1) | -1 [-1.2, -0.8] | supported | probe |"
    assert "6. low T \\| unstable" in lines[3]  # a pipe in a claim does not break the table
    assert "family of the 2 findings" in lines[-1] and "97.5%" in lines[-1]
    with pytest.raises(ValueError, match="row 0 .* lacks verdict"):
        scorecard_markdown([{"claim": "x", "paper": "", "ours": "", "experiment": ""}], {"level": 0.95, "describe": ""})


def test_report_json_holds_every_finding_with_its_interval():
    data = report_json("s", "logs/s", {"finished": 3}, [finding()], [SanityCheck("a", "b", True)], Family(1), model="m")
    assert data["schema"] == SCHEMA and data["model"] == "m" and data["runs"] == {"finished": 3}
    assert data["family"]["size"] == 1 and data["family"]["level"] == pytest.approx(0.95)
    assert data["findings"][0]["interval"] == {"estimate": -1.0, "lo": -1.2, "hi": -0.8, "n": 4, "level": 0.95}
    assert data["findings"][0]["paper_value"] == "1/T (slope -1)" and data["scorecard"][0]["ours"] == "-1 [-1.2, -0.8]"
    assert data["sanity_checks"] == [{"statement": "a", "value": "b", "passed": True}]
    assert json.loads(json.dumps(data)) == data


def fake_sweep(tmp_path):
    """9 softmax runs (3 T x 3 seeds) whose W_q/W_k gradients (the training steps' and the float64 ones at step 0,
    of a one-block model) grow like 1/T, and a probe.json."""
    sweep = tmp_path / "fake"
    runs = []
    for i, t in enumerate(TEMPS):
        for seed in range(3):
            name, params = f"T{t:g}_kall_softmax_s{seed}", {"temperature": t, "top_k": None, "normalizer": "softmax", "seed": seed}
            noise = math.exp(0.05 * ((seed + i) % 3 - 1))
            write_fake_run(sweep, name, params, {
                "train/loss": [(0, 5.0), (1, 4.0)], "val/ppl": [(2, 40.0 / t**0.5 * noise)],
                "grad_norm/attn_q": [(0, noise / t), (1, noise / t)], "grad_norm/attn_k": [(0, noise / t), (1, noise / t)],
                tags.fp64_grad_norm("block_0/attn_q"): [(0, noise / t)], tags.fp64_grad_norm("block_0/attn_k"): [(0, noise / t)],
            })  # fmt: skip
            runs.append({"name": name, "params": params})
    (sweep / "plan.json").write_text(json.dumps({"sweep": "fake", "runs": runs}))
    (sweep / "probe").mkdir()
    results = [{"temperature": t, "jacobian": {"saturated_fraction": 0.1},
                "windows": [{"grad_attn_qk": (1 + 0.05 * b) / t} for b in range(4)]} for t in TEMPS]  # fmt: skip
    probe = {"model": "tiny-model", "windows": 4, "seq_len": 16, "text": "fake", "results": results,
             "single_layer": [{"layer": 0, "results": results}]}
    (sweep / "probe" / "probe.json").write_text(json.dumps(probe))
    return sweep


def test_report_md_starts_with_the_scorecard_and_report_json_matches_it(tmp_path):
    from study.report import build_report

    path = build_report(fake_sweep(tmp_path))
    text = path.read_text()
    data = json.loads((path.parent / "report.json").read_text())
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[:3] == ["## In plain words", "## Scorecard", "## Findings"]
    from study.report.markdown import plain_summary  # the opening words: generated from the same JSON

    assert text.split("## In plain words\n\n")[1].startswith(plain_summary(data))
    family = data["family"]
    # a measurement, an underpowered row or one without an interval is not in the family
    judged = [f for f in data["findings"] if f["family"]]
    assert all(f["verdict"] not in ("descriptive", "underpowered") and f["interval"] for f in judged)
    assert [r["family"] for r in data["scorecard"]] == [f["family"] for f in data["findings"]]
    assert family["size"] == len(judged) and len(data["findings"]) == len(data["scorecard"]) and family["size"] >= 1
    assert family["level"] == pytest.approx(1 - 0.05 / family["size"])
    scorecard = text.split("## Scorecard")[1].split("## Findings")[0]
    assert scorecard_markdown(data["scorecard"], family) in scorecard  # the same rows, rendered by the same code
    assert data["model"] == "tiny-model" and data["runs"] == {"finished": 9}
    grads = next(f for f in data["findings"] if f["claim"].startswith("5. the last layer's"))
    assert grads["experiment"] == "training" and grads["paper_value"] == "1/T" and grads["family"]
    assert grads["interval"]["level"] == pytest.approx(family["level"]) and grads["verdict"] == SUPPORTED
    assert grads["interval"]["lo"] < -1 < grads["interval"]["hi"]
    whole = next(f for f in data["findings"] if f["claim"].startswith("5. (whole network"))
    assert whole["verdict"] == "diagnostic (depth compounding)" and not whole["family"]
    # the findings table's header names the family's level, not 95%
    assert f"value [{100 * family['level']:.4g}% CI]" in text.split("## Findings")[1]
    assert all(row["paper"] != "-" and row["experiment"] in {"training", "probe"} for row in data["scorecard"])


def test_rows_outside_the_family_are_marked_and_explained():
    """An underpowered or interval-less row is marked in the verdict column, with a line saying why; a row from a
    report.json written before `family` existed renders as before (the README's committed JSON still matches)."""
    family = {"level": Family(1).level, "describe": Family(1).describe()}
    inside, outside = scorecard_rows([finding(), finding("6. low T is unstable", "underpowered: needs about 21")])
    outside["family"], outside["verdict"] = False, "underpowered"
    text = scorecard_markdown([inside, outside], family)
    assert "| supported | probe |" in text and "| underpowered† | probe |" in text
    assert "† Outside the family" in text
    old = [{k: v for k, v in row.items() if k != "family"} for row in (inside, outside)]
    assert "†" not in scorecard_markdown(old, family)
