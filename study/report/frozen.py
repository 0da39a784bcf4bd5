"""The frozen-model findings: the paper's central claims about a pretrained model, from `study analyze`'s
results.json (a sweep's `analyze:` step writes `<sweep>/analyze/results.json`).

The replicates are the independent text windows `study analyze --windows K` draws across the held-out texts.
Each window gives one value of each statistic (computed over every analysed head of every layer of that window),
and the interval is over windows: texts are the independent unit, heads are summarised within a text (a
two-stage summary, so the interval does not treat the heads of one text as independent draws).

    N*/L       critical N of Algorithm 3 (KS test of per-head d against E), paper: about 0.06 L
    N* vs L    the log-log slope of N* against L over the lengths analysed, paper: proportional (slope 1)
               Both design-dependent: N* is where the KS test over the pooled heads loses power, so the head count
               sets it. Their value and interval are kept, outside the family, beside d/E against N/L at 9, 27 and
               54 pooled heads (`critical_effect.design_note`).
    N_s/N      geometric separability of Algorithm 4 for N >= 16, paper: 0.70-0.85
    g(T)       Algorithm 5's gradient probe for T < 0.1, paper: like 1/T (a two-sided band on the exponent)
    g drop     g at the low T against g at T = 1, paper: about 100x
    Lemma 1    a bound, not a rate: measured descriptively (max weight and entropy of fixed queries against the
               number of keys n, and how far the lemma's constant lies above the data), no verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.report.critical_effect import design_note
from study.report.findings import DESCRIPTIVE, Finding
from study.report.read import read_optional_json
from study.report.stats import (
    DESIGN_DEPENDENT,
    INCONCLUSIVE,
    NOT_SUPPORTED,
    UNDERPOWERED,
    BandRule,
    Interval,
    TooFew,
    confidence,
    decide,
    fmt,
    loglog_slope,
    mean_interval,
    percent,
    slope_interval,
)

RESULTS = Path("analyze") / "results.json"  # inside the sweep folder
WHAT = "text windows"
ALPHA = 0.01  # the KS level of the paper's text (its pseudocode's 0.05 is shown beside it)
SEPARABILITY_MIN_N = 16  # the paper: N_s/N falls until N ~ 16, then saturates
LOW_T = 0.1  # the paper's 1/T range: T < 0.1
HIGH_T = 1.0  # the drop is measured to the first T >= 1


@dataclass(frozen=True)
class RangeRule:
    """An equivalence claim, "the quantity is about x": an interval of plausible values [low, high].

    supported      the interval (at the family's level) lies inside [low, high];
    not supported  it lies entirely outside (`side` says which way);
    inconclusive   it straddles an edge, or there is no interval.
    With ``log`` the interval is on the natural log of the quantity (ratios: judged and averaged as logs).
    """

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (self.low < self.high) or (self.log and self.low <= 0):
            raise ValueError(f"[{self.low}, {self.high}]: the range needs low < high (and low > 0 on a log scale)")

    def _band(self) -> BandRule:
        lo, hi = (math.log(self.low), math.log(self.high)) if self.log else (self.low, self.high)
        return BandRule((lo + hi) / 2, (hi - lo) / 2)

    def verdict(self, interval: Interval | None) -> str:
        return self._band().verdict(interval)

    def decisive_half_width(self) -> float:
        return self._band().width

    def margin(self) -> str:
        scale = "log " if self.log else ""
        return f"the range's {scale}half-width {fmt(self._band().width, 3)}"

    def side(self, interval: Interval | None) -> str:
        if self.verdict(interval) != NOT_SUPPORTED:
            return ""
        return "above the range" if min(interval.lo, interval.hi) > self._band().band[1] else "below the range"

    def describe(self) -> str:
        scale = " (on a log scale)" if self.log else ""
        return (f"supported if the {percent(confidence())} interval lies within [{fmt(self.low)}, {fmt(self.high)}]{scale}, not supported "
                "if it lies entirely outside that range")


N_STAR_RULE = RangeRule(0.03, 0.12, log=True)  # within a factor 2 of the paper's 0.06
N_STAR_SLOPE_BAND = BandRule(1.0, 0.25, "L")  # "N* ~ 0.06 L": proportional to L
SEPARABILITY_RULE = RangeRule(0.70, 0.85)  # the paper's saturation band
SLOPE_BAND = BandRule(-1.0, 0.25, "T")  # "follows 1/T"
DROP_RULE = RangeRule(10**1.5, 10**2.5, log=True)  # "about 100x": within a factor sqrt(10)


def load_analysis(sweep_dir: Path) -> dict | None:
    """`<sweep>/analyze/results.json` if the sweep ran `study analyze` (a damaged one is named and left out)."""
    return read_optional_json(Path(sweep_dir) / RESULTS)


def _model(results: dict) -> str:
    return str((results.get("source") or {}).get("model") or (results.get("model") or {}).get("name_or_path") or "?")


def _exp_interval(interval: Interval) -> Interval:
    """A log-scale interval on the quantity's own scale (a ratio), for display and report.json."""
    return Interval(math.exp(interval.estimate), math.exp(interval.lo), math.exp(interval.hi), interval.n,
                    interval.level, unit=interval.unit)  # fmt: skip


def _exp(interval: Interval) -> str:
    return str(_exp_interval(interval))


def _judge(claim: str, null: str, statistic: str, rule, compute: Callable[[], Interval], show=str) -> Finding:
    """One interval and its verdict; too few windows (or no per-window values) make the finding inconclusive."""
    try:
        interval = compute()
    except TooFew as err:
        return Finding(claim, null, statistic, f"too few: {err}", INCONCLUSIVE, rule.describe())
    side = rule.side(interval)  # which way a value outside the claimed range lies
    verdict, note = decide(rule, interval)
    value = show(interval) + (f" ({side})" if side else "") + (f"; {UNDERPOWERED}: {note}" if note else "")
    shown = _exp_interval(interval) if show is _exp else interval  # report.json holds what the value shows
    return Finding(claim, null, statistic, value, verdict, rule.describe(), interval=shown)


def _frozen(finding: Finding, paper_value: str) -> Finding:
    finding.paper_value, finding.experiment = paper_value, "frozen"
    return finding


def design_dependent(finding: Finding, results: dict) -> Finding:
    """Label an N* row DESIGN_DEPENDENT (outside the family; its value and interval kept), with d/E against N/L at
    9, 27 and 54 pooled heads beside it and the rule it would have been judged by."""
    judged, finding.verdict = finding.verdict, DESIGN_DEPENDENT
    finding.value += f"; {design_note(results, ALPHA)}"
    finding.rule = (f"not judged ({DESIGN_DEPENDENT}: the KS test's head count sets N*); its rule, which would read "
                    f"{judged}: {finding.rule}")
    return finding


# ---- Algorithm 3: the critical N* ------------------------------------------------------------------------------
def _n_star_logs(block: dict, alpha: float) -> tuple[list[float], int]:
    """log(N*/L) at the longest L per window; a window where no N reached p >= alpha counts as N* = L."""
    per_window = block["n_star_over_length"][str(alpha)]
    never = sum(row[-1] is None for row in per_window)
    return [math.log(1.0 if row[-1] is None else row[-1]) for row in per_window], never


def on_a_grid(values: list[float]) -> list[float]:
    """Values read off the N grid (N* and what is computed from it): when every window gives the same one, there
    is no spread to build an interval from. A zero-width t-interval would claim a precision the grid does not
    have (the true N* lies anywhere up to the next grid step), so there is no interval: a finer N grid or more
    windows would decide it."""
    if len(values) >= 2 and len(set(values)) == 1:
        raise TooFew(f"every one of the {len(values)} text windows gave the same grid value, no spread for an "
                     "interval (the N grid's step bounds it): a finer N grid would decide it")  # fmt: skip
    return values


def n_star_finding(results: dict, design_label: bool = True) -> Finding:
    """N*/L at the longest L against the paper's 0.06, labelled design-dependent (`design_dependent`); without
    `design_label`, the row as its rule reads it (the planted controls test that rule)."""
    block = results["alg3_critical_n_by_window"]
    length = block["lengths"][-1]
    logs, never = _n_star_logs(block, ALPHA)
    compute = lambda: mean_interval(on_a_grid(logs), what=WHAT)  # noqa: E731
    finding = _judge(
        f"3. critical N* ~ 0.06 L (frozen {_model(results)}, L={length}, KS alpha={ALPHA})",
        "N*/L outside [0.03, 0.12] (not about 0.06)",
        "geometric mean over text windows of N*/L; per window, N* = the first N whose per-head d and E (every "
        "head of every layer) a two-sample KS test cannot tell apart",
        N_STAR_RULE,
        compute,
        show=_exp,
    )
    other = [a for a in (results.get("choices") or {}).get("alphas", []) if a != ALPHA]
    for alpha in other:
        if str(alpha) in block["n_star_over_length"]:
            values = [math.exp(v) for v in _n_star_logs(block, alpha)[0]]
            finding.value += f"; alpha={alpha:g}: {fmt(float(np.exp(np.mean(np.log(values)))), 3)}"
    if never:
        finding.value += f"; {never} window(s) never reached p >= {ALPHA} (counted as N* = L)"
    finding = _frozen(finding, "N* ~ 0.06 L")
    return design_dependent(finding, results) if design_label else finding


def n_star_slope_finding(results: dict, design_label: bool = True) -> Finding:
    """Is N* proportional to L? Labelled design-dependent like `n_star_finding` (without `design_label`: as the
    rule reads it). Per window, the least-squares slope of log N* on log L over the lengths analysed
    (lengths where that window's KS test never reached p >= alpha are left out of its fit, and counted); the mean
    slope over windows with a t-interval, judged by a band around 1. The value also gives N*/L at each L
    (geometric mean over the windows that reached it): the constant, if the slope is 1."""
    block = results["alg3_critical_n_by_window"]
    lengths = block["lengths"]
    per_window = block["n_star_over_length"][str(ALPHA)]
    slopes, left_out = [], 0
    for row in per_window:
        left_out += sum(r is None for r in row)
        slopes.append(loglog_slope(lengths, [None if r is None else r * n for r, n in zip(row, lengths)]))

    def compute() -> Interval:
        if len(lengths) < 2:
            raise TooFew(f"one length L={lengths[0]} (a slope needs two or more)")
        return mean_interval([s for s in slopes if s is not None], what=WHAT)

    finding = _judge(
        f"3. critical N* grows in proportion to L (frozen {_model(results)}, L={lengths[0]}..{lengths[-1]}, KS "
        f"alpha={ALPHA})",
        "a slope outside 1 +- 0.25 (N* not proportional to L)",
        "per text window, the least-squares slope of log N* on log L over the lengths analysed; mean over windows",
        N_STAR_SLOPE_BAND,
        compute,
    )
    ratios = []
    for li, n in enumerate(lengths):
        reached = [row[li] for row in per_window if row[li] is not None and row[li] > 0]
        ratios.append(f"{n}: {fmt(float(np.exp(np.mean(np.log(reached)))), 3)}" if reached else f"{n}: -")
    finding.value += "; N*/L at L = " + ", ".join(ratios)
    if left_out:
        finding.value += f"; {left_out} (window, L) point(s) never reached p >= {ALPHA} (left out of the fits)"
    finding = _frozen(finding, "N* proportional to L (0.06 L)")
    return design_dependent(finding, results) if design_label else finding


# ---- Algorithm 4: separability --------------------------------------------------------------------------------
def separability_finding(results: dict) -> Finding:
    block = results["alg4_separability_by_window"]
    cols = [i for i, n in enumerate(block["ns"]) if n >= SEPARABILITY_MIN_N]

    def per_window() -> list[float]:
        if not cols:
            raise TooFew(f"no N >= {SEPARABILITY_MIN_N} below L (N grid {block['ns']})")
        out = []
        for row in block["median_over_heads"]:
            values = [row[i] for i in cols if row[i] is not None]
            if values:
                out.append(float(np.mean(values)))
        return out

    compute = lambda: mean_interval(per_window(), what=WHAT)  # noqa: E731
    ns = ", ".join(str(block["ns"][i]) for i in cols) or "-"
    finding = _judge(
        f"4. N_s/N saturates at 0.70-0.85 for N >= {SEPARABILITY_MIN_N} (frozen {_model(results)})",
        "N_s/N outside [0.70, 0.85]",
        f"per text window: the median over every head of N_s/N, averaged over N = {ns}; mean over windows",
        SEPARABILITY_RULE,
        compute,
    )
    return _frozen(finding, "0.70-0.85")


# ---- Algorithm 5: gradient sensitivity ------------------------------------------------------------------------
def _g_levels(results: dict) -> tuple[list[float], list[list[float]]]:
    """(temperatures, per window g at each T): the max over heads at the smallest eps, Algorithm 5's reading."""
    temps = results["choices"]["temperatures"]
    g = results["alg5_gradient_by_window"]["g_max_over_heads"]  # [window][T][eps]
    return temps, [[row[ti][0] for ti in range(len(temps))] for row in g]


def tightness(temps: list[float], g: list[list[float]]) -> dict[float, float]:
    """{T: geometric mean over windows of g(T) x 4T} for T < LOW_T: how close Algorithm 5's measured sensitivity
    comes to the entrywise bound 1/(4T) of Corollary 3 (the paper calls it close to the theoretical limit)."""
    out = {}
    for ti, t in enumerate(temps):
        values = [w[ti] * 4 * t for w in g if w[ti] is not None and w[ti] > 0]
        if t < LOW_T and values:
            out[t] = float(np.exp(np.mean(np.log(values))))
    return out


def gradient_slope_finding(results: dict) -> Finding:
    temps, g = _g_levels(results)
    low = [ti for ti, t in enumerate(temps) if t < LOW_T]
    levels = {temps[ti]: [w[ti] for w in g] for ti in low}
    compute = lambda: slope_interval(levels, what=WHAT, paired=True)  # noqa: E731
    eps = results["choices"]["epsilons"][0]
    finding = _judge(
        f"5. gradient sensitivity g follows 1/T for T < {LOW_T:g} (frozen {_model(results)}, Algorithm 5)",
        "an exponent outside -1 +- 0.25",
        f"log-log slope of g(T) (eps={eps:g}, token-averaged, max over heads) against T < {LOW_T:g}: geometric "
        "mean over text windows per T; one slope per text window (the same windows at every T), t-interval over "
        "windows",
        SLOPE_BAND,
        compute,
    )
    if tight := tightness(temps, g):
        finding.value += "; tightness g x 4T (1 = Corollary 3's bound) " + ", ".join(
            f"{fmt(t)}: {fmt(v, 3)}" for t, v in tight.items())  # fmt: skip
    saturated = results["alg5_gradient_by_window"].get("saturated_fraction")
    if low and saturated:
        t0 = low[0]
        frac = [w[t0] for w in saturated if w[t0] is not None]
        if frac:
            finding.value += f"; saturated rows at T={temps[t0]:g}: {fmt(float(np.mean(frac)), 3)}"
    return _frozen(finding, "1/T (slope -1)")


def gradient_drop_finding(results: dict) -> Finding:
    temps, g = _g_levels(results)
    low = [ti for ti, t in enumerate(temps) if t < LOW_T]
    high = [ti for ti, t in enumerate(temps) if t >= HIGH_T]

    def logs() -> list[float]:
        if not low or not high:
            raise TooFew(f"the T grid {temps} does not span T < {LOW_T:g} and T >= {HIGH_T:g}")
        out = []
        for w in g:
            top = [w[ti] for ti in low if w[ti] is not None and w[ti] > 0]
            ref = w[high[0]]
            if top and ref is not None and ref > 0:
                out.append(math.log(max(top) / ref))
        return out

    compute = lambda: mean_interval(logs(), what=WHAT)  # noqa: E731
    ref_t = temps[high[0]] if high else HIGH_T
    finding = _judge(
        f"5. g drops ~100x from T < {LOW_T:g} to T = {ref_t:g} (frozen {_model(results)})",
        "a drop outside 32x-316x (not about 100x)",
        f"per text window: the largest g at T < {LOW_T:g} over g at T = {ref_t:g} (max over heads); geometric "
        "mean over windows",
        DROP_RULE,
        compute,
        show=_exp,
    )
    return _frozen(finding, "~100x")


# ---- Lemma 1: descriptive -------------------------------------------------------------------------------------
def lemma1_measurement(results: dict) -> Finding | None:
    """Lemma 1 on fixed queries: how the max weight falls with the number of keys n, and how far the lemma's
    constant lies above the data. A bound says nothing about a rate, so there is no verdict."""
    block = results.get("lemma1_fixed_query_by_window")
    if not block:
        return None
    counts = block["lengths"]
    slopes = [loglog_slope(counts, row) for row in block["max_weight"]]
    try:
        interval = str(mean_interval([s for s in slopes if s is not None], what=WHAT))
    except TooFew as err:
        interval = f"too few: {err}"

    def median_last(key: str) -> float | None:
        values = [row[-1] for row in block.get(key, []) if row[-1] is not None]
        return float(np.median(values)) if values else None

    scaled, paper, spread = median_last("scaled_max"), median_last("log10_paper_bound"), median_last("log10_range_bound")
    entropy = median_last("normalized_entropy")
    gap = f"10^{fmt(paper - math.log10(scaled), 3)}" if scaled and paper is not None else "-"
    spread_gap = f"10^{fmt(spread - math.log10(scaled), 3)}" if scaled and spread is not None else "-"
    value = (f"slope of max weight vs n {interval}; at n={counts[-1]}: n x max weight {fmt(scaled, 3)}, H/log n "
             f"{fmt(entropy, 3)}; the paper's constant exp(2D/T) lies {gap} above n x max weight, the logit-range "
             f"constant exp(Delta/T) {spread_gap}")
    return Finding(
        f"1. Lemma 1 (frozen {_model(results)}): dilution of fixed queries against the number of keys n",
        "none (a bound, not a rate)",
        f"the last query of each text window, softmax over its n most recent keys (n = {', '.join(map(str, counts))});"
        " per window, the log-log slope of the mean max weight over heads against n; medians over windows and heads",
        value,
        DESCRIPTIVE,
        "descriptive: C1/n <= alpha_i <= C2/n holds with C2 = exp(2D/T) (D = |q| max|k|), which says nothing "
        "about the slope; 1/n (slope -1) is the fully diluted row",
        paper_value="C1/n <= alpha <= C2/n (a bound)",
        experiment="frozen",
    )


def frozen_findings(results: dict | None) -> list[Finding]:
    """The frozen-model findings of a `study analyze` results.json, each from its per-window block (the replicates
    its interval needs); none when there is no results.json, or it predates the per-window results. A run of some
    analyses only (`--analyses`) gives theirs."""
    if not results:
        return []
    out = []
    if "alg3_critical_n_by_window" in results:
        out += [n_star_finding(results), n_star_slope_finding(results)]
    if "alg4_separability_by_window" in results:
        out.append(separability_finding(results))
    if "alg5_gradient_by_window" in results:
        out += [gradient_slope_finding(results), gradient_drop_finding(results)]
    lemma = lemma1_measurement(results)
    return out + ([lemma] if lemma is not None else [])
