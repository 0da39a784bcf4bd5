"""report.md: findings and sanity checks, a per-temperature table with intervals, normalisers, runs, figures."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np

from study import tags
from study.report import sources
from study.report import summary as S
from study.report.effects import against_paper, opening
from study.report.findings import (
    STEP0_GRADIENT,
    Finding,
    SanityCheck,
    gradient_source,
    k_all,
    layer_slopes,
    main_arm,
    stability_by_lr,
    step0,
)
from study.report.stats import (
    CONFIDENCE,
    DEPTH_DIAGNOSTIC,
    DESIGN_DEPENDENT,
    DIAGNOSTIC,
    FRAGILE,
    LABELS,
    MIN_REPLICATES,
    NOT_COMPUTABLE,
    OBSERVED,
    OBSERVED_ONE_RUN,
    OUTSIDE_REGIME,
    TOO_FEW,
    TooFew,
    confidence,
    fmt,
    geometric_interval,
    mean_interval,
    percent,
)
from study.report.summary import Summary, largest_stable_lr
from study.report.table import table


def findings_table(found: list[Finding]) -> str:
    return table(
        ["claim (docs/paper.md)", "null", "statistic", f"value [{percent(confidence())} CI]", "verdict", "rule"],
        [[f.claim, f.null, f.statistic, f.value, f.verdict, f.rule] for f in found],
    )


def sanity_table(checks: list[SanityCheck]) -> str:
    status = {True: "pass", False: "FAIL", None: "not checked"}
    return table(["statement (true by mathematics)", "measured", "result"], [[c.statement, c.value, status[c.passed]] for c in checks])


def _cell(values: list[float | None], log: bool = False) -> str:
    """A descriptive cell over runs: the mean with its t-interval from MIN_REPLICATES runs on, on the scale the
    quantity lives on (``log``: the geometric mean with the interval of the mean log, for positive quantities that
    span decades, whose linear interval would run below zero); runs that all gave the same value are that value with
    their count (a zero-width interval says nothing); fewer runs give the plain mean with n."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    if max(values) == min(values):
        return f"{fmt(values[0])} (all {len(values)} equal)" if len(values) > 1 else f"{fmt(values[0])} (n=1)"
    if log and min(values) > 0:
        try:
            return str(geometric_interval(values))
        except TooFew:
            return f"{fmt(math.exp(float(np.mean(np.log(values)))))} (n={len(values)})"
    try:
        return str(mean_interval(values))
    except TooFew:
        return f"{fmt(float(np.mean(values)))} (n={len(values)})"


def _count_cell(events: int, n: int) -> str:
    """Events out of n runs with the exact (Clopper-Pearson) interval of the fraction: 0 of 3 reads
    "0/3 [0, 0.708]", the same bound a finding gives, never a zero-width "0 [0, 0]"."""
    from scipy.stats import binomtest

    if n == 0:
        return "-"
    ci = binomtest(events, n).proportion_ci(confidence_level=CONFIDENCE, method="exact")
    return f"{events}/{n} [{fmt(ci.low, 3)}, {fmt(ci.high, 3)}]"


PER_T_NOTE = (
    f"Cells: the mean over seeds with its {percent(CONFIDENCE)} t-interval; columns marked (geometric) are positive "
    "quantities that span decades: the geometric mean with the interval of the mean log, mapped back. A value that "
    "every run gave alike is shown once with its count (no interval: no spread); fewer than "
    f"{MIN_REPLICATES} runs give the mean with n. Unstable runs: events/runs with the exact (Clopper-Pearson) "
    f"{percent(CONFIDENCE)} interval of the fraction."
)


