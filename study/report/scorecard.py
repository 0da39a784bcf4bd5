"""The scorecard and report.json: the findings as one row per tested claim, and as data others can regenerate from.

The scorecard heads report.md: for each finding, the paper's value (`Finding.paper_value`), ours with its interval,
the verdict and the experiment it comes from (frozen model, probe, or training). report.json holds the same rows,
every finding and sanity check in full, and the multiplicity family, so that `scripts/readme_results.py` can write
the README's table from a committed copy of it (docs/results/main.json) rather than by hand. The markdown of the
table is built here only, from the JSON's plain rows, so report.md and the README cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from study.report.findings import Finding, SanityCheck
from study.report.stats import Family, percent

SCHEMA = 1  # report.json's layout version: bump it when a key changes meaning
SCORECARD_KEYS = ("claim", "paper", "ours", "verdict", "experiment")
OUTSIDE = "†"  # marks a row outside the Bonferroni family (descriptive, underpowered, or without an interval)
SCORECARD_HEADER = ("claim", "paper", "ours [CI]", "verdict", "experiment")


def scorecard_rows(found: list[Finding]) -> list[dict[str, str]]:
    """One row per finding: the paper's value, ours with its interval, the verdict, the experiment."""
    return [
        {
            "claim": f.claim,
            "paper": f.paper_value or "-",
            "ours": f.value,
            "verdict": f.verdict,
            "experiment": f.experiment or "-",
            "family": f.family,
        }
        for f in found
    ]


def family_dict(family: Family) -> dict[str, Any]:
    return {
        "method": family.method,
        "size": family.size,
        "confidence": family.confidence,
        "level": family.level,
        "describe": family.describe(),
    }


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def scorecard_markdown(rows: list[dict[str, str]], family: dict[str, Any]) -> str:
    """The scorecard as a markdown table with the family's level in the header and one line below it."""
    for i, row in enumerate(rows):
        missing = [k for k in SCORECARD_KEYS if k not in row]
        if missing:
            raise ValueError(f"scorecard row {i} ({row.get('claim', '?')!r}) lacks {', '.join(missing)}")
    header = list(SCORECARD_HEADER)
    header[2] = f"ours [{percent(family['level'])} CI]"
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    # A row without "family" (a report.json written before it existed) was judged in the family.
    outside = [not row.get("family", True) for row in rows]
    lines += ["| " + " | ".join(_cell(row[k]) + (OUTSIDE if k == "verdict" and out else "") for k in SCORECARD_KEYS)
              + " |" for row, out in zip(rows, outside)]  # fmt: skip
    lines += ["", f"Intervals: {family['describe']}."]
    if any(outside):
        lines += ["", f"{OUTSIDE} Outside the family: descriptive rows, underpowered rows (their interval was wider "
                  "than the rule could use; their value says how many replicates would decide them), rows without an "
                  "interval (the learning-rate bracket), and labelled rows, whose label says why they test nothing "
                  "(too few, diagnostic, observed, outside the paper's regime, numerically fragile, ...). They keep "
                  "their value but do not set the family's level."]  # fmt: skip
    return "\n".join(lines)


def _interval(f: Finding) -> dict[str, float] | None:
    iv = f.interval
    return None if iv is None else {"estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n, "level": iv.level}


def report_json(
    title: str, source: str, runs: dict[str, int], found: list[Finding], checks: list[SanityCheck], family: Family,
    model: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Everything the report judged, as JSON-ready data (no timestamps, so two identical reports are equal)."""
    findings = []
    for f in found:
        row = {k: v for k, v in dataclasses.asdict(f).items() if k != "interval"}
        row["interval"] = _interval(f)
        findings.append(row)
    return {
        "schema": SCHEMA,
        "title": title,
        "source": source,
        "model": model,
        "runs": runs,
        "family": family_dict(family),
        "scorecard": scorecard_rows(found),
        "findings": findings,
        "sanity_checks": [dataclasses.asdict(c) for c in checks],
    }
