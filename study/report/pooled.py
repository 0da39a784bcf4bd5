"""The from-scratch learning-rate study pooled over its replications: the seed is the unit, each replication (a
*part*: one report JSON) is a stratum.

    study report --pool docs/results/scratch.json docs/results/scratch-replication.json ... --out DIR

What is judged, and why this way:

- **Finding 1, restated**: LR sensitivity (`lrcurves.lr_sensitivity`) computed over the grid's LRs inside Wortsman
  et al.'s range [3e-4, 3e-1] only, so that divergence at the top of the extended grid (lr >= 1), which finding 2
  measures, is not counted twice. Per seed: the slope of sensitivity against log10 T between the lowest T and
  T = 1 (the two levels every part has, so every stratum measures one thing). Claimed direction: negative.
  The same slope over the whole grid (the old definition) is shown beside it, not judged, to show how much of it
  the top of the grid carries.
- **Finding 2, restated**: per seed, the largest stable LR over the whole grid at the lowest T against T = 1; an
  exact one-sided sign test over the untied seeds, the counts summed over strata (a stratified sign test).
- **Pooling** finding 1: per stratum the mean slope, its standard error and n; then the seed-level mean with a t
  interval over all seeds (this judges the finding: the seed is the study's unit), the fixed-effect
  inverse-variance estimate, and the DerSimonian-Laird random-effects estimate with tau^2, Cochran's Q and I^2
  (shown so that a difference between replications is visible, not hidden in the seed-level mean).
- **Looks**: each earlier analysis of findings 1 and 2 was a look at the same claims (the first run and each
  replication sized from the one before); with this one there are ``earlier_looks + 1``. The level is Bonferroni
  over the judged findings and the looks: alpha = 0.05 / (family size x looks).
- **Baselines** (a design check, outside the family, at 95%): does the softmax model at T = 1 beat a unigram and a
  bigram model, and attention uniform over the visible keys, by at least 0.1 nat?
- Findings 3a, 3b, 4a and 4b are judged per part by `study.report.lrcurves`; their verdicts are carried, not pooled.

Stable and diverged are `study.report.summary.diverged` (through `lrcurves.LRRun`); the largest stable LR is
`summary.largest_stable_lr` (through `lrcurves.Curve`): no second definition here.

Each part's JSON must carry, per curve of ``lr_curves.curves``, ``final_loss_by_lr`` and ``nonfinite_by_lr``
(keyed by ``str(lr)``): the pooled statistics restrict the grid, which the per-curve summaries of older JSONs
cannot be recomputed for, so those are refused.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from study import provenance
from study.atomic import write_text_atomically
from study.errors import ConfigError
from study.report.lrcurves import ARMS, REFERENCE_T, Curve, LRRun, sign_test
from study.report.stats import CONFIDENCE, Family, Interval, TooFew, family_level, fmt, mean_interval, percent
from study.report.table import table

WORTSMAN_RANGE = (3e-4, 3e-1)  # the LR range of Wortsman et al. 2023, where finding 1 is now measured
JUDGED = ("1", "2")  # the family: the baselines are a design check, outside it
MIN_SEEDS = 3
MARGIN_NAT = 0.1  # the baselines' criterion: softmax better by at least this much (lower end of the interval)
MECHANISM_KEYS = ("3a", "3b", "4a", "4b")
NEW_CURVE_FIELDS = ("final_loss_by_lr", "nonfinite_by_lr")
MECHANISM_CURVE_FIELDS = ("max_logit_ends_by_lr", "divergence_step_by_lr", "collapse_step_by_lr",
                          "collapse_logged_by_lr")  # `lrcurves.mechanism_by_lr`: optional (older parts lack them)
SETTINGS_FIELD = ("lr_curves", "settings")  # the runs' shared settings (`lrcurves.shared_settings`)
PREREGISTERED_EARLIER_LOOKS = 3  # docs/findings.md, "The pooled rerun": the first run and the two replications
OUTPUT_NAMES = ("pooled.json", "pooled.md")


class PartError(ConfigError):
    """A part that cannot be pooled (or parts that cannot be pooled together): names the file and the field."""


# ---- reading a part -------------------------------------------------------------------------------------------


@dataclass
class Part:
    """One replication's report JSON, verified: a stratum of the pooled analysis."""

    name: str
    path: str
    grid: list[float]
    curves: dict[tuple[float, str, int], Curve]  # (T, arm, seed) -> its runs at every LR of the grid
    baselines: dict[str, float | None]  # "unigram", "bigram" -> held-out loss (None: not logged)
    findings: dict[str, dict[str, Any]]  # the part's own verdicts by key ("3a", ...)
    origin: dict[str, Any]  # the report's `origin` (study.report.origin): one source hash, one commit
    numerics_check: dict[str, Any] | None = None  # the part's `study report --numerics-check` record, if any
    settings: dict[str, Any] = field(default_factory=dict)  # model, data and optimiser settings its runs share
    incomplete: list[str] = field(default_factory=list)  # curves the part's report left out (an LR missing)

    @property
    def machines(self) -> list[str]:
        """The machine lines its runs recorded (CPU, kernels, threads; `study.provenance`)."""
        return sorted((self.origin or {}).get("machines") or {})

    @property
    def source_hashes(self) -> list[str]:
        sources = (self.origin or {}).get("sources") or {}
        return sorted(h for h in sources if h != provenance.UNRECORDED)

    def temperatures(self, arm: str) -> list[float]:
        return sorted({t for (t, a, _) in self.curves if a == arm})

    def seeds(self, arm: str, temperatures: Sequence[float]) -> list[int]:
        seeds = {s for (_, a, s) in self.curves if a == arm}
        return sorted(s for s in seeds if all((t, arm, s) in self.curves for t in temperatures))


