"""`build_report`: read a sweep, summarise its runs, judge the findings, draw the figures, write report.md.

The concerns live in their own modules: `read` (event files and status), `summary` (per-run numbers), `stats`
(intervals, the multiplicity family and the verdict rules), `findings` (the claims and sanity checks), `scorecard`
(the scorecard and report.json), `figures`, `markdown`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from study import tags
from study.atomic import build_folder_whole, links_refused, replaced_folder_refused, write_text_atomically
from study.report import controls as planted_controls
from study.report import critical_effect, sources
from study.report import markdown as md
from study.report import origin as runs_origin
from study.report.effects import per_t_json
from study.report.figures import figures, normalizers, not_drawn
from study.report.findings import (
    Finding,
    depth_statement,
    excess_slopes,
    findings,
    main_arm,
    relabel,
    sanity_checks,
)
from study.report.frozen import frozen_findings, load_analysis
from study.report.lrcurves import lr_section
from study.report.probe import draw_layers
from study.report.probe_section import section as probe_section
from study.report.read import RESULT_STATES, load_sweep, read_optional_json
from study.report.scorecard import family_dict, report_json, scorecard_markdown, scorecard_rows
from study.report.stats import (
    CONFIDENCE,
    FRAGILE,
    Family,
    Interval,
    family_level,
    fmt,
    percent,
    simultaneous,
    tests_something,
)
from study.report.summary import Summary, dedupe, share_baselines, summarize
from study.report.tensorboard import write_report_events

WANTED_TAGS = (
    tags.TRAIN_LOSS, tags.VAL_LOSS, tags.VAL_PPL, *sources.ATTENTION_TAGS, tags.GRAD_NORM, tags.GRAD_Q, tags.GRAD_K,
    sources.JACOBIAN, sources.ENTRY_RATIO_MEAN, sources.NEAR_QUARTER_T, sources.FRAC_SATURATED, sources.SATURATED_ROWS,
)  # fmt: skip


def load_probe(sweep_dir: Path) -> dict | None:
    """`<sweep>/probe/probe.json` as written by `study probe`, if the sweep ran it (a damaged one is named, and
    the report goes without it)."""
    return read_optional_json(sweep_dir / "probe" / "probe.json")


PAPER_AXES = ("temperature", "top_k", "normalizer", "seed")  # what the findings group and pool runs by


def split_results(summaries: list[Summary]) -> tuple[list[Summary], list[Summary]]:
    """(runs whose state is a result, the others), each in the given order."""
    return [s for s in summaries if s.state in RESULT_STATES], [s for s in summaries if s.state not in RESULT_STATES]


def other_axes(summaries: list[Summary]) -> list[str]:
    """Grid axes beyond the paper's (e.g. learning_rate) whose values differ between these runs."""
    values: dict[str, set[str]] = {}
    for s in summaries:
        for key, value in (s.run.params if s.run is not None else {}).items():
            if key not in PAPER_AXES:
                values.setdefault(key, set()).add(json.dumps(value))
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def run_states(all_runs: list[Summary], not_counted: list[Summary] | None = None) -> dict[str, int]:
    """How many runs ended in each state, runs identical by construction counted as the runs they stand for."""
    states: dict[str, int] = {}
    for s in [*all_runs, *(not_counted or [])]:
        for _ in range(1 + len(s.same_as)):
            states[s.state] = states.get(s.state, 0) + 1
    return dict(sorted(states.items()))


def judged(
    summaries: list[Summary], probe: dict | None, analysis: dict | None = None, fragile: dict[str, str] | None = None
) -> tuple[list[Finding], Family]:  # fmt: skip
    """The findings (training, probe and frozen-model) judged together, each interval at the Bonferroni level of the
    family of rows that test something; each finding's `family` says whether it is one of them. A claim in
    ``fragile`` ({claim: what the other numerics path read}) is labelled `FRAGILE` and leaves the family."""
    fragile = fragile or {}

    def judge() -> list[Finding]:
        found = findings(summaries, probe) + frozen_findings(analysis)
        for f in found:
            if f.claim in fragile:
                relabel(f, FRAGILE, f"the verdict differs between two numerics paths of the same design ({fragile[f.claim]})")
        return found

    found, family = simultaneous(judge)
    for f in found:
        f.family = tests_something(f)
    return found, family


