"""The Wortsman-scale study's pooled page: its registered family of eight tests, judged on the pooled parts.

The design and its tests are docs/findings.md, "The Wortsman-scale study (pre-registered before its runs)"; its spec
is configs/sweeps/wortsman.yaml. `study report --pool` judges this family when the parts are that design (their
curves carry the gated arm); every other pooling is `study.report.pooled`'s page, unchanged.

What is judged (the seed is the unit; S is LR sensitivity over Wortsman et al.'s range only, `pooled.restricted`):

- 1s, 1q, 1g: per seed and arm, the least-squares slope of S against log10 T over the registered temperatures; the
  t-interval of the mean slope (supported below 0);
- 2: lr* over the whole grid at the lowest T against T = 1 (softmax), the stratified exact sign test
  (`pooled.stable_lr_finding`, `lrcurves.sign_test`);
- 3: at `lrcurves.reference_lr`, per seed the slope of G = log10(max logit last / step 0) against log10 T
  (`lrcurves.finding_logit_growth`; supported below 0);
- 4: collapse before divergence among the diverged runs of the three selecting arms, Clopper-Pearson at the family's
  level (`lrcurves.finding_collapse_precedes_divergence`; the stable runs' collapses printed as the control);
- 5q, 5g: per seed R = [S(lowest T) - S(T = 1)] softmax minus the same for the remedy (supported above 0).

Every test is at alpha = 0.05 / (family size x looks), both registered below. The design checks (the baselines'
margins at 95%, `pooled.baseline_margins`; the basin and the failure at T = 1, `lrcurves.design_checks`) come first;
if one fails, the page says that the model is not shown to attend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from study.report import lrcurves
from study.report.lrcurves import REFERENCE_T, Curves, LRFinding
from study.report.pooled import (
    MARGIN_NAT,
    PREREGISTERED_EARLIER_LOOKS,
    WORTSMAN_RANGE,
    BaselineMargin,
    Part,
    PartError,
    baseline_margins,
    check_parts,
    margin_lines,
    read_part,
    restricted,
    stable_lr_finding,
    write_outputs,
    write_pooled,
)
from study.report.stats import (
    CONFIDENCE,
    Family,
    Interval,
    family_level,
    fmt,
    least_squares_slope,
    percent,
    replicates_needed,
)
from study.report.table import table

# ---- the registered design (docs/findings.md, "The Wortsman-scale study"): one place ---------------------------

TEMPERATURES = (0.03, 0.1, 1.0)
REMEDIES = {"q": "qk_norm", "g": "output_gate"}  # the key's letter -> the arm
JUDGED_ARMS = ("softmax", "qk_norm", "output_gate")  # finding 1's arms and finding 4's runs
FAMILY = ("1s", "1q", "1g", "2", "3", "4", "5q", "5g")
LOOKS = 5  # findings 1s and 2 were looked at four times before: the first run, two replications, the pooled rerun
ALPHA = (1 - CONFIDENCE) / (len(FAMILY) * LOOKS)
DESIGNS = ("scratch", "wortsman")  # `study report --pool --design`: the earlier pooled page, or this family


def family() -> Family:
    """The family's Bonferroni correction: each interval at 1 - ALPHA."""
    return Family(len(FAMILY) * LOOKS)


def is_registered_design(parts: Sequence[Part]) -> bool:
    """Whether every part has every judged arm at exactly the registered temperatures: the Wortsman design's parts,
    which the earlier pooled page refuses to judge with its own two findings (`--design wortsman` judges them)."""
    return all(part.temperatures(arm) == list(TEMPERATURES) for part in parts for arm in JUDGED_ARMS)


def check_design(parts: Sequence[Part]) -> None:
    for part in parts:
        for arm in JUDGED_ARMS:
            temps = part.temperatures(arm)
            if temps != list(TEMPERATURES):
                raise PartError(f"{part.path}: lr_curves.curves: the registered design has the {arm} arm at T in "
                                f"{list(TEMPERATURES)}, this part has {temps}")