def _fail(path: Path | str, where: str, problem: str) -> PartError:
    return PartError(f"{path}: {where}: {problem}")


def _number(value: Any, path: Path, where: str, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, where, f"expected a number{' or null' if allow_none else ''}, got {value!r}")
    return float(value)


def _by_lr(entry: dict, key: str, grid: list[float], path: Path, where: str) -> dict[float, Any]:
    if key not in entry:
        raise _fail(path, f"{where}.{key}", "missing: this JSON was written before the report logged each LR's run "
                    "per curve, and the pooled statistics (restricted grid, best loss) cannot be recomputed from its "
                    "per-curve summaries; rerun `study report` on the sweep's logs")
    values = entry[key]
    expected = {str(lr) for lr in grid}
    if not isinstance(values, dict) or set(values) != expected:
        got = sorted(values) if isinstance(values, dict) else values
        raise _fail(path, f"{where}.{key}", f"keys {got} are not the grid's {sorted(expected)}")
    return {lr: values[str(lr)] for lr in grid}


def _curve(entry: Any, grid: list[float], path: Path, where: str) -> Curve:
    if not isinstance(entry, dict):
        raise _fail(path, where, "not an object")
    for key in ("temperature", "arm", "seed", "init_loss"):
        if key not in entry:
            raise _fail(path, f"{where}.{key}", "missing")
    if entry["arm"] not in ARMS:
        raise _fail(path, f"{where}.arm", f"{entry['arm']!r} is not one of {', '.join(ARMS)}")
    t = _number(entry["temperature"], path, f"{where}.temperature")
    seed = int(_number(entry["seed"], path, f"{where}.seed"))
    l0 = _number(entry["init_loss"], path, f"{where}.init_loss", allow_none=True)
    finals = _by_lr(entry, "final_loss_by_lr", grid, path, where)
    nonfinite = _by_lr(entry, "nonfinite_by_lr", grid, path, where)
    mechanism = {key: _by_lr(entry, key, grid, path, where) for key in MECHANISM_CURVE_FIELDS if key in entry}
    curve = Curve(t, entry["arm"], seed)
    for lr in grid:
        final = _number(finals[lr], path, f"{where}.final_loss_by_lr.{lr}", allow_none=True)
        if not isinstance(nonfinite[lr], bool):
            raise _fail(path, f"{where}.nonfinite_by_lr.{lr}", f"expected true or false, got {nonfinite[lr]!r}")
        curve.runs[lr] = LRRun(f"{entry['arm']} T={fmt(t)} seed {seed} lr {fmt(lr)}", t, entry["arm"], seed, lr, l0,
                               final, nonfinite[lr], **_mechanism_fields(mechanism, lr, path, where))
    return curve


def _mechanism_fields(mechanism: dict[str, dict[float, Any]], lr: float, path: Path, where: str) -> dict[str, Any]:
    """The run's max-logit ends and collapse and divergence steps (`lrcurves.mechanism_by_lr`), where the part
    carries them; an older part's run has none, and reads as "collapse alert not logged"."""
    if set(mechanism) != set(MECHANISM_CURVE_FIELDS):
        if mechanism:
            raise _fail(path, where, f"has {', '.join(sorted(mechanism))} but not every one of "
                        f"{', '.join(MECHANISM_CURVE_FIELDS)}")
        return {"collapse_logged": False}
    ends = mechanism["max_logit_ends_by_lr"][lr]
    if not isinstance(ends, list) or len(ends) not in (0, 2) or any(
            not isinstance(e, list) or len(e) != 2 for e in ends):
        raise _fail(path, f"{where}.max_logit_ends_by_lr.{lr}", f"expected [] or [[step, value], [step, value]], "
                    f"got {ends!r}")
    steps = {}
    for key in ("divergence_step_by_lr", "collapse_step_by_lr"):
        value = _number(mechanism[key][lr], path, f"{where}.{key}.{lr}", allow_none=True)
        steps[key] = None if value is None else int(value)
    logged = mechanism["collapse_logged_by_lr"][lr]
    if not isinstance(logged, bool):
        raise _fail(path, f"{where}.collapse_logged_by_lr.{lr}", f"expected true or false, got {logged!r}")
    max_logit = tuple((int(_number(s, path, f"{where}.max_logit_ends_by_lr.{lr}")),
                       _number(v, path, f"{where}.max_logit_ends_by_lr.{lr}")) for s, v in ends)
    # `LRRun.divergence_step` returns the stop step of a diverged run with no training-loss series: the step the
    # report computed is carried there, so that `collapse_before_divergence` reads it unchanged.
    return {"max_logit": max_logit, "stop_step": steps["divergence_step_by_lr"],
            "collapse_step": steps["collapse_step_by_lr"], "collapse_logged": logged}