def per_t_table(summaries: list[Summary]) -> str:
    """One row per T over the k = all softmax runs of the main arm: means over seeds with their intervals, on the
    quantity's own scale (`_cell`), and the unstable runs as a count with its exact interval."""
    runs = k_all(main_arm(summaries))
    columns: list[tuple[str, Callable[[Summary], float | None], bool]] = [
        ("step-0 val/loss", lambda s: s.values.get(S.VAL_LOSS_BASELINE), False),
        ("final val/loss", lambda s: None if s.nonfinite else s.final.get(tags.VAL_LOSS), False),
        ("change from step 0", lambda s: _change(s), False),
        ("final val/ppl (geometric)", lambda s: None if s.nonfinite else s.final.get(tags.VAL_PPL), True),
        ("\\|grad W_q,W_k\\| (geometric)", lambda s: s.values.get(S.GRAD_QK), True),
        ("Jacobian (geometric)", lambda s: s.values.get(S.JACOBIAN), True),
        ("largest entry x 4T", lambda s: s.values.get(S.ENTRY_RATIO), False),
        ("rows near 1/(4T)", lambda s: s.values.get(S.NEAR_QUARTER), False),
        ("saturated (sampled)", lambda s: s.values.get(S.SATURATED), False),
        ("saturated (all val rows)", lambda s: s.final.get(sources.SATURATED_ROWS), False),
        (f"H(top-{sources.SELECTION_K})/log {sources.SELECTION_K}", lambda s: s.values.get(S.SELECTION_FINAL), False),
        (f"selection TV (k={sources.SELECTION_K}, val)", lambda s: s.final.get(sources.VAL_SELECTION_TV), False),
        ("max logit (val)", lambda s: s.final.get(sources.MAX_LOGIT), False),
        ("sink rate (val)", lambda s: s.final.get(sources.SINK_RATE), False),
    ]
    rows = []
    for t in sorted({s.temperature for s in runs}):
        group = [s for s in runs if s.temperature == t]
        cells = [_cell([value(s) for s in group], log) for _, value, log in columns]
        unstable = _count_cell(sum(s.unstable for s in group), len(group))
        rows.append([f"{t:g}", str(len(group)), str(sum(s.diverged for s in group)), *cells, unstable])
    return table(["T", "runs", "diverged", *[name for name, _, _ in columns], "unstable runs [exact CI]"], rows)


def _change(s: Summary) -> float | None:
    start, end = s.values.get(S.VAL_LOSS_BASELINE), s.final.get(tags.VAL_LOSS)
    return None if s.nonfinite or start is None or end is None else end - start


def layer_table(summaries: list[Summary]) -> str:
    """One row per layer: the log-log slope against T of each parameter group's gradient norm (point estimates
    from the per-T geometric means over seeds; the depth findings carry the intervals)."""
    slopes = layer_slopes(summaries)
    if not slopes:
        if any(s.layer_grads for s in k_all(main_arm(summaries))):
            return "Per-layer gradient norms were logged at fewer than 2 temperatures: no slope against T."
        return "No per-layer gradient norms were logged (GradientNormMonitor `by: [block_kind]`)."
    groups = list(slopes)
    layers = sorted({layer for by_layer in slopes.values() for layer in by_layer})
    n_layers = layers[-1] + 1
    rows = [[str(layer), str(n_layers - layer), *(fmt(slopes[g].get(layer), 3) for g in groups)] for layer in layers]
    return table(["layer", "low-T layers crossed", *(f"slope {g}" for g in groups)], rows) + fp64_sentence(summaries)


def fp64_sentence(summaries: list[Summary]) -> str:
    """What the per-layer slopes rest on (`gradient_source`), as a sentence after a table: the float64 step-0
    norms, or the float32 medians with the levels left out where a layer's step-0 fp32 gradient is off fp64."""
    runs = k_all(main_arm(summaries))
    if step0(runs):
        return f"\n\nSlopes of the {STEP0_GRADIENT}, at every T."
    note = gradient_source(runs)[2]
    return f"\n\nLevels left out of these slopes: {note.removeprefix('; left out, ')}." if note else ""


def stability_table(summaries: list[Summary]) -> str:
    """Diverged runs per optimizer, T and learning rate (softmax, k = all, every arm), and the largest stable rate:
    both read `study.report.summary.diverged`, as the learning-rate section does."""
    by_opt = stability_by_lr(summaries)
    rows = []
    for optimizer, by_t in sorted(by_opt.items()):
        for t, cells in sorted(by_t.items()):
            outcome = ", ".join(f"{fmt(lr)}: {sum(s.diverged for s in runs)}/{len(runs)}" for lr, runs in sorted(cells.items()))
            rows.append([optimizer, f"{t:g}", outcome, fmt(largest_stable_lr(cells))])
    return table(["optimizer", "T", "learning rate: diverged / runs", "largest stable lr"], rows)


NORMALIZER_COLUMNS = ["normalizer", "runs", "diverged", "median val/ppl", "median H/log n", "median non-zero keys", "median grad norm"]