@dataclass
class Sweep:
    """What the judge reads of one sweep folder: its summaries (the softmax runs), probe and frozen analysis."""

    primary: list[Summary]
    probe: dict | None
    analysis: dict | None


def judged_on_two_paths(mine: Sweep, other: Sweep, other_name: str) -> tuple[tuple[list[Finding], Family], dict]:
    """Judge the same design run twice on two numerics paths (another CPU's kernels, another thread count): a claim
    whose verdict differs between the two is labelled numerically fragile in both and leaves both families, and both
    are judged again (a smaller family changes every interval's level), until no other verdict differs. Returns this
    sweep's judgement and the check as report.json data: each claim's verdict on the other path."""
    fragile: dict[str, str] = {}
    while True:  # ends: a fragile claim reads FRAGILE on both paths, so each pass adds new claims or none
        here = judged(mine.primary, mine.probe, mine.analysis, fragile)
        there = judged(other.primary, other.probe, other.analysis, fragile)
        theirs = {f.claim: f for f in there[0]}
        differ = {f.claim: f"here: {f.verdict}; {other_name}: {theirs[f.claim].verdict}, "
                  f"{theirs[f.claim].value.split(';')[0]}"
                  for f in here[0] if f.claim in theirs and theirs[f.claim].verdict != f.verdict}  # fmt: skip
        if not differ:
            break
        fragile.update(differ)
    rows = {f.claim: theirs[f.claim].verdict if f.claim in theirs else None for f in here[0]}
    return here, {
        "against": other_name,
        "fragile": sorted(fragile),
        "same_verdict": sorted(c for c, v in rows.items() if v is not None and c not in fragile),
        "unmatched": sorted(c for c, v in rows.items() if v is None),
    }


def read_sweep(sweep_dir: Path) -> tuple[dict, list, list[Summary], list[Summary], list[Summary], Sweep]:
    """(plan, runs, all result runs deduplicated, the unfinished or failed ones, the softmax runs, what the judge
    reads) of one sweep folder."""
    plan, runs = load_sweep(sweep_dir)
    results, not_counted = split_results(share_baselines([summarize(r) for r in runs]))
    all_runs = dedupe(results)  # only results: a failed top-1 run must not stand for the finished ones
    # The paper's claims are about softmax: findings and the T x k figures use the softmax runs.
    primary = [s for s in all_runs if s.normalizer == "softmax"] or all_runs
    return plan, runs, all_runs, not_counted, primary, Sweep(primary, load_probe(sweep_dir), load_analysis(sweep_dir))


