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
from study.report.findings import depth_statement, findings, main_arm, sanity_checks
from study.report.read import load_sweep, read_json
from study.report.stats import fmt
from study.report.summary import Summary, dedupe, share_baselines, summarize

WANTED_TAGS = (
    tags.TRAIN_LOSS, tags.VAL_LOSS, tags.VAL_PPL, *tags.ATTENTION_TAGS, tags.GRAD_NORM, tags.GRAD_Q, tags.GRAD_K,
    tags.JACOBIAN, tags.ENTRY_RATIO_MEAN, tags.NEAR_QUARTER_T, tags.FRAC_SATURATED, tags.SATURATED_ROWS,
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
    missing: list[str],
) -> str:  # fmt: skip
    """The markdown of report.md from what `build_report` gathered (no file access)."""
    states: dict[str, int] = {}
    for s in all_runs:
        for _ in range(1 + len(s.same_as)):
            states[s.state] = states.get(s.state, 0) + 1
    merged = sum(len(s.same_as) for s in all_runs)
    normalizers = sorted({s.normalizer for s in all_runs})
    main = main_arm(all_runs)
    others = other_axes(main)
    arms = len(all_runs) - len(main)
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
            [f"The findings use the main arm ({main[0].optimizer}, learning rate {fmt(main[0].learning_rate)}: "
             f"{len(main)} runs); the {arms} runs of the other arms enter only the stability table and the "
             "learning-rate finding.", ""]
            if arms and main else []
        ),
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
        "## Per temperature (softmax, k = all; mean [95% CI] over seeds)",
        "",
        "Step 0 is the frozen model under the new T, validated before the first update (BaselineValidation); "
        "training is read as the change from it.",
        "",
        md.per_t_table(summaries),
        "",
        "## Per layer (slope of each gradient norm against T; softmax, k = all)",
        "",
        depth_statement(summaries),
        "",
        md.layer_table(summaries),
        "",
        "## Stability by optimizer and learning rate (softmax, k = all, every arm)",
        "",
        md.stability_table(summaries),
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
    all_runs = dedupe(share_baselines([summarize(r) for r in runs]))
    # The paper's claims are about softmax: findings and the T x k figures use the softmax runs.
    primary = [s for s in all_runs if s.normalizer == "softmax"] or all_runs
    made = figures(primary, out) if primary else {}
    if len({s.normalizer for s in all_runs}) > 1:
        made["normalizers.png"] = normalizers(all_runs, out)
    logged = {t for r in runs for t in r.scalars}
    missing = [t for t in WANTED_TAGS if t not in logged]
    text = report_text(
        plan.get("sweep", sweep_dir.name), str(sweep_dir), primary, all_runs, made, load_probe(sweep_dir), missing
    )
    path = out / "report.md"
    path.write_text(text)
    return path