def normalizer_rows(summaries: list[Summary]) -> list[list[str]]:
    """One row per normaliser: medians over its runs (all T, k and seeds) of the final values."""

    def med(values: list[float | None]) -> str:
        values = [v for v in values if v is not None and math.isfinite(v)]
        return fmt(float(np.median(values))) if values else "-"

    rows = []
    for name in sorted({s.normalizer for s in summaries}):
        group = [s for s in summaries if s.normalizer == name]
        rows.append(
            [
                name,
                str(len(group)),
                str(sum(s.diverged for s in group)),
                med([s.final.get(tags.VAL_PPL) for s in group if not s.nonfinite]),
                med([s.final.get(sources.NORMALIZED_ENTROPY) for s in group]),
                med([s.final.get(sources.NONZERO) for s in group]),
                med([s.values.get(S.GRAD_NORM) for s in group]),
            ]
        )
    return rows


RUN_COLUMNS = [
    "run", "T", "k", "normalizer", "optimizer", "lr", "seed", "state", "steps", "clip", tags.TRAIN_LOSS, tags.VAL_LOSS, tags.VAL_PPL, "H/log n",
    "KL uniform", "grad norm (median)", "clipped frac", "spikes", "skipped", "reason", "identical runs",
]  # fmt: skip


def collapse_section(summaries: list[Summary]) -> list[str]:
    """The entropy-collapse events the runs' status files record (EntropyCollapseAlert), one line each; none: no
    section."""
    lines = [
        f"- {s.name}: layer {e.get('layer')} at step {e.get('step')}, H/log n {fmt(e.get('value'))} "
        f"(step 0: {fmt(e.get('reference'))}; {e.get('rule')})"
        for s in summaries if s.run is not None for e in s.run.status.get("collapse_events") or []
    ]
    return ["## Entropy collapse (EntropyCollapseAlert)", "", *lines, ""] if lines else []


def run_rows(summaries: list[Summary]) -> list[list[str]]:
    rows = []
    for s in summaries:
        spikes = s.values.get(S.SPIKES)
        rows.append(
            [
                s.name, f"{s.temperature:g}", s.k_label, s.normalizer, s.optimizer, fmt(s.learning_rate),
                "" if s.seed is None else str(s.seed), s.state,
                "" if s.steps is None else str(s.steps), fmt(s.clip) if s.clip else "off",
                fmt(s.final.get(tags.TRAIN_LOSS)), fmt(s.final.get(tags.VAL_LOSS)), fmt(s.final.get(tags.VAL_PPL)),
                fmt(s.final.get(sources.NORMALIZED_ENTROPY)), fmt(s.final.get(sources.KL_UNIFORM)),
                fmt(s.values.get(S.GRAD_NORM)), fmt(s.values.get(S.CLIPPED)),
                "" if spikes is None else str(spikes), str(s.skipped), s.reason, ", ".join(s.same_as),
            ]
        )  # fmt: skip
    return rows


def definitions() -> str:
    return (
        "Intervals: Student's t over runs (seeds) of a setting or over the probe's and the analysis's independent text windows (one slope per window), "
        "Welch's t for a difference of two groups, and for a slope over seeds a Welch-Satterthwaite t on the contrast "
        "of the per-T mean logs (study/report/stats.py says why). The findings are one family: each interval is at "
        f"the Bonferroni level in the table's header (and under the scorecard), so that all cover together with probability >= "
        f"{percent(CONFIDENCE)}; the per-temperature table's cells are descriptive {percent(CONFIDENCE)} intervals, "
        f"outside the family. Fewer than {MIN_REPLICATES} replicates per group gives no interval and an inconclusive "
        "verdict. "
        f"A loss spike is a logged `{tags.FIXED_BATCH_LOSS}` (one held-out batch, where logged; else "
        f"`{tags.TRAIN_LOSS}`) above {S.SPIKE_FACTOR} x the median of the {S.SPIKE_WINDOW} logged before it (or "
        "non-finite); "
        "a run diverged when it went non-finite or its final val/loss is above its step-0 one, else it is stable "
        "(one definition for every table and finding); an unstable run diverged, spiked or skipped a step. Saturated rows have max weight > 0.99. Runs that are the same "
        "function by construction (softmax top-1 at every T, same seed) are counted once (column `identical runs`). "
        "See docs/findings.md for each finding's null, statistic and rule."
    )