def report_text(
    title: str, source: str, summaries: list[Summary], all_runs: list[Summary], made: dict[str, str], probe: dict | None,
    missing: list[str], judgement: tuple[list[Finding], Family] | None = None,
    not_counted: list[Summary] | None = None, probe_figure: str | None = None, plain: str | None = None,
    frozen_effect: list[str] | None = None, control_section: list[str] | None = None,
    origin_lines: list[str] | None = None, figures_not_drawn: dict[str, str] | None = None,
    outside: list | None = None,
) -> str:  # fmt: skip
    """The markdown of report.md from what `build_report` gathered (no file access). ``all_runs`` are the runs the
    findings may use; ``not_counted`` the unfinished or failed ones, listed apart; ``plain`` the summary in plain
    words (`markdown.plain_summary` of report.json's data) that opens it; ``figures_not_drawn`` {figure: why} the
    figures left out because they would show nothing, said in words under Figures; ``outside`` the run folders
    outside the plan's grid (`study.report.read.load_sweep`), listed apart."""
    not_counted = not_counted or []
    found, family = judgement or judged(summaries, probe)
    states = run_states(all_runs, not_counted)
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
        *([*origin_lines, ""] if origin_lines else []),
        *(["## In plain words", "", plain, ""] if plain else []),
        "## Scorecard",
        "",
        "One row per tested claim: the paper's value, ours with its interval, the verdict, and the experiment it "
        "comes from (frozen model, probe, or training). The findings below give each one's null, statistic and rule.",
        "",
        scorecard_markdown(scorecard_rows(found), family_dict(family)),
        "",
        "## Findings",
        "",
        *(
            [f"Not counted: {len(not_counted)} run(s) that did not finish ("
             + ", ".join(f"`{s.name}` {s.state}" for s in not_counted)
             + "); their partial logs are in no finding, figure or table below but `Runs`.", ""]
            if not_counted else []
        ),
        *([outside_line(outside), ""] if outside else []),
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
        _findings_table(found, family),
        "",
        md.definitions(),
        "",
        "## Sanity checks (true by mathematics: they test the code, not the paper)",
        "",
        md.sanity_table(sanity_checks(summaries)),
        "",
        *(control_section or []),
        *probe_section(probe, probe_figure),
        *(frozen_effect or []),
        "## Per temperature (softmax, k = all; mean [95% CI] over seeds)",
        "",
        md.PER_T_NOTE,
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
        *_excess_section(summaries),
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
    parts += md.collapse_section([*all_runs, *not_counted])
    parts += ["## Runs", "", md.table(md.RUN_COLUMNS, md.run_rows([*all_runs, *not_counted])), "", "## Figures", ""]
    for name, what in made.items():
        parts += [f"### {what}", "", f"![{what}]({name})", ""]
    parts += [f"{why}\n" for why in (figures_not_drawn or {}).values()]  # a figure that would show nothing, said in words
    if missing:
        parts += ["## Not logged", "", "Not found in any run (no finding uses made-up values): "]
        parts += [", ".join(f"`{t}`" for t in missing), ""]
    return "\n".join(parts)


def _excess_section(summaries: list[Summary]) -> list[str]:
    """The per-layer excess slope of W_q/W_k over W_v and W_o, with intervals over seeds (`excess_slopes`)."""
    excess = excess_slopes(summaries)
    if not excess:
        return []
    controls = list(excess)
    layers = sorted({layer for by_layer in excess.values() for layer in by_layer})
    cell = lambda v: str(v) if isinstance(v, Interval) else "-"  # noqa: E731
    rows = [[str(layer), *(cell(excess[c].get(layer)) for c in controls)] for layer in layers]
    return [
        "### Excess slope of W_q/W_k over the value and output projections, per layer",
        "",
        "Per seed, the log-log slope of a layer's |grad W_q,W_k| against T minus that of its |grad W_v| (or W_o): "
        "the part of the T-dependence that passes through the attention logits, since the controls cross the same "
        f"low-T layers above them. Mean over seeds [{percent(CONFIDENCE)} t-interval over seeds, each layer on its "
        "own: a description beside the findings, outside the family]; 0: nothing specific to the logits.",
        "",
        md.table(["layer", *(f"W_q,W_k - {c}" for c in controls)], rows) + md.fp64_sentence(summaries),
        "",
    ]


def excess_json(summaries: list[Summary]) -> dict[str, dict[str, dict | str]]:
    """`excess_slopes` as report.json data: {control: {layer: interval or why none}}."""
    return {control: {str(layer): ({"estimate": v.estimate, "lo": v.lo, "hi": v.hi, "n": v.n, "level": v.level}
                                   if isinstance(v, Interval) else v) for layer, v in by_layer.items()}
            for control, by_layer in excess_slopes(summaries).items()}  # fmt: skip


def _findings_table(found: list[Finding], family: Family) -> str:
    with family_level(family):  # the column header names the family's level
        return md.findings_table(found)


def outside_grid(outside: list) -> list[dict]:
    """report.json's record of the run folders outside the plan's grid: each named by its own recorded settings."""
    return [{"name": r.name, "state": r.state, "params": r.params,
             "gradient_clip_val": r.setting("trainer.gradient_clip_val"),
             "learning_rate": r.setting("model.learning_rate")} for r in outside]