def read_part(path: str | Path) -> Part:
    """Read and verify one part (a report JSON with `lr_curves`); `PartError` names the file and the bad field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise _fail(path, "file", f"not readable as JSON ({err})") from err
    if not isinstance(data, dict) or "schema" not in data:
        raise _fail(path, "schema", "missing: not a report JSON")
    lr = data.get("lr_curves")
    if not isinstance(lr, dict):
        raise _fail(path, "lr_curves", "missing: the report has no from-scratch learning-rate section")
    grid_raw = lr.get("grid")
    if not isinstance(grid_raw, list) or len(grid_raw) < 2:
        raise _fail(path, "lr_curves.grid", f"expected a list of learning rates, got {grid_raw!r}")
    grid = sorted(_number(v, path, "lr_curves.grid") for v in grid_raw)
    if not isinstance(lr.get("curves"), list) or not lr["curves"]:
        raise _fail(path, "lr_curves.curves", "missing or empty")
    curves: dict[tuple[float, str, int], Curve] = {}
    for i, entry in enumerate(lr["curves"]):
        curve = _curve(entry, grid, path, f"lr_curves.curves[{i}]")
        key = (curve.temperature, curve.arm, curve.seed)
        if key in curves:
            raise _fail(path, f"lr_curves.curves[{i}]", f"a second curve for T={fmt(key[0])}, {key[1]}, seed {key[2]}")
        curves[key] = curve
    raw_baselines = lr.get("baselines") or {}
    if not isinstance(raw_baselines, dict):
        raise _fail(path, "lr_curves.baselines", f"expected an object, got {raw_baselines!r}")
    baselines = {k: _number(raw_baselines.get(k), path, f"lr_curves.baselines.{k}", allow_none=True)
                 for k in ("unigram", "bigram")}
    findings = {str(f.get("key")): f for f in lr.get("findings") or [] if isinstance(f, dict)}
    settings = _lookup(data, SETTINGS_FIELD)
    if not isinstance(settings, dict) or not settings:
        raise _fail(path, ".".join(SETTINGS_FIELD), "missing: the report did not record its runs' settings, so parts "
                    "of different models or optimisers could not be told apart")
    mixed = sorted(k for k, v in settings.items() if v == "mixed")
    if mixed:
        raise _fail(path, ".".join(SETTINGS_FIELD), f"its runs differ in {', '.join(mixed)}: not one experiment")
    origin = _checked_origin(data.get("origin"), path)
    name = str(data.get("title") or data.get("source") or path.stem)
    check = data.get("numerics_check") if isinstance(data.get("numerics_check"), dict) else None
    incomplete = [f"{c.get('arm')} T={fmt(c.get('temperature'))} seed {c.get('seed')} (no run at lr "
                  f"{', '.join(fmt(x) for x in c.get('missing_lrs') or [])})"
                  for c in lr.get("incomplete") or [] if isinstance(c, dict)]
    return Part(name, str(path), grid, curves, baselines, findings, origin, check, settings, incomplete)


def _checked_origin(origin: Any, path: Path) -> dict[str, Any]:
    """The part's `origin`: every run recorded one source hash and one commit, from a clean checkout."""
    if not isinstance(origin, dict) or not isinstance(origin.get("sources"), dict):
        raise _fail(path, "origin", "missing: the report does not say which code made its runs")
    unrecorded = origin["sources"].get(provenance.UNRECORDED)
    if unrecorded:
        raise _fail(path, "origin.sources", f"{unrecorded} run(s) recorded no source hash")
    if len(origin["sources"]) != 1 or origin.get("mixed"):
        raise _fail(path, "origin.sources", f"its runs come from {len(origin['sources'])} source hashes "
                    f"({', '.join(sorted(origin['sources']))})")
    if origin.get("dirty_source_runs"):
        raise _fail(path, "origin.dirty_source_runs", f"{origin['dirty_source_runs']} run(s) ran from a checkout with "
                    "uncommitted changes to the package")
    commits = origin.get("commits") or {}
    if len(commits) != 1:
        raise _fail(path, "origin.commits", f"expected the runs of one commit, got {sorted(commits) or 'none'}")
    return origin


def _lookup(data: dict, keys: Sequence[str]) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def check_parts(parts: Sequence[Part]) -> tuple[float, str | None]:
    """Refuse parts that do not measure one thing: different grids, model settings, lowest T or source hashes.
    Returns the common lowest T and the common source hash (None: no part recorded one)."""
    if len(parts) < 1:
        raise PartError("no parts to pool")
    first = parts[0]
    for part in parts[1:]:
        if part.grid != first.grid:
            raise PartError(f"{part.path}: lr_curves.grid {part.grid} differs from {first.path}'s {first.grid}")
        for key in sorted(set(part.settings) | set(first.settings)):
            if part.settings.get(key) != first.settings.get(key):
                raise PartError(f"{part.path}: {key} {part.settings.get(key)!r} differs from {first.path}'s "
                                f"{first.settings.get(key)!r}: not one experiment")
    owner: dict[int, str] = {}  # seed -> the part that trained it: a seed is one unit, counted once
    for part in parts:
        for seed in sorted({s for (_, _, s) in part.curves}):
            if seed in owner:
                raise PartError(f"seed {seed} is in {owner[seed]} and in {part.path}: the same seed pooled twice "
                                "would count one unit as two")
            owner[seed] = part.path
    lows = {}
    for part in parts:
        temps = part.temperatures("softmax")
        if REFERENCE_T not in temps or len(temps) < 2:
            raise PartError(f"{part.path}: lr_curves.curves: the softmax arm needs T = 1 and a lower T, has {temps}")
        lows[part.path] = temps[0]
    if len(set(lows.values())) > 1:
        raise PartError("the parts' lowest T differ (" + ", ".join(f"{p}: {fmt(t)}" for p, t in lows.items())
                        + "): their slopes would measure different things")
    hashes: dict[str, str] = {}  # hash -> the first part that recorded it
    for part in parts:
        if len(part.source_hashes) > 1:
            raise PartError(f"{part.path}: origin.sources: its runs come from {len(part.source_hashes)} source hashes "
                            f"({', '.join(part.source_hashes)})")
        for h in part.source_hashes:
            hashes.setdefault(h, part.path)
    if len(hashes) > 1:
        (h1, p1), (h2, p2) = list(hashes.items())[:2]
        raise PartError(f"source hashes differ: {p1} has {h1}, {p2} has {h2}; the parts were made by different "
                        "versions of the code: rerun them from one")
    commits = {c for part in parts for c in part.origin.get("commits") or {}}
    if len(commits) > 1:
        raise PartError(f"the parts' runs come from {len(commits)} commits ({', '.join(sorted(commits))}): rerun "
                        "them from one clean clone")
    return next(iter(lows.values())), next(iter(hashes), None)


