"""README.md's "What the default run found": how its numbers were made is the final checks' record and the main job's
grid.

The findings themselves are not typed: the block that opens the section is rendered from docs/results/main.json
(`scripts/readme_results.py`, checked by tests/test_report_readme.py), the opening of the report in plain words and
its scorecard, so a number there is the report's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from study.report.stats import fmt
from study.sweep import build_plan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PLAN = build_plan(ROOT / "configs" / "sweeps" / "default.yaml")
STEPS = yaml.safe_load((ROOT / "configs/sweeps/default.yaml").read_text())["overrides"]["trainer.max_steps"]


def test_the_default_runs_opening_is_the_record_and_the_grid():
    """The paragraph of "What the default run found" that says how its numbers were made: its commit, date, time and memory are the final checks'
    record (docs/results/checks.json, whose block the README also carries) and its runs the main job's grid."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("final_checks", ROOT / "scripts" / "final_checks.py")
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    record = json.loads((RESULTS / "checks.json").read_text())
    demo = next(s for s in record["steps"] if s["step"] == "demo")
    text = (ROOT / "README.md").read_text()
    start = text.index("## What the default run found")
    section = text[start : text.index("\n## ", start + 1)]
    opening = " ".join(section[section.index("How these numbers were made") :].split())
    grid = [r for r in PLAN.runs if r.params["top_k"] is None and r.params["optimizer"] != "sgd"]
    temps = sorted({r.params["temperature"] for r in grid})
    top8 = sorted({r.params["temperature"] for r in PLAN.runs if r.params["top_k"] == 8})
    sgd = [r for r in PLAN.runs if r.params["optimizer"] == "sgd"]
    expected = [
        f"on a fresh clone of commit {record['commit']}",
        f"{record['date'].split()[0]} (its wall time",
        f"{checks.clock(demo['wall_s'])}, {'within' if demo['wall_s'] <= 20 * 60 else 'over'} the 20-minute budget",
        f"with the largest process at {demo['max_rss_kib'] / 2**20:.2f} GiB resident",
        f"{len(PLAN.runs)} fine-tuning runs of {STEPS} attention-only AdamW steps",
        f"(T in {{{', '.join(fmt(t) for t in temps)}}} x {len({r.params['seed'] for r in grid})} seeds with all keys",
        f"a top-8 arm of one seed at T = {', '.join(fmt(t) for t in top8[:-1])} and {fmt(top8[-1])}",
        f"a plain-SGD arm of {len(sgd)} runs)",
    ]
    missing = [words for words in expected if words not in opening]
    assert not missing, f"README.md's 'What the default run found' opening no longer says: {missing}"



def test_the_readme_is_a_front_door():
    """At most 220 lines, and its first screen holds what it is, the two commands and the findings' section."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines: move detail to docs/"
    first_screen = "\n".join(lines[:40])
    assert "make demo" in first_screen and "make test" in first_screen
    assert "## What the default run found" in first_screen