def outside_line(outside: list) -> str:
    """report.md's line on the run folders outside the plan's grid."""
    listed = ", ".join(f"`{r.name}` {r.state} (learning rate {r.setting('model.learning_rate')}, clip "
                       f"{r.setting('trainer.gradient_clip_val') or 'off'})" for r in outside)
    return (f"Outside the grid: {len(outside)} run folder(s) that plan.json does not hold with these settings "
            f"(added with --run-index by another grid, or left by a grid shrunk since): {listed}; named by their "
            "own recorded settings, they are in no finding, figure or table of this report.")


def _mark_mixed(found: list[Finding], origin: runs_origin.Origin) -> None:
    """Every training finding (the rows the runs feed) says when its runs come from several source hashes."""
    for f in found:
        if f.experiment == "training":
            f.value += runs_origin.mixed_note(origin)


def _flag_mixed(data: dict, origin: runs_origin.Origin) -> None:
    """report.json's training rows (findings, scorecard, the learning-rate findings) name the source hashes
    they pool, when there are several."""
    if not origin.mixed:
        return
    rows = [*data["findings"], *data["scorecard"], *((data.get("lr_curves") or {}).get("findings") or [])]
    for row in rows:
        if row.get("experiment", "training") == "training":
            row["mixed_sources"] = origin.recorded


def sweep_origin(sweep_dir: Path, runs: list, allow_mixed_sources: bool) -> runs_origin.Origin:
    """The source hashes, commits and machines of a sweep's runs and its pretraining run; `MixedSources` when they
    differ and ``allow_mixed_sources`` is False."""
    pretrain_status = sweep_dir / "pretrain" / "status.json"  # the sweep's pretraining run, when it has one
    found = runs_origin.origin(runs, read_optional_json(pretrain_status) if pretrain_status.is_file() else None)
    runs_origin.check(found, allow_mixed_sources)
    return found


class ReportRefused(ValueError):
    """The report cannot be written without writing outside its folder or over files that are not a report's."""


# What a report folder holds (`build_report` writes nothing else), and the hidden temporary files of a killed write
REPORT_FILES = ("report.md", "report.json", "*.png", "events.out.tfevents.*", ".*.tmp*")


def output_refused(sweep_dir: Path, out: Path) -> str | None:
    """Why the report of ``sweep_dir`` may not be written to ``out`` (one line), or None: a link out of the sweep
    folder or out of ``out``, ``out`` itself a link, or files in ``out`` that the report would replace but did not
    write (the report replaces its folder as a whole, so a link that stays inside is replaced, never followed)."""
    if refused := links_refused(sweep_dir):
        return refused
    if out.is_dir() and not out.is_symlink() and not out.resolve().is_relative_to(sweep_dir.resolve()):
        # links inside the sweep folder were checked above; an --out elsewhere is checked as the sweep folder is
        if refused := links_refused(out):
            return refused
    return replaced_folder_refused(out, REPORT_FILES, "report")


def build_report(
    sweep_dir: str | Path, out_dir: str | Path | None = None, allow_mixed_sources: bool = False,
    numerics_check: str | Path | None = None,
) -> Path:  # fmt: skip
    """Write report.md, report.json and the figures of a sweep's runs into ``out_dir`` (default: <sweep>/report),
    built whole in a folder beside it and swapped in, so a kill or a full disk leaves the previous report as it was;
    `ReportRefused` (nothing written) for a link out of the sweep or of ``out_dir`` (`output_refused`);
    `MixedSources` (nothing written) when the runs recorded different source hashes and ``allow_mixed_sources`` is
    False. With ``numerics_check``, a second sweep folder of the same design and source run on another numerics
    path: every verdict is compared with it (`judged_on_two_paths`)."""
    sweep_dir = Path(sweep_dir)
    final = Path(out_dir) if out_dir else sweep_dir / "report"
    if refused := output_refused(sweep_dir, final):
        raise ReportRefused(refused)
    plan, runs, all_runs, not_counted, primary, mine = read_sweep(sweep_dir)
    origin = sweep_origin(sweep_dir, runs, allow_mixed_sources)
    check = None
    if numerics_check is not None:
        other_dir = Path(numerics_check)
        _, other_runs, *_, other = read_sweep(other_dir)
        other_origin = sweep_origin(other_dir, other_runs, allow_mixed_sources)
        both = runs_origin.Origin({**other_origin.sources, **origin.sources}, {}, {}, 0)
        runs_origin.check(both, allow_mixed_sources)  # two versions of the code are not two numerics paths
        judgement, check = judged_on_two_paths(mine, other, str(numerics_check))
        check["path"] = "; ".join(other_origin.machines)
        check["origin"] = runs_origin.origin_json(other_origin)
    else:
        judgement = judged(primary, mine.probe, mine.analysis)
    path = build_folder_whole(final, lambda out: _write_report(
        out, sweep_dir, plan, runs, all_runs, not_counted, primary, mine, origin, judgement, check,
    ))  # fmt: skip
    return final / path.name


