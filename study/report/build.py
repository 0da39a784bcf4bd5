"""`build_report`: read a sweep, summarise its runs, judge the findings, draw the figures, write report.md.

The concerns live in their own modules: `read` (event files and status), `summary` (per-run numbers), `stats`
(intervals and the verdict rule), `findings` (the claims and sanity checks), `figures`, `markdown`.
"""

from __future__ import annotations

import json
from pathlib import Path

from study.report import markdown as md
from study.report import tags
from study.report.figures import figures, normalizers
from study.report.findings import findings, sanity_checks
from study.report.probe import draw_layers
from study.report.probe_section import section as probe_section
from study.report.read import load_sweep, read_json
from study.report.summary import Summary, dedupe, summarize

WANTED_TAGS = (
    tags.TRAIN_LOSS, tags.VAL_LOSS, tags.VAL_PPL, *tags.ATTENTION_TAGS, tags.GRAD_NORM, tags.GRAD_Q, tags.GRAD_K,
    tags.JACOBIAN, tags.FRAC_ABOVE_QUARTER_T, tags.FRAC_ABOVE_SQRT2, tags.FRAC_SATURATED, tags.SATURATED_ROWS,
)  # fmt: skip


def load_probe(sweep_dir: Path) -> dict | None:
    """`<sweep>/probe/probe.json` as written by `study probe`, if the sweep ran it (a damaged one is named, and
    the report goes without it)."""
    path = sweep_dir / "probe" / "probe.json"
    if not path.is_file():
        return None
    problems: list[str] = []
    probe = read_json(path, problems)
    for line in problems:
        print(f"study report: {line}", flush=True)
    return probe


PAPER_AXES = ("temperature", "top_k", "normalizer", "seed")  # what the findings group and pool runs by


def other_axes(summaries: list[Summary]) -> list[str]:
    """Grid axes beyond the paper's (e.g. learning_rate) whose values differ between these runs."""
    values: dict[str, set[str]] = {}
    for s in summaries:
        for key, value in (s.run.params if s.run is not None else {}).items():
            if key not in PAPER_AXES:
                values.setdefault(key, set()).add(json.dumps(value))
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def report_text(
    title: str, source: str, summaries: list[Summary], all_runs: list[Summary], made: dict[str, str], probe: dict | None,
    missing: list[str], probe_figure: str | None = None,
) -> str:  # fmt: skip
    """The markdown of report.md from what `build_report` gathered (no file access)."""
    states: dict[str, int] = {}
    for s in all_runs:
        for _ in range(1 + len(s.same_as)):
            states[s.state] = states.get(s.state, 0) + 1
    merged = sum(len(s.same_as) for s in all_runs)
    normalizers = sorted({s.normalizer for s in all_runs})
    others = other_axes(all_runs)
    parts = [
        f"# Sweep report: {title}",
        "",
        f"{sum(states.values())} runs: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        + (f" ({merged} identical by construction to another run, counted once)" if merged else "")
        + f". Source: `{source}`.",
        "",
        "## Findings",
        "",
        *(
            [f"Caution: these runs also vary {', '.join(f'`{k}`' for k in others)}. The findings pool the runs of one "
             "temperature and top-k as replicates across those values; sweep them apart to judge each value.", ""]
            if others else []
        ),
        md.findings_table(findings(summaries, probe)),
        "",
        md.definitions(),
        "",
        "## Sanity checks (true by mathematics: they test the code, not the paper)",
        "",
        md.sanity_table(sanity_checks(summaries)),
        "",
        *probe_section(probe, probe_figure),
        "## Per temperature (softmax, k = all; mean [95% CI] over seeds)",
        "",
        md.per_t_table(summaries),
        "",
    ]
    if len(normalizers) > 1:
        parts += [
            "## Normalisers",
            "",
            f"Findings use the softmax runs ({len(summaries)}); every normaliser's runs, medians over all T, k, seeds:",
            "",
            md.table(md.NORMALIZER_COLUMNS, md.normalizer_rows(all_runs)),
            "",
        ]
    parts += ["## Runs", "", md.table(md.RUN_COLUMNS, md.run_rows(all_runs)), "", "## Figures", ""]
    for name, what in made.items():
        parts += [f"### {what}", "", f"![{what}]({name})", ""]
    if missing:
        parts += ["## Not logged", "", "Not found in any run (no finding uses made-up values): "]
        parts += [", ".join(f"`{t}`" for t in missing), ""]
    return "\n".join(parts)


def build_report(sweep_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    plan, runs = load_sweep(sweep_dir)
    all_runs = dedupe([summarize(r) for r in runs])
    # The paper's claims are about softmax: findings and the T x k figures use the softmax runs.
    primary = [s for s in all_runs if s.normalizer == "softmax"] or all_runs
    made = figures(primary, out) if primary else {}
    if len({s.normalizer for s in all_runs}) > 1:
        made["normalizers.png"] = normalizers(all_runs, out)
    logged = {t for r in runs for t in r.scalars}
    missing = [t for t in WANTED_TAGS if t not in logged]
    probe = load_probe(sweep_dir)
    probe_figure = draw_layers(probe, out) and "probe_layers.png" if probe and probe.get("results") else None
    text = report_text(
        plan.get("sweep", sweep_dir.name), str(sweep_dir), primary, all_runs, made, probe, missing, probe_figure
    )
    path = out / "report.md"
    path.write_text(text)
    return path