VERDICT_ORDER = ("supported", "not supported", "inconclusive", "underpowered", *LABELS, "descriptive")
VERDICT_WORDS = {
    "supported": "Supported by these runs",
    "not supported": "Not what these runs show",
    "inconclusive": "Undecided (the interval straddles the rule)",
    "underpowered": "Not decidable with these replicates (the row says how many would decide it)",
    TOO_FEW: "Too few replicates or levels for an interval",
    DIAGNOSTIC: "Diagnostic: explains another row, fixed in shape by the design or mathematics",
    DEPTH_DIAGNOSTIC: "Diagnostic of depth compounding (T in every layer: steeper than one layer's law by design)",
    OBSERVED: "Observed (another design is the test)",
    OBSERVED_ONE_RUN: "Observed (one run per cell: no replicate to test it)",
    OUTSIDE_REGIME: "Outside the paper's regime (too few levels at T <= 0.1)",
    DESIGN_DEPENDENT: "Design-dependent: a number the design sets (e.g. the heads a test pools)",
    NOT_COMPUTABLE: "Not computable: the statistic divides by a quantity the data cannot tell from 0",
    FRAGILE: "Numerically fragile: the verdict differed between two numerics paths of the same runs",
    "descriptive": "Measured, not tested (the paper states a bound there, not a rate)",
}


def numerics_sentence(data: dict) -> str:
    """What the verdicts were checked against, from report.json's ``numerics_check`` (`build.judged_on_two_paths`)."""
    check = data.get("numerics_check")
    if not check:
        return ("No second numerics path was compared: these verdicts are one machine's kernels and thread count "
                "(`study report --numerics-check` compares them).")
    fragile = check.get("fragile") or []
    return (f"Every verdict was compared with the same design run on a second numerics path (`{check['against']}`"
            + (f"; {check['path']}" if check.get("path") else "") + f"): {len(check.get('same_verdict') or [])} "
            f"claims gave the same verdict on both; {len(fragile)} differed and are labelled numerically fragile, "
            "outside the family" + (f" ({'; '.join(fragile)})" if fragile else "") + ".")


def plain_summary(data: dict) -> str:
    """The opening of report.md in plain words, generated from report.json's data (`scorecard.report_json`): the
    effect of T with its intervals (`effects.opening`, where the JSON has the per-T table), how many runs, how many
    claims came out which way, and each claim under its verdict with the paper's value and ours (estimate and
    interval; against the paper's 1/T in words, `effects.against_paper`). The README's scorecard is written from the
    same JSON."""
    runs = data.get("runs") or {}
    findings = data.get("findings") or []
    family = data.get("family") or {}
    count = ", ".join(f"{n} {state}" for state, n in sorted(runs.items()))
    by_verdict: dict[str, list[dict]] = {}
    for f in findings:
        by_verdict.setdefault(f.get("verdict", "?"), []).append(f)
    tally = ", ".join(f"{len(by_verdict[v])} {v}" for v in [*VERDICT_ORDER, *sorted(set(by_verdict) - set(VERDICT_ORDER))]
                      if v in by_verdict)  # fmt: skip
    level = family.get("level")
    effect = opening(data)
    lines = [*([effect, ""] if effect else []),
        f"{sum(runs.values())} runs ({count}); {len(findings)} claims judged: {tally}"
        + (f", every interval at {percent(level)} so that all cover together with probability >= "
           f"{percent(family.get('confidence', CONFIDENCE))}." if level else "."),
    ]  # fmt: skip
    lines += ["", numerics_sentence(data)]
    for verdict in [*VERDICT_ORDER, *sorted(set(by_verdict) - set(VERDICT_ORDER))]:
        if verdict not in by_verdict:
            continue
        lines += ["", f"**{VERDICT_WORDS.get(verdict, verdict)}:**", ""]
        for f in by_verdict[verdict]:
            iv = f.get("interval")
            ours = (f"{fmt(iv['estimate'], 3)} [{fmt(iv['lo'], 3)}, {fmt(iv['hi'], 3)}]" if iv
                    else f.get("value", "-").split(";")[0])  # fmt: skip
            paper = f.get("paper_value") or "-"
            claim = re.sub(r"^(\d+)\.", r"\1\\.", f.get("claim", "?"))  # "5. ..." in a bullet is not a numbered list
            words = against_paper(f)
            lines.append(f"- {claim}: paper {paper}, ours {ours} ({f.get('experiment') or '-'})"
                         + (f": {words}." if words else "."))
    return "\n".join(lines)