def all_curves(parts: Sequence[Part], arms: Sequence[str]) -> Curves:
    """The parts' curves of ``arms`` as one `lrcurves.Curves` (a seed is in one part only: `check_parts`)."""
    complete = {k: c for part in parts for k, c in part.curves.items() if k[1] in arms}
    return Curves(list(parts[0].grid), sorted({k[0] for k in complete}), complete, [])


def range_sensitivity(curves: Curves, t: float, arm: str, seed: int) -> float | None:
    """S over Wortsman's range (the registered definition of S)."""
    return restricted(curves.curve(t, arm, seed), *WORTSMAN_RANGE).sensitivity()


def sensitivity_slopes(curves: Curves, arm: str) -> dict[int, float]:
    """Per seed: the least-squares slope of S against log10 T over the registered temperatures."""
    out = {}
    for seed in curves.seeds(arm, TEMPERATURES):
        values = [range_sensitivity(curves, t, arm, seed) for t in TEMPERATURES]
        if None not in values:
            out[seed] = least_squares_slope(np.log10(TEMPERATURES), values)
    return out


def remedy_differences(curves: Curves, remedy: str) -> dict[int, float]:
    """Per seed: R = [S(lowest T) - S(T = 1)] softmax - the same for ``remedy``."""
    low = TEMPERATURES[0]
    out = {}
    for seed in sorted(set(curves.seeds("softmax", [low, REFERENCE_T])) & set(curves.seeds(remedy, [low, REFERENCE_T]))):
        s = {arm: [range_sensitivity(curves, t, arm, seed) for t in (low, REFERENCE_T)] for arm in ("softmax", remedy)}
        if all(None not in v for v in s.values()):
            out[seed] = (s["softmax"][0] - s["softmax"][1]) - (s[remedy][0] - s[remedy][1])
    return out


def _rekeyed(finding: LRFinding, key: str, claim: str | None = None) -> LRFinding:
    return LRFinding(key, claim or finding.claim, finding.statistic, finding.value, finding.verdict, finding.rule,
                     finding.interval)


def judge(parts: Sequence[Part]) -> list[LRFinding]:
    """The eight registered tests, in FAMILY's order, each at 1 - ALPHA."""
    curves = all_curves(parts, JUDGED_ARMS)
    softmax = all_curves(parts, ["softmax"])
    low = TEMPERATURES[0]
    slope_rule = "supported if the interval < 0; not supported if > 0"
    found: list[LRFinding] = []
    with family_level(family()):
        for letter, arm in (("s", "softmax"), *REMEDIES.items()):
            slopes = sensitivity_slopes(curves, arm)
            found.append(lrcurves.interval_finding(
                f"1{letter}", f"LR sensitivity rises as T falls ({lrcurves.ARM_LABELS[arm]})",
                f"per-seed slope of S (lr {fmt(WORTSMAN_RANGE[0])} ... {fmt(WORTSMAN_RANGE[1])}) vs log10 T",
                list(slopes.values()), -1, slope_rule))
        f2 = stable_lr_finding(parts, low, ALPHA)
        deciding = ", ".join(f"{k} in {n}" for k, n in f2.deciding.items()) or "none"
        found.append(LRFinding(
            "2", "the largest stable LR is lower at low T (softmax)",
            f"lr* (whole grid) at T = {fmt(low)} vs T = 1, per seed",
            f"{f2.lower} lower / {f2.tied} tied / {f2.higher} higher; p = {fmt(f2.p)} (one-sided); pairs: {deciding}",
            f2.verdict, f"exact one-sided sign test over untied seeds at p <= {fmt(ALPHA)}; underpowered when a "
            "perfect count could not reach it"))
        found.append(_rekeyed(lrcurves.finding_logit_growth(softmax), "3"))
        runs = [r for c in curves.complete.values() for r in c.runs.values()]
        found.append(_rekeyed(lrcurves.finding_collapse_precedes_divergence(runs, family().level), "4",
                              "divergences are preceded by entropy collapse (softmax, QK-norm and gated arms)"))
        for letter, arm in REMEDIES.items():
            r = remedy_differences(curves, arm)
            found.append(lrcurves.interval_finding(
                f"5{letter}", f"{lrcurves.ARM_LABELS[arm]} removes the sensitivity low T adds",
                f"per-seed [S(T={fmt(low)}) - S(T=1)] softmax minus the same for {lrcurves.ARM_LABELS[arm]}",
                list(r.values()), +1, "supported if the interval > 0; not supported if < 0"))
    return found