# ---- statistics -------------------------------------------------------------------------------------------------


def in_range(lr: float, lo: float, hi: float) -> bool:
    """lo <= lr <= hi up to rounding (a grid's 0.3 is the range's 3e-1)."""
    return lo * (1 - 1e-9) <= lr <= hi * (1 + 1e-9)


def restricted(curve: Curve, lo: float, hi: float) -> Curve:
    """The curve's runs at the learning rates within [lo, hi]."""
    return Curve(curve.temperature, curve.arm, curve.seed,
                 {lr: r for lr, r in curve.runs.items() if in_range(lr, lo, hi)})


def sensitivity_slopes(part: Part, low_t: float, lr_range: tuple[float, float] | None) -> dict[int, float]:
    """Per softmax seed: the slope of LR sensitivity against log10 T between ``low_t`` and T = 1, over the LRs in
    ``lr_range`` (None: the whole grid). Seeds without a loss at init at both T are left out."""
    out = {}
    for seed in part.seeds("softmax", [low_t, REFERENCE_T]):
        values = []
        for t in (low_t, REFERENCE_T):
            curve = part.curves[(t, "softmax", seed)]
            values.append((restricted(curve, *lr_range) if lr_range else curve).sensitivity())
        if None not in values:
            out[seed] = (values[1] - values[0]) / (math.log10(REFERENCE_T) - math.log10(low_t))
    return out


@dataclass(frozen=True)
class Stratum:
    name: str
    n: int
    mean: float | None
    se: float | None  # standard error of the mean (None below 2 seeds)
    interval: Interval | None  # t interval at the pooled level (None below MIN_SEEDS)


def stratum(name: str, values: Sequence[float], level: float) -> Stratum:
    x = np.asarray(values, dtype=float)
    se = float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) >= 2 else None
    try:
        with family_level(Family(1, level)):  # Family(1, c).level is c: the interval at the pooled level
            interval = mean_interval(list(x), "seeds")
    except TooFew:
        interval = None
    return Stratum(name, len(x), float(np.mean(x)) if len(x) else None, se, interval)


@dataclass(frozen=True)
class MetaEstimate:
    """A pooled estimate over strata with a normal interval at ``level``."""

    estimate: float
    se: float
    lo: float
    hi: float
    level: float
    q: float | None = None  # Cochran's Q (random effects)
    df: int | None = None
    tau2: float | None = None
    i2: float | None = None

    def __str__(self) -> str:
        return f"{fmt(self.estimate)} [{fmt(self.lo)}, {fmt(self.hi)}]"


def fixed_effect(means: Sequence[float], ses: Sequence[float], level: float) -> MetaEstimate:
    """Inverse-variance weighted mean: weights 1/se^2, standard error 1/sqrt(sum of weights)."""
    y, w = np.asarray(means, dtype=float), 1.0 / np.asarray(ses, dtype=float) ** 2
    est, se = float(np.sum(w * y) / np.sum(w)), float(1.0 / math.sqrt(np.sum(w)))
    z = float(scipy_stats.norm.ppf(1 - (1 - level) / 2))
    return MetaEstimate(est, se, est - z * se, est + z * se, level)


def random_effects(means: Sequence[float], ses: Sequence[float], level: float) -> MetaEstimate:
    """DerSimonian-Laird: Q = sum w (y - fixed)^2, tau^2 = max(0, (Q - df) / (sum w - sum w^2 / sum w)), weights
    1/(se^2 + tau^2); I^2 = max(0, (Q - df) / Q)."""
    y, v = np.asarray(means, dtype=float), np.asarray(ses, dtype=float) ** 2
    w = 1.0 / v
    fixed = float(np.sum(w * y) / np.sum(w))
    q, df = float(np.sum(w * (y - fixed) ** 2)), len(y) - 1
    c = float(np.sum(w) - np.sum(w**2) / np.sum(w))
    tau2 = max(0.0, (q - df) / c) if c > 0 else 0.0
    w_star = 1.0 / (v + tau2)
    est, se = float(np.sum(w_star * y) / np.sum(w_star)), float(1.0 / math.sqrt(np.sum(w_star)))
    z = float(scipy_stats.norm.ppf(1 - (1 - level) / 2))
    i2 = max(0.0, (q - df) / q) if q > 0 else 0.0
    return MetaEstimate(est, se, est - z * se, est + z * se, level, q, df, tau2, i2)