def _write_report(
    out: Path, sweep_dir: Path, plan: dict, runs: list, all_runs: list[Summary], not_counted: list[Summary],
    primary: list[Summary], mine: Sweep, origin: runs_origin.Origin, judgement: tuple[list[Finding], Family],
    check: dict | None,
) -> Path:  # fmt: skip
    """Every file of the report, written into the empty folder ``out``; returns report.md's path."""
    made = figures(primary, out) if primary else {}
    if len({s.normalizer for s in all_runs}) > 1:
        made["normalizers.png"] = normalizers(all_runs, out)
    counted = {s.name for s in all_runs} | {name for s in all_runs for name in s.same_as}
    logged = {t for r in runs if r.name in counted for t in r.scalars}
    missing = [t for t in WANTED_TAGS if t not in logged]
    title, probe, analysis = plan.get("sweep", sweep_dir.name), mine.probe, mine.analysis
    probe_figure = draw_layers(probe, out) and "probe_layers.png" if probe and probe.get("results") else None
    frozen_effect = critical_effect.section(analysis, critical_effect.draw(analysis, out))
    # a from-scratch learning-rate sweep's own section (study.report.lrcurves)
    lr_curves = lr_section(all_runs, out, value_note=runs_origin.mixed_note(origin))
    found, family = judgement
    _mark_mixed(found, origin)
    data = report_json(
        title, str(sweep_dir), run_states(all_runs, not_counted), found, sanity_checks(primary), family,
        model=(probe or {}).get("model"),
    )  # fmt: skip
    data["origin"] = runs_origin.origin_json(origin)
    if plan.get("outside_grid"):
        data["outside_grid"] = outside_grid(plan["outside_grid"])
    data["excess_slopes"] = excess_json(primary)
    data["per_t"] = per_t_json(primary)
    if check is not None:
        data["numerics_check"] = check
    found_controls = planted_controls.controls()  # planted settings with known verdicts (study.report.controls)
    data["controls"] = planted_controls.controls_json(found_controls)
    if analysis and analysis.get("alg3_effect_size"):
        data["theorem1_effect_size"] = critical_effect.effect_json(analysis)
    if lr_curves is not None:
        data["lr_curves"] = lr_curves.data
    _flag_mixed(data, origin)
    plain = md.plain_summary(data)
    if origin.mixed:  # the summary quotes some values by their interval alone: it says so once, first
        plain = (f"These runs come from {len(origin.recorded)} source hashes ({origin.counts()}), pooled with "
                 f"{runs_origin.ALLOW_OPTION}: every training row pools them.\n\n{plain}")
    text = report_text(
        title, str(sweep_dir), primary, all_runs, made, probe, missing, judgement, not_counted, probe_figure,
        plain=plain, frozen_effect=frozen_effect, figures_not_drawn=not_drawn(primary, made),
        control_section=planted_controls.section(found_controls), origin_lines=runs_origin.header_lines(origin),
        outside=plan.get("outside_grid"),
    )  # fmt: skip
    if lr_curves is not None:
        text += "\n" + lr_curves.markdown
    path = out / "report.md"
    write_text_atomically(path, text)
    write_text_atomically(out / "report.json", json.dumps(data, indent=1) + "\n")
    # the same summary, scorecard and figures in TensorBoard (Text and Images of the run "report")
    drawn = [name for name in [*made, probe_figure] if name and (out / name).is_file()]
    write_report_events(out, plain, scorecard_markdown(data["scorecard"], data["family"]), drawn)
    return path