def seeds_to_decide(interval: Interval | None) -> str:
    """The interval's half-width and the seeds its observed spread would need to exclude 0 at the family's level
    (`stats.replicates_needed` with the half-width set to |mean|)."""
    if interval is None:
        return "-"
    if interval.estimate == 0 or interval.se is None:
        return f"half-width {fmt(interval.half_width)}"
    needed = replicates_needed(interval, abs(interval.estimate))
    return (f"half-width {fmt(interval.half_width)}; seeds to exclude 0 at this spread: "
            f"{needed if needed is not None else 'more than can be run'}")


@dataclass
class RegisteredReport:
    parts: list[dict[str, Any]]  # name, path, seeds, source hash
    source_hash: str | None
    family: list[str]
    looks: int
    alpha: float
    level: float
    baselines: list[BaselineMargin]
    no_stable_seeds: list[str]
    design_checks: list[dict[str, Any]]  # the basin and the failure at T = 1 (`lrcurves.design_checks`)
    attends: bool  # every baseline margin met
    findings: list[dict[str, Any]]  # `LRFinding.as_dict` with "power"
    left_out: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"design": "wortsman", **asdict(self), "opening": opening(self)}


def pool_registered(parts: Sequence[Part]) -> RegisteredReport:
    _, source_hash = check_parts(parts)
    check_design(parts)
    margins, no_stable = baseline_margins(parts)
    checks = lrcurves.design_checks(all_curves(parts, ["softmax"]))
    found = judge(parts)
    seeds = {p.path: sorted({s for (_, a, s) in p.curves if a == "softmax"}) for p in parts}
    return RegisteredReport(
        parts=[{"name": p.name, "path": p.path, "seeds": seeds[p.path], "source_hash": (p.source_hashes or [None])[0]}
               for p in parts],
        source_hash=source_hash, family=list(FAMILY), looks=LOOKS, alpha=ALPHA, level=family().level,
        baselines=margins, no_stable_seeds=no_stable,
        design_checks=[{"statement": c.statement, "passed": c.passed, "detail": c.detail} for c in checks],
        attends=all(b.criterion == "met" for b in margins),
        findings=[{**f.as_dict(), "power": seeds_to_decide(f.interval)} for f in found],
        left_out=[f"{p.name}: {c}" for p in parts for c in p.incomplete],
    )


def opening(r: RegisteredReport) -> str:
    seeds = sum(len(p["seeds"]) for p in r.parts)
    source = f" (source hash {r.source_hash})" if r.source_hash else ""
    said = "; ".join(f"{b.baseline} {b.interval} nat ({b.criterion})" if b.interval else f"{b.baseline}: {b.criterion}"
                     for b in r.baselines)
    unmet = [b.baseline for b in r.baselines if b.criterion != "met"]
    attends = (f"Design check: the softmax arm's best held-out loss at T = 1 beats each baseline by (baseline - "
               f"softmax, 95%; the criterion is at least {MARGIN_NAT} nat at the interval's lower end): {said}. "
               + (f"The criterion is not met against {', '.join(unmet)}: the model is not shown to attend, and the "
                  "findings below describe a model that need not use attention." if unmet else
                  "The criterion is met against every baseline: the model is shown to attend."))
    verdicts = "; ".join(f"{f['key']} {f['verdict']}" for f in r.findings)
    return (f"The Wortsman-scale study, pooled over {seeds} seeds in {len(r.parts)} part"
            f"{'s' if len(r.parts) != 1 else ''} run from one commit{source}, the seed the unit. {attends} The "
            f"registered family of {len(r.family)} tests at alpha = {fmt(r.alpha)} ({len(r.family)} tests x {r.looks} "
            f"looks; intervals at {percent(r.level)}): {verdicts}.")