def interval_verdict(lo: float, hi: float, n: int) -> str:
    """Finding 1's rule (claim: negative): supported if the interval lies below 0, not supported if above."""
    if n < MIN_SEEDS:
        return "too few"
    return "supported" if hi < 0 else "not supported" if lo > 0 else "inconclusive"


@dataclass
class SensitivityFinding:
    """Finding 1 over one LR range: per stratum, and pooled three ways."""

    lr_range: list[float]  # the grid's LRs it is computed over
    strata: list[Stratum]
    seed_level: Interval | None  # t interval over every seed of every stratum: judges the finding
    fixed: MetaEstimate | None  # None where a stratum has no standard error (below 2 seeds, or no spread)
    random: MetaEstimate | None
    verdict: str
    note: str = ""


def sensitivity_finding(parts: Sequence[Part], low_t: float, lr_range: tuple[float, float] | None,
                        level: float, judged: bool) -> SensitivityFinding:
    per_part = [(p, sensitivity_slopes(p, low_t, lr_range)) for p in parts]
    strata = [stratum(p.name, list(s.values()), level) for p, s in per_part]
    everything = [v for _, s in per_part for v in s.values()]
    with family_level(Family(1, level)):
        try:
            seed_level = mean_interval(everything, "seeds")
        except TooFew:
            seed_level = None
    fixed = random = None
    note = ""
    usable = [s for s in strata if s.se is not None and s.se > 0]
    if len(usable) == len(strata) and strata:
        fixed = fixed_effect([s.mean for s in strata], [s.se for s in strata], level)
        if len(strata) >= 2:
            random = random_effects([s.mean for s in strata], [s.se for s in strata], level)
    else:
        note = "fixed and random effects need a standard error in every stratum (2 seeds with spread)"
    if not judged:
        verdict = "not judged (old definition)"
    elif seed_level is None:
        verdict = "too few"
    else:
        verdict = interval_verdict(seed_level.lo, seed_level.hi, seed_level.n)
    lrs = [lr for lr in parts[0].grid if lr_range is None or in_range(lr, *lr_range)]
    return SensitivityFinding(lrs, strata, seed_level, fixed, random, verdict, note)


@dataclass(frozen=True)
class SignCount:
    name: str
    lower: int
    tied: int
    higher: int
    deciding: dict[str, int]  # "lr*(low T) vs lr*(T=1)" -> untied seeds


@dataclass
class StableLRFinding:
    """Finding 2: lr* at the lowest T against T = 1, a sign test stratified by part."""

    strata: list[SignCount]
    lower: int
    tied: int
    higher: int
    p: float | None  # one-sided, the claimed direction (lower at the lowest T)
    verdict: str
    deciding: dict[str, int]


def sign_count(part: Part, low_t: float) -> SignCount:
    floor = part.grid[0] / math.sqrt(10)  # below the grid: half a decade under its smallest LR (as lrcurves)
    lower = tied = higher = 0
    deciding: Counter[str] = Counter()
    for seed in part.seeds("softmax", [low_t, REFERENCE_T]):
        a = part.curves[(low_t, "softmax", seed)].largest_stable() or floor
        b = part.curves[(REFERENCE_T, "softmax", seed)].largest_stable() or floor
        lower, tied, higher = lower + (a < b), tied + (a == b), higher + (a > b)
        if a != b:
            name = lambda lr: fmt(lr) if lr != floor else "below grid"  # noqa: E731
            deciding[f"{name(a)} vs {name(b)}"] += 1
    return SignCount(part.name, lower, tied, higher, dict(deciding))


def stable_lr_finding(parts: Sequence[Part], low_t: float, alpha: float) -> StableLRFinding:
    strata = [sign_count(p, low_t) for p in parts]
    lower, tied, higher = (sum(getattr(s, k) for s in strata) for k in ("lower", "tied", "higher"))
    deciding: Counter[str] = Counter()
    for s in strata:
        deciding.update(s.deciding)
    if lower + tied + higher < MIN_SEEDS:
        verdict, p = "too few", None
    else:
        verdict, p = sign_test(lower, higher, alpha)  # "underpowered" when even a perfect count could not reach alpha
        if p is None and lower + higher > 0:
            from scipy.stats import binomtest

            p = float(binomtest(lower, lower + higher, 0.5, alternative="greater").pvalue)
    return StableLRFinding(strata, lower, tied, higher, p, verdict, dict(deciding.most_common()))


@dataclass
class BaselineMargin:
    """baseline loss - softmax's best stable loss at T = 1, per seed (positive: softmax better)."""

    baseline: str
    n: int
    interval: Interval | None  # 95% t interval over seeds (a design check, outside the family)
    criterion: str  # "met", "not met", "too few", "not logged"
    seeds: list[str]  # the seeds it averages over, "part seed N"


def best_stable_loss(curve: Curve) -> float | None:
    losses = [r.final_loss for r in curve.runs.values() if r.stable and r.final_loss is not None]
    return min(losses) if losses else None


