"""The effect of T in numbers and in plain words: report.json's per-temperature table (`per_t_json`) and the
sentences that open report.md and its TensorBoard Text entry (`opening`), generated from that JSON alone.

The table holds, for each T, the runs the findings use (the main arm's softmax runs with every key) and, per
quantity, each seed's value with the mean over seeds and its interval: the W_q/W_k gradient norm of the whole network
and of the last layer (the float64 step-0 norms where the findings fit those, and the float32 medians over the logged
steps with every level the step-0 fp64 check contradicts marked left out, as the findings leave it out), validation
perplexity after training, attention entropy and H/log n, and the largest attention logit. The seed is the unit.
Positive quantities that span decades get the geometric mean (`stats.geometric_interval`), the others the mean
(`stats.mean_interval`); every interval is descriptive, at `stats.CONFIDENCE`, outside the findings' family.

An effect compares the lowest T with the reference T (the grid's closest to 1) seed by seed: the runs of one seed
share their data order at every T, so each seed gives one ratio (or, for a quantity that is not positive, one
difference) and the effect is their geometric mean (or mean) with its interval over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from study import tags
from study.report import sources
from study.report import summary as S
from study.report.findings import (
    ONE_OVER_T,
    fp64_unreliable,
    k_all,
    largest_stable_lr,
    main_arm,
    reference_t,
    stability_by_lr,
    step0,
)
from study.report.stats import (
    CONFIDENCE,
    Family,
    Interval,
    TooFew,
    family_level,
    fmt,
    geometric_interval,
    mean_interval,
    percent,
)
from study.report.summary import Summary

WHOLE, LAST = "whole_network", "last_layer"  # the two gradient norms the findings fit, by role


@dataclass(frozen=True)
class Quantity:
    key: str
    label: str  # what the sentences and the table call it
    geometric: bool  # positive and spanning decades: geometric mean and fold changes
    value: Callable[[Summary], float | None]
    ratio_key: str | None = None  # the fp64 check's fp32/fp64 ratio whose disagreement leaves a level out
    role: str = ""  # WHOLE or LAST for the gradient norms the findings fit
    layer: int | None = None  # the last layer's index, for LAST


def last_layer(runs: list[Summary]) -> int | None:
    """The deepest layer with a logged W_q/W_k gradient norm (step-0 float64 or training float32)."""
    layers = {layer for s in runs for grads in (s.step0_grads, s.layer_grads) for layer in grads.get("W_q,W_k", {})}
    return max(layers) if layers else None


def quantities(runs: list[Summary]) -> list[Quantity]:
    """What the table holds for these runs (the step-0 float64 norms only where every run has them, as the findings
    read them: `findings.step0`)."""
    last = last_layer(runs)
    out = []
    if step0(runs):
        out.append(Quantity("grad_qk_step0", "W_q/W_k gradient norm of the whole network (float64, step 0)", True,
                            lambda s: s.values.get(S.STEP0_QK), role=WHOLE))  # fmt: skip
        if last is not None:
            out.append(Quantity("grad_qk_last_step0", f"W_q/W_k gradient norm of the last layer ({last}; float64, "
                                "step 0)", True, lambda s: s.step0_grads.get("W_q,W_k", {}).get(last), role=LAST,
                                layer=last))  # fmt: skip
    fitted = step0(runs)  # where the findings fit the step-0 norms, the float32 ones play no role in them
    out.append(Quantity("grad_qk", "W_q/W_k gradient norm of the whole network (float32, median over the logged "
                        "steps)", True, lambda s: s.values.get(S.GRAD_QK), S.FP64_QK, "" if fitted else WHOLE))  # fmt: skip
    if last is not None:
        out.append(Quantity("grad_qk_last", f"W_q/W_k gradient norm of the last layer ({last}; float32, median over "
                            "the logged steps)", True, lambda s: s.layer_grads.get("W_q,W_k", {}).get(last),
                            S.FP64_LAST_QK, "" if fitted else LAST, last))  # fmt: skip
    out += [
        Quantity("val_ppl", "validation perplexity after training", True,
                 lambda s: None if s.nonfinite else s.final.get(tags.VAL_PPL)),
        Quantity("entropy", "attention entropy (nats, validation)", False, lambda s: s.final.get(sources.ENTROPY)),
        Quantity("normalized_entropy", "H/log n (validation)", False,
                 lambda s: s.final.get(sources.NORMALIZED_ENTROPY)),
        Quantity("max_logit", "largest attention logit (validation)", False, lambda s: s.final.get(sources.MAX_LOGIT)),
    ]  # fmt: skip
    return out


def _interval_json(iv: Interval | None) -> dict | None:
    return None if iv is None else {"estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n, "level": iv.level}


def _by_seed(runs: list[Summary], value: Callable[[Summary], float | None]) -> dict[int, float]:
    """{seed: value} over the runs with a seed and a finite value (several runs of one seed: their mean)."""
    found: dict[int, list[float]] = {}
    for s in runs:
        v = value(s)
        if s.seed is not None and v is not None and math.isfinite(v):
            found.setdefault(s.seed, []).append(v)
    return {seed: float(np.mean(vs)) for seed, vs in sorted(found.items())}


def _mean(values: list[float], geometric: bool, what: str = "seeds") -> tuple[Interval | None, str]:
    """(the mean with its interval, why there is none)."""
    try:
        return (geometric_interval(values, what) if geometric else mean_interval(values, what)), ""
    except TooFew as err:
        return None, f"too few: {err}"


def _cell(runs: list[Summary], t: float, q: Quantity, left_out: dict[float, float]) -> dict:
    mine = [s for s in runs if s.temperature == t]
    seeds = _by_seed(mine, q.value)
    interval, why = _mean(list(seeds.values()), q.geometric and all(v > 0 for v in seeds.values()))
    cell = {"T": t, "runs": len(mine), "seeds": list(seeds), "values": list(seeds.values()),
            "interval": _interval_json(interval)}  # fmt: skip
    if why:
        cell["why"] = why
    if t in left_out:
        cell["left_out"] = (f"fp32 gradient numerically unreliable at step 0 (fp32/fp64 = {fmt(left_out[t], 3)}): "
                            "the findings leave this level out")
    return cell


def _effect(cells: list[dict], q: Quantity, t_from: float, t_to: float) -> dict | None:
    """The change from ``t_from`` to ``t_to`` over the seeds present at both: a fold change (geometric mean of the
    seeds' ratios) for a positive quantity, else a difference (mean of the seeds' differences)."""
    at = {c["T"]: c for c in cells}
    if t_from not in at or t_to not in at or t_from == t_to:
        return None
    a, b = (dict(zip(at[t]["seeds"], at[t]["values"])) for t in (t_from, t_to))
    seeds = [seed for seed in a if seed in b]
    if not seeds:
        return None
    fold = all(a[s] > 0 and b[s] > 0 for s in seeds)
    changes = [b[s] / a[s] if fold else b[s] - a[s] for s in seeds]
    interval, why = _mean(changes, fold)
    effect = {"key": q.key, "label": q.label, "role": q.role, "layer": q.layer, "from_T": t_from, "to_T": t_to,
              "kind": "fold" if fold else "difference", "seeds": len(seeds), "interval": _interval_json(interval),
              "from": at[t_from]["interval"], "to": at[t_to]["interval"]}  # fmt: skip
    if interval is None:  # fewer seeds than an interval needs: the point estimate alone
        effect["estimate"] = math.exp(float(np.mean(np.log(changes)))) if fold else float(np.mean(changes))
        effect["why"] = why
    return effect


def per_t_json(summaries: list[Summary]) -> dict | None:
    """report.json's per-temperature table of these runs (every arm; the table reads the main arm's k = all softmax
    runs, the learning-rate result every arm's), with the effects from the reference T to the lowest T the findings
    keep (none where no T lies below the reference); None without such runs."""
    runs = k_all(main_arm(summaries))
    if not runs:
        return None
    temps = sorted({s.temperature for s in runs})
    t_ref, t_low = reference_t(runs), temps[0]
    table, effects = [], []
    with family_level(Family(1)):  # descriptive: each interval at CONFIDENCE alone, whatever level is in force
        for q in quantities(runs):
            left_out = fp64_unreliable(runs, q.ratio_key) if q.ratio_key else {}
            cells = [_cell(runs, t, q, left_out) for t in temps]
            if not any(c["values"] for c in cells):
                continue
            table.append({"key": q.key, "label": q.label, "role": q.role, "layer": q.layer, "scale": "geometric" if q.geometric
                          else "linear", "by_T": cells})  # fmt: skip
            kept = [t for t in temps if t not in left_out and t < t_ref]  # the paper's effect is of a lower T
            effect = _effect(cells, q, t_ref, min(kept)) if kept else None
            if effect is not None:
                effects.append(effect)
    main = runs[0]
    return {
        "runs": "main arm, softmax, k = all",
        "optimizer": main.optimizer,
        "learning_rate": main.learning_rate,
        "unit": "seed",
        "level": CONFIDENCE,
        "temperatures": temps,
        "reference_T": t_ref,
        "lowest_T": t_low,
        "gradients": "float64 step 0" if step0(runs) else "float32 median over the logged steps",
        "quantities": table,
        "effects": effects,
        "learning_rates": _learning_rates(summaries, t_low, t_ref),
    }


def _learning_rates(summaries: list[Summary], t_low: float, t_ref: float) -> list[dict]:
    """Each optimizer run at two or more learning rates at both the lowest and the reference T: the largest stable
    rate at each (`summary.largest_stable_lr`, the stability finding's), the rates tried and the runs per cell."""
    out = []
    for optimizer, by_t in sorted(stability_by_lr(summaries).items()):
        if t_low not in by_t or t_ref not in by_t or t_low == t_ref:
            continue
        if len(set(by_t[t_low]) | set(by_t[t_ref])) < 2:
            continue
        out.append({"optimizer": optimizer, "by_T": [
            {"T": t, "rates": sorted(by_t[t]), "largest_stable_lr": largest_stable_lr(by_t[t]),
             "diverged": [sum(s.diverged for s in by_t[t][lr]) for lr in sorted(by_t[t])],
             "runs": [len(by_t[t][lr]) for lr in sorted(by_t[t])]}
            for t in (t_low, t_ref)]})  # fmt: skip
    return out


# ---- the opening, from the JSON -----------------------------------------------------------------------------------
def number(x: float | None) -> str:
    """Three significant digits in plain notation from 0.001 to 100,000 (thousands separated), else 1.2e10."""
    if x is None or not math.isfinite(x) or x == 0:
        return fmt(x)
    if 1e-3 <= abs(x) < 1e5:
        rounded = float(f"{x:.3g}")
        text = f"{rounded:,.{max(0, 2 - math.floor(math.log10(abs(rounded))))}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _change(effect: dict) -> str:
    """ "grows 1.22e10-fold [7.4e9, 2.03e10]", "falls 98-fold [50, 200]" or "changes by +0.3 [0.1, 0.5]"."""
    iv = effect.get("interval")
    estimate = iv["estimate"] if iv else effect.get("estimate")
    if estimate is None:
        return "-"
    if effect["kind"] == "fold":
        grows = estimate >= 1
        show = (lambda v: v) if grows else (lambda v: 1 / v)  # noqa: E731
        text = f"{'grows' if grows else 'falls'} {number(show(estimate))}-fold"
        if iv:
            lo, hi = sorted((show(iv["lo"]), show(iv["hi"])))
            text += f" [{number(lo)}, {number(hi)}]" + (" (an interval that includes no change)"
                                                         if iv["lo"] <= 1 <= iv["hi"] else "")  # fmt: skip
    else:
        text = f"changes by {'+' if estimate >= 0 else ''}{number(estimate)}"
        if iv:
            text += f" [{number(iv['lo'])}, {number(iv['hi'])}]"
    return text + ("" if iv else " (no interval)")


def _seeds(effects: list[dict]) -> str:
    """ "3 seeds" (or "3 seeds each"; "3 and 2 seeds")."""
    counts = [e["seeds"] for e in effects]
    unit = "seed" if counts == [1] else "seeds"
    if len(set(counts)) == 1:
        return f"{counts[0]} {unit}" + (" each" if len(counts) > 1 else "")
    return f"{' and '.join(map(str, counts))} {unit}"


def _span(effect: dict) -> str:
    """"from 20.1 to 1,210" of the two levels' means."""
    ends = [effect.get("from"), effect.get("to")]
    if not all(ends):
        return ""
    return f"from {number(ends[0]['estimate'])} to {number(ends[1]['estimate'])}"


def _where(effect: dict, t_to: float) -> str:
    """" (to T = 0.1)" where an effect stops short of the sentence's lowest T (a level left out)."""
    return "" if effect["to_T"] == t_to else f" (to T = {fmt(effect['to_T'])}, the lowest T the findings keep)"


def opening(data: dict) -> str:
    """The 3-5 sentences that state the effect of T, from report.json's ``per_t`` (empty without one): the gradient
    norms the findings fit, perplexity, entropy and the largest logit from the reference T to the lowest, each with
    its interval and seeds, and the learning-rate result where the sweep has one."""
    table = data.get("per_t")
    if not table or not table.get("effects"):
        return ""
    effects = table["effects"]
    by_key = {e["key"]: e for e in effects}
    t_ref, t_low = table["reference_T"], table["lowest_T"]
    arm = f"{table['optimizer']}, lr {fmt(table['learning_rate'])}, softmax with every key"
    sentences = []
    grads = [e for role in (WHOLE, LAST) for e in effects if e.get("role") == role]
    if grads:
        where = {WHOLE: "over the whole network", LAST: "in the last layer"}
        parts = [f"{_change(e)} {where[e['role']]}" + (f" (layer {e['layer']})" if e.get("layer") is not None else "")
                 + _where(e, t_low) for e in grads]  # fmt: skip
        source = ("float64 at step 0, as the findings fit it" if table["gradients"] == "float64 step 0" else
                  "float32 medians over the logged steps, at the levels the findings keep")  # fmt: skip
        sentences.append(f"From T = {fmt(t_ref)} to T = {fmt(t_low)} ({arm}), the W_q/W_k gradient norm "
                         + " and ".join(parts) + f", {_seeds(grads)} ({source}).")
    if (ppl := by_key.get("val_ppl")) is not None:
        sentences.append(f"Validation perplexity after training {_change(ppl)}, {_span(ppl)}{_where(ppl, t_low)} "
                         f"({_seeds([ppl])}).")
    attention = []
    if (h := by_key.get("entropy")) is not None:
        attention.append(f"attention entropy {_change(h)}, {_span(h)} nats{_where(h, t_low)} ({_seeds([h])})")
    if (hn := by_key.get("normalized_entropy")) is not None:
        attention.append(f"H/log n goes {_span(hn)}")
    if (logit := by_key.get("max_logit")) is not None:
        attention.append(f"the largest attention logit {_change(logit)}, {_span(logit)}{_where(logit, t_low)} "
                         f"({_seeds([logit])})")
    if attention:
        text = "; ".join(attention) if len(attention) < 3 else f"{'; '.join(attention[:-1])}; and {attention[-1]}"
        sentences.append(text[0].upper() + text[1:] + ".")
    for lr in table.get("learning_rates") or []:
        cells = [f"{fmt(c['largest_stable_lr']) if c['largest_stable_lr'] is not None else 'none of ' + ', '.join(fmt(r) for r in c['rates'])}"
                 f" at T = {fmt(c['T'])}" for c in lr["by_T"]]  # fmt: skip
        per_cell = sorted({n for c in lr["by_T"] for n in c["runs"]})
        sentences.append(f"Under {lr['optimizer']} the largest stable learning rate is {' and '.join(cells)} "
                         f"({'/'.join(map(str, per_cell))} run{'s' if per_cell != [1] else ''} per T and rate).")
    sentences.append(f"Each interval is {percent(table['level'])} over seeds (the seed is the unit), descriptive and "
                     "outside the verdicts' family, which follow.")
    return " ".join(sentences)


def against_paper(finding: dict) -> str:
    """For a finding whose paper value is 1/T (its estimate a log-log slope against T, the paper's -1): how its
    interval lies against the paper's rate, in words; "" where it reaches into the training rows' band around -1
    (`findings.ONE_OVER_T`: no side to tell) or has none. "Far" when the whole interval lies beyond twice the paper's
    exponent (below -2) or within half of it (above -0.5); a steeper one says what a 10-fold fall of T does under it."""
    iv = finding.get("interval")
    if not iv or not str(finding.get("paper_value") or "").startswith("1/T"):
        return ""
    lo, hi = sorted((iv["lo"], iv["hi"]))
    low, high = ONE_OVER_T.band
    slope = iv["estimate"]
    if hi < low:
        return (f"{'far steeper' if hi < 2 * ONE_OVER_T.claimed else 'steeper'} than the paper's 1/T: under "
                f"T^{fmt(slope, 3)} a 10-fold fall of T multiplies it {number(10 ** -slope)}-fold, not 10-fold")
    if lo > high:
        return (f"{'far shallower' if lo > ONE_OVER_T.claimed / 2 else 'shallower'} than the paper's 1/T "
                f"(T^{fmt(slope, 3)}, not T^-1)")
    return ""