def registered_markdown(r: RegisteredReport) -> str:
    check_rows = [[c["statement"], "yes" if c["passed"] else "NO", c["detail"]] for c in r.design_checks]
    finding_rows = [[f["key"], f["claim"], f["statistic"], f["value"], f["verdict"], f["rule"], f["power"]]
                    for f in r.findings]
    source_rows = [[p["name"], p["path"], ", ".join(str(s) for s in p["seeds"]), p["source_hash"] or "-"]
                   for p in r.parts]
    return "\n".join([
        "# The Wortsman-scale from-scratch study, pooled",
        "",
        opening(r),
        "",
        "Design, definitions and rules: docs/findings.md, \"The Wortsman-scale study (pre-registered before its "
        "runs)\". S is LR sensitivity over lr " + f"{fmt(WORTSMAN_RANGE[0])} ... {fmt(WORTSMAN_RANGE[1])}; lr* is "
        "over the whole grid; stable and diverged are `study.report.summary.diverged`.",
        "",
        "## Design checks (outside the family, 95%), read before any finding",
        "",
        *margin_lines(r.baselines, r.no_stable_seeds, "nat; uniform attention paired by seed"),
        "",
        table(["design check", "passed", "measured"], check_rows),
        "",
        *([] if r.attends else ["**The model is not shown to attend**: the verdicts below describe a model that need "
                                "not use attention.", ""]),
        f"## The registered family ({len(r.family)} tests x {r.looks} looks, alpha = {fmt(r.alpha)}, intervals at "
        f"{percent(r.level)})",
        "",
        table(["#", "claim", "statistic", f"value [{percent(r.level)}]", "verdict", "rule", "power"], finding_rows),
        "",
        "## Left out",
        "",
        ("Every curve of every part is in the statistics above." if not r.left_out else
         "Curves no statistic uses: " + "; ".join(r.left_out) + "."),
        "",
        "## Sources",
        "",
        table(["part", "file", "seeds", "source hash"], source_rows),
        "",
    ])  # fmt: skip


def write_any_pooled(paths: Sequence[str | Path], out_dir: str | Path, earlier_looks: int | None = None,
                     design: str = "scratch") -> Path:
    """The pooled page of the design the parts were run under, named by the caller (`DESIGNS`): ``scratch``, the
    earlier pooled page (`pooled.write_pooled`, 3 earlier looks unless told), which refuses parts of the Wortsman
    design rather than judge them by another family; ``wortsman``, the registered family, which fixes its own looks
    (an ``earlier_looks`` that disagrees is refused) and refuses a part without every registered cell."""
    if design not in DESIGNS:
        raise PartError(f"--design {design!r}: one of {', '.join(DESIGNS)}")
    parts = [read_part(p) for p in paths]
    if design == "scratch":
        if is_registered_design(parts):
            raise PartError("these parts are the Wortsman design (every judged arm at T in "
                            f"{list(TEMPERATURES)}): pool them with --design wortsman")
        return write_pooled(paths, out_dir, PREREGISTERED_EARLIER_LOOKS if earlier_looks is None else earlier_looks)
    if earlier_looks is not None and earlier_looks + 1 != LOOKS:
        raise PartError(f"--earlier-looks {earlier_looks}: the Wortsman design registered {LOOKS - 1} earlier looks "
                        f"({LOOKS} with this one)")
    report = pool_registered(parts)
    return write_outputs(out_dir, json.dumps(report.as_dict(), indent=1, allow_nan=False) + "\n",
                         registered_markdown(report))


__all__ = ["ALPHA", "DESIGNS", "FAMILY", "LOOKS", "RegisteredReport", "is_registered_design", "judge", "pool_registered",
           "registered_markdown", "write_any_pooled"]