def baseline_margins(parts: Sequence[Part]) -> tuple[list[BaselineMargin], list[str]]:
    """The three margins and the softmax seeds at T = 1 with no stable run (named, in no margin)."""
    rows: dict[str, list[tuple[str, float]]] = {"unigram": [], "bigram": [], "uniform attention": []}
    no_stable = []
    logged = {"unigram": False, "bigram": False, "uniform attention": False}
    for part in parts:
        for seed in part.seeds("softmax", [REFERENCE_T]):
            label = f"{part.name} seed {seed}"
            best = best_stable_loss(part.curves[(REFERENCE_T, "softmax", seed)])
            if best is None:
                no_stable.append(label)
                continue
            for key in ("unigram", "bigram"):
                if part.baselines.get(key) is not None:
                    logged[key] = True
                    rows[key].append((label, part.baselines[key] - best))
            uniform = part.curves.get((REFERENCE_T, "uniform", seed))
            if uniform is not None:
                logged["uniform attention"] = True
                other = best_stable_loss(uniform)
                if other is None:
                    no_stable.append(f"{label} (uniform attention)")
                else:
                    rows["uniform attention"].append((label, other - best))
    out = []
    for key, values in rows.items():
        try:
            interval = mean_interval([v for _, v in values], "seeds")  # 95%: outside the family
        except TooFew:
            interval = None
        if not logged[key]:
            criterion = "not logged"
        elif interval is None:
            criterion = "too few"
        else:
            criterion = "met" if interval.lo >= MARGIN_NAT else "not met"
        out.append(BaselineMargin(key, len(values), interval, criterion, [label for label, _ in values]))
    return out, no_stable


def left_out_seeds(parts: Sequence[Part], low_t: float) -> list[str]:
    """The softmax seeds of each part that findings 1 and 2 cannot use, each with why: a curve at only one of the
    two temperatures, or no loss at init."""
    out = []
    for part in parts:
        present = {s for (_, a, s) in part.curves if a == "softmax"}
        paired = set(part.seeds("softmax", [low_t, REFERENCE_T]))
        out += [f"{part.name}: softmax seed {s} (no complete curve at both T = {fmt(low_t)} and T = 1)"
                for s in sorted(present - paired)]
        slopes = sensitivity_slopes(part, low_t, None)
        out += [f"{part.name}: softmax seed {s} (no loss at init)" for s in sorted(paired - set(slopes))]
    return out


# ---- the report -------------------------------------------------------------------------------------------------


@dataclass
class PooledReport:
    parts: list[dict[str, Any]]  # name, path, seeds, source hash
    looks: int
    family_size: int
    alpha: float
    level: float
    lowest_t: float
    source_hash: str | None
    finding1: SensitivityFinding
    finding1_old: SensitivityFinding
    finding2: StableLRFinding
    baselines: list[BaselineMargin]
    no_stable_seeds: list[str]
    mechanism: list[dict[str, Any]]  # per part: key -> {"verdict", "value"} of 3a, 3b, 4a, 4b
    left_out: list[str]  # every curve or seed of a part that no pooled statistic uses, with why
    machines: list[str]  # every machine line the parts' runs recorded
    numerics_checked: list[str]  # the parts whose report compared a second numerics path

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "opening": _opening(self)}  # the page's opening, also the README's sentence


def pool(parts: Sequence[Part], earlier_looks: int = 3) -> PooledReport:
    """Pool the parts (strata). ``earlier_looks``: the analyses of findings 1 and 2 before this one (default 3: the
    first from-scratch run, replication 1 sized from it, replication 2 sized from replication 1); this one adds a
    look, and the level is Bonferroni over the judged findings and every look."""
    if earlier_looks < 0:
        raise ValueError(f"earlier_looks={earlier_looks}: a count of earlier analyses is >= 0")
    low_t, source_hash = check_parts(parts)
    names = Counter(p.name for p in parts)  # two parts of one title are told apart by their file names
    parts = [replace(p, name=f"{p.name} ({Path(p.path).stem})") if names[p.name] > 1 else p for p in parts]
    looks = earlier_looks + 1
    family_size = len(JUDGED)
    alpha = (1 - CONFIDENCE) / (family_size * looks)
    level = 1 - alpha
    mechanism = [{"part": p.name, **{k: {"verdict": p.findings[k].get("verdict"), "value": p.findings[k].get("value")}
                                     for k in MECHANISM_KEYS if k in p.findings}} for p in parts]
    baselines, no_stable = baseline_margins(parts)
    left_out = [f"{p.name}: {c}" for p in parts for c in p.incomplete] + left_out_seeds(parts, low_t)
    return PooledReport(
        parts=[{"name": p.name, "path": p.path, "softmax_seeds": len(p.seeds("softmax", [low_t, REFERENCE_T])),
                "source_hash": (p.source_hashes or [None])[0]} for p in parts],
        looks=looks, family_size=family_size, alpha=alpha, level=level, lowest_t=low_t, source_hash=source_hash,
        finding1=sensitivity_finding(parts, low_t, WORTSMAN_RANGE, level, judged=True),
        finding1_old=sensitivity_finding(parts, low_t, None, level, judged=False),
        finding2=stable_lr_finding(parts, low_t, alpha),
        baselines=baselines, no_stable_seeds=no_stable, mechanism=mechanism, left_out=left_out,
        machines=sorted({m for p in parts for m in p.machines}),
        numerics_checked=[p.name for p in parts if p.numerics_check],
    )


# ---- the page ---------------------------------------------------------------------------------------------------


def _interval(i: dict | Interval | MetaEstimate | None) -> str:
    if i is None:
        return "-"
    get = i.get if isinstance(i, dict) else lambda k: getattr(i, k)
    return f"{fmt(get('estimate'))} [{fmt(get('lo'))}, {fmt(get('hi'))}]"


def margin_lines(baselines: Sequence[BaselineMargin], no_stable_seeds: Sequence[str], note: str) -> list[str]:
    """The baseline margins' definition, table and the seeds left out of them: the design check that the model
    attends, as every pooled page prints it (``note`` says what the margin's sign or pairing means there)."""
    rows = [[b.baseline, str(b.n), _interval(b.interval), b.criterion] for b in baselines]
    return [
        f"Margin = baseline loss - softmax's best stable held-out loss at T = 1 ({note}); criterion: the interval's "
        f"lower end >= {MARGIN_NAT} nat.",
        "",
        table(["baseline", "n seeds", "mean margin [95%]", f">= {MARGIN_NAT} nat"], rows),
        "",
        ("Seeds with no stable run at T = 1 (in no margin): " + ", ".join(no_stable_seeds) + "."
         if no_stable_seeds else "Every seed has a stable run at T = 1 in each arm."),
    ]


def _grid_text(lrs: Sequence[float]) -> str:
    return f"{fmt(lrs[0])} ... {fmt(lrs[-1])}" if lrs else "-"


def _opening(r: PooledReport) -> str:
    """The page's first paragraph, in plain words, every number from the report (also the README's sentence)."""
    f1, old, f2 = r.finding1, r.finding1_old, r.finding2
    seeds = sum(p["softmax_seeds"] for p in r.parts)
    source = f" (source hash {r.source_hash})" if r.source_hash else ""
    parts = (f"Pooled over {seeds} seeds in {len(r.parts)} part{'s' if len(r.parts) != 1 else ''} run from one "
             f"commit{source}, the seed the unit and the part a stratum, at alpha = {fmt(r.alpha)} (2 findings x "
             f"{r.looks} looks: this is the {_ordinal(r.looks)} analysis of the same two claims).")
    if f1.seed_level:
        pooled = "; ".join(x for x in (f"fixed effect {f1.fixed}" if f1.fixed else "",
                                       f"random effects {f1.random}, I^2 = {percent(f1.random.i2)}" if f1.random else "")
                           if x)
        one = (f"(1) Over Wortsman et al.'s learning rates ({_grid_text(f1.lr_range)}) the LR sensitivity's slope "
               f"against log10 T is {_interval(f1.seed_level)} ({pooled}): {f1.verdict}"
               + (f"; over the whole grid up to lr {fmt(old.lr_range[-1])} (the earlier pages' range) it is "
                  f"{_interval(old.seed_level)}" if old.seed_level else "") + ".")
    else:
        one = f"(1) The LR sensitivity's slope against T: {f1.verdict}."
    deciding = ", ".join(f"{k} in {n}" for k, n in f2.deciding.items())
    two = (f"(2) The largest stable LR is lower at T = {fmt(r.lowest_t)} than at T = 1 in {f2.lower} seeds, tied in "
           f"{f2.tied}, higher in {f2.higher} (one-sided sign test p = {fmt(f2.p)}): {f2.verdict}"
           + (f"; the pairs that differ (lowest T vs T = 1): {deciding}" if deciding else "") + ".")
    margins = {b.baseline: b for b in r.baselines}
    said = "; ".join(f"{name} {_interval(b.interval)} nat ({b.criterion})" if b.interval else f"{name}: {b.criterion}"
                     for name, b in margins.items())
    unmet = [name for name, b in margins.items() if b.criterion != "met"]
    attends = (f"Does the model attend? The softmax arm's best held-out loss at T = 1 beats each baseline by "
               f"(baseline - softmax, 95%; the criterion is at least {MARGIN_NAT} nat): {said}. "
               + (f"The criterion is not met against {', '.join(unmet)}: in this design the model is not shown to "
                  "use attention, so its temperature results describe training a model that need not attend."
                  if unmet else "The criterion is met against every baseline."))
    return " ".join([parts, one, two, attends, _numerics_sentence(r)])


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}.get(n, f"{n}th")


def _numerics_sentence(r: PooledReport) -> str:
    where = f" ({'; '.join(r.machines)})" if r.machines else ""
    if not r.numerics_checked:
        return (f"No second numerics path was compared: these verdicts are one machine's kernels and thread count"
                f"{where}; a divergence at one learning rate can go the other way on another CPU's kernels.")
    missing = [p["name"] for p in r.parts if p["name"] not in r.numerics_checked]
    return (f"Parts compared on a second numerics path: {', '.join(r.numerics_checked)}"
            + (f"; not compared: {', '.join(missing)}" if missing else "") + f"{where}.")


def _stratum_rows(f: SensitivityFinding, f2: StableLRFinding | None) -> list[list[str]]:
    rows = []
    for i, s in enumerate(f.strata):
        cell = _interval(s.interval) if s.interval else fmt(s.mean)
        counts = f"{f2.strata[i].lower} / {f2.strata[i].tied} / {f2.strata[i].higher}" if f2 else "-"
        rows.append([s.name, str(s.n), cell, fmt(s.se), counts])
    return rows


def pooled_markdown(r: PooledReport) -> str:
    f1, old, f2 = r.finding1, r.finding1_old, r.finding2
    pooled_rows = []
    for label, f in (("1 (restated: LRs " + _grid_text(f1.lr_range) + ")", f1),
                     ("1, old definition (whole grid " + _grid_text(old.lr_range) + "), not judged", old)):
        pooled_rows += [
            [label, "seed level (t over all seeds)", _interval(f.seed_level), str(f.seed_level.n if f.seed_level else 0),
             "-", f.verdict],
            [label, "fixed effect (inverse variance)", _interval(f.fixed), str(len(f.strata)), "-", "-"],
            [label, "random effects (DerSimonian-Laird)", _interval(f.random), str(len(f.strata)),
             (f"tau^2 = {fmt(f.random.tau2)}, Q = {fmt(f.random.q)} on {f.random.df} df, I^2 = {percent(f.random.i2)}"
              if f.random else f.note or "-"), "-"],
        ]
    pooled_rows.append(["2", "stratified sign test", f"{f2.lower} lower / {f2.tied} tied / {f2.higher} higher",
                        str(f2.lower + f2.tied + f2.higher), f"p = {fmt(f2.p)} (one-sided)", f2.verdict])
    deciding = ", ".join(f"{k} in {n} seed{'s' if n != 1 else ''}" for k, n in f2.deciding.items()) or "none"
    labels = {k: k for k in MECHANISM_KEYS}
    mech_rows = [[m["part"], *(f"{m[k]['verdict']}: {m[k]['value']}" if k in m else "not in this part"
                               for k in MECHANISM_KEYS)] for m in r.mechanism]
    source_rows = [[p["name"], p["path"], p["source_hash"] or provenance.UNRECORDED] for p in r.parts]
    return "\n".join([
        "# From-scratch learning-rate study, replications pooled",
        "",
        _opening(r),
        "",
        (f"The pre-registered count of earlier looks is {PREREGISTERED_EARLIER_LOOKS}; this page was made with "
         f"{r.looks - 1}. " if r.looks - 1 != PREREGISTERED_EARLIER_LOOKS else "") +
        f"Level: {len(JUDGED)} judged findings x {r.looks} looks = {r.family_size * r.looks}; alpha = {fmt(r.alpha)}; "
        f"intervals of findings 1 and 2 at {percent(r.level)}. Finding 1 is judged on the seed-level interval "
        "(supported if it lies below 0, not supported if above 0); finding 2 on the sign test (supported if "
        f"p <= alpha); fewer than {MIN_SEEDS} seeds: too few.",
        "",
        f"## Per stratum (softmax, T = {fmt(r.lowest_t)} vs T = 1)",
        "",
        f"Finding 1 (restated) per-seed slope of LR sensitivity vs log10 T, mean [{percent(r.level)} t interval]; "
        "finding 2's seeds with lr* lower / tied / higher at the lowest T.",
        "",
        table(["stratum", "n seeds", "mean slope", "standard error", "lr*: lower / tied / higher"],
              _stratum_rows(f1, f2)),
        "",
        "Old definition (whole grid) per stratum, not judged:",
        "",
        table(["stratum", "n seeds", "mean slope", "standard error", "-"], _stratum_rows(old, None)),
        "",
        "## Pooled",
        "",
        table(["finding", "estimate", f"value [{percent(r.level)}]", "n", "heterogeneity / test", "verdict"],
              pooled_rows),
        "",
        f"Finding 2 is decided by these lr* pairs (lowest T vs T = 1): {deciding}.",
        "",
        "## Baselines: does the model attend? (design check, outside the family, 95%)",
        "",
        *margin_lines(r.baselines, r.no_stable_seeds, "nat; positive: softmax better"),
        "",
        "Each seed's best loss is its lowest final held-out loss over the LR grid among its stable runs (a diverged "
        "run has no loss to compare), the same choice in the softmax and the uniform arm; against the n-gram "
        "baselines, which choose nothing, it favours the softmax arm slightly. The n-gram models are counted on the "
        "whole training split, more tokens than the 200 steps see.",
        "",
        "## Left out",
        "",
        ("Every curve and seed of every part is in the statistics above." if not r.left_out else
         "Curves and seeds no pooled statistic uses: " + "; ".join(r.left_out) + "."),
        "",
        "## Mechanism and QK-norm, per part (judged by each part's own report, not pooled)",
        "",
        table(["part", *labels.values()], mech_rows),
        "",
        "## Sources",
        "",
        (f"Source hash of every part: {r.source_hash}." if r.source_hash else
         "No part recorded a source hash."),
        "",
        table(["part", "file", "source hash"], source_rows),
        "",
    ])  # fmt: skip


def write_pooled(paths: Sequence[str | Path], out_dir: str | Path, earlier_looks: int = 3) -> Path:
    """Read and pool the parts, then write OUT/pooled.json and OUT/pooled.md (whole or not at all); refuses a
    symlink at either name (it would write outside OUT). Returns the markdown's path."""
    report = pool([read_part(p) for p in paths], earlier_looks)
    return write_outputs(out_dir, json.dumps(report.as_dict(), indent=1, allow_nan=False) + "\n",
                         pooled_markdown(report))


def write_outputs(out_dir: str | Path, json_text: str, markdown: str) -> Path:
    """Write OUT/pooled.json and OUT/pooled.md (whole or not at all); refuses a symlink at either name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    targets = [out / name for name in OUTPUT_NAMES]
    for target in targets:
        if target.is_symlink():
            raise PartError(f"{target} is a symbolic link: refusing to write through it")
        if target.resolve().parent != out.resolve():
            raise PartError(f"{target} resolves outside {out}: refusing to write there")
    write_text_atomically(targets[0], json_text)
    write_text_atomically(targets[1], markdown)
    return targets[1]


__all__ = ["BaselineMargin", "MetaEstimate", "Part", "PartError", "PooledReport", "fixed_effect", "pool",
           "pooled_markdown", "random_effects", "read_part", "write_pooled"]
