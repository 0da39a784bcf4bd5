"""The probe's findings and its section of report.md, from `<sweep>/probe/probe.json` (`study probe`).

The finding is the paper's per-layer claim, tested one layer at a time: with T lowered in that layer only, its
own W_q/W_k gradient grows like 1/T. Its slope is fitted on the grid's T <= `REGIME_MAX_T` (the low-temperature
regime, where the paper states that the sensitivity follows 1/T), one slope per independent text window and a
t-interval over windows (the same windows at every T), and judged by `SINGLE_LAYER_RULE`, two-sided. Where the fp64 reference
ran inside that regime and an fp32 gradient differs from it by more than `FP64_TOLERANCE`, the verdict is
"numerically unreliable". With T lowered in every layer the slopes are described (per layer and parameter type,
and against depth), not judged: they measure how gradients compound through depth, not the claim.
"""

from __future__ import annotations

import math
from pathlib import Path

from study.atomic import save_figure
from study.report.stats import (
    INCONCLUSIVE,
    UNDERPOWERED,
    UNRELIABLE,
    BandRule,
    Interval,
    TooFew,
    decide,
    fmt,
    least_squares_slope,
    loglog_slope,
    slope_interval,
)

SINGLE_LAYER_RULE = BandRule(claimed=-1.0, width=0.25)
REGIME_MAX_T = 0.1  # the verdict's regime: the grid's T <= this
FP64_TOLERANCE = 0.05  # |fp32 / fp64 - 1| above this makes a gradient numerically unreliable
KIND_NAMES = {"attn_qk": "W_q, W_k", "attn_v": "W_v", "attn_out": "W_o", "mlp": "MLP", "residual": "residual stream"}
FIGURE = "probe_layers.png"


def _positive(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def geomean(values) -> float | None:
    finite = _positive(values)
    return math.exp(sum(map(math.log, finite)) / len(finite)) if finite else None


def local_slopes(levels: dict[float, list[float]]) -> list[tuple[float, float, float | None]]:
    """(T1, T2, slope of the geometric means between them) for each adjacent pair of the sorted T."""
    ts = sorted(levels)
    out = []
    for a, b in zip(ts, ts[1:]):
        ga, gb = geomean(levels[a]), geomean(levels[b])
        out.append((a, b, math.log(gb / ga) / math.log(b / a) if ga and gb else None))
    return out


def in_regime(levels: dict[float, list[float]]) -> dict[float, list[float]]:
    return {t: v for t, v in levels.items() if t <= REGIME_MAX_T}


def fp32_over_fp64(result: dict) -> float | None:
    """The ratio fp32 / fp64 of the W_q/W_k gradient norm that deviates most over the windows the fp64 reference
    repeated (None where it did not run)."""
    reference = (result.get("fp64") or {}).get("grad_attn_qk") or []
    ratios = [w["grad_attn_qk"] / r for w, r in zip(result.get("windows", []), reference) if r and r > 0]
    ratios = [r for r in ratios if r > 0 and math.isfinite(r)]
    return max(ratios, key=lambda x: abs(math.log(x))) if ratios else None


def unreliable(results: list[dict], regime_only: bool = True) -> list[tuple[float, float]]:
    """(T, fp32/fp64) wherever the fp64 reference disagrees beyond `FP64_TOLERANCE` (in the regime only)."""
    out = []
    for r in results:
        ratio = fp32_over_fp64(r)
        if ratio is not None and (not regime_only or r["temperature"] <= REGIME_MAX_T) and abs(ratio - 1) > FP64_TOLERANCE:
            out.append((r["temperature"], ratio))
    return out


def single_layer_findings(probe: dict | None) -> list[dict]:
    """One finding per layer of the single-layer test (the fields of `study.report.findings.Finding`): the layer's
    own W_q/W_k gradient against T in that layer alone."""
    out = []
    for entry in (probe or {}).get("single_layer", []):
        results = entry["results"]
        levels = in_regime({float(r["temperature"]): [w["grad_attn_qk"] for w in r["windows"]] for r in results})
        claim = (f"5. a layer's attention-logit gradient grows like 1/T (layer {entry['layer']} alone, "
                 f"{probe.get('model', '?')}, frozen)")  # fmt: skip
        statistic = (f"log-log slope of layer {entry['layer']}'s |grad W_q, W_k| vs T in that layer only, "
                     f"T <= {fmt(REGIME_MAX_T)}, one slope per text window, t-interval over windows")  # fmt: skip
        try:
            interval = slope_interval(levels, what="text windows", paired=True)
        except TooFew as err:
            out.append(finding(claim, statistic, f"too few: {err}", INCONCLUSIVE, SINGLE_LAYER_RULE.describe(), None))
            continue
        verdict, note = decide(SINGLE_LAYER_RULE, interval)
        value = str(interval)
        if side := SINGLE_LAYER_RULE.side(interval):
            value += f" ({side})"
        if note:
            value += f"; {UNDERPOWERED}: {note}"
        low = min(levels)
        sat = next((r["jacobian"].get("saturated_fraction") for r in results if float(r["temperature"]) == low), None)
        if sat is not None:
            value += f"; saturated rows at T={fmt(low)}: {fmt(sat, 3)}"
        if bad := unreliable(results):
            verdict = UNRELIABLE
            value += "; fp32/fp64 " + ", ".join(f"{fmt(r, 3)} at T={fmt(t)}" for t, r in bad)
        out.append(finding(claim, statistic, value, verdict, SINGLE_LAYER_RULE.describe() + f"; {UNRELIABLE} if "
                           f"fp32 and fp64 differ by more than {fmt(100 * FP64_TOLERANCE)}% in that range", interval))  # fmt: skip
    return out


def finding(claim: str, statistic: str, value: str, verdict: str, rule: str, interval: Interval | None) -> dict:
    return {"claim": claim, "null": "slope 0 (no dependence on T)", "statistic": statistic, "value": value,
            "verdict": verdict, "rule": rule, "paper_value": "1/T", "experiment": "probe", "interval": interval}  # fmt: skip


# ---- T in every layer: described, not judged --------------------------------------------------------------------
DESCRIBE_MAX_T = 1.0  # T in every layer is described over T <= this: lowering T from the stock model's


def described_temperatures(probe: dict) -> list[float]:
    """The T over which the every-layer slopes are described: T <= `DESCRIBE_MAX_T`, without those where the fp64
    reference found the every-layer fp32 gradient numerically unreliable."""
    bad = {t for t, _ in unreliable(probe["results"], regime_only=False)}
    return [float(r["temperature"]) for r in probe["results"] if float(r["temperature"]) <= DESCRIBE_MAX_T
            and float(r["temperature"]) not in bad]  # fmt: skip


def layer_slopes(probe: dict) -> dict[str, list[float | None]]:
    """Per parameter type, per layer: the log-log slope of the layer's gradient norm (geometric mean over windows)
    against T in every layer, over `described_temperatures`."""
    keep = set(described_temperatures(probe))
    results = [r for r in probe["results"] if float(r["temperature"]) in keep]
    if not results:
        return {}
    ts = [float(r["temperature"]) for r in results]
    out = {}
    for kind in KIND_NAMES:
        if kind not in results[0].get("layers", {}):
            continue
        layers = len(results[0]["layers"][kind])
        out[kind] = [loglog_slope(ts, [geomean(r["layers"][kind][layer]) for r in results]) for layer in range(layers)]
    return out


def depth_trend(slopes: list[float | None]) -> tuple[float, float, float] | None:
    """(slope at the first layer, at the last, change per layer by least squares) of per-layer slopes."""
    pts = [(i, s) for i, s in enumerate(slopes) if s is not None]
    if len(pts) < 2:
        return None
    per_layer = least_squares_slope([p[0] for p in pts], [p[1] for p in pts])
    return pts[0][1], pts[-1][1], per_layer


def depth_statement(slopes: dict[str, list[float | None]]) -> str:
    """What the per-layer slopes say, in words built from the numbers (not a verdict)."""
    trend = depth_trend(slopes.get("attn_qk", []))
    if trend is None:
        return "Too few temperatures in the regime to describe the per-layer slopes."
    first, last, per_layer = trend
    layers = len(slopes["attn_qk"])
    text = (f"With T lowered in every layer, the W_q/W_k gradient of layer 0 grows like T^{fmt(first, 3)} and that of "
            f"layer {layers - 1} like T^{fmt(last, 3)} ({fmt(per_layer, 2)} per layer of depth): ")  # fmt: skip
    if first < last - 0.5 and per_layer > 0.02:
        text += "the more low-T layers above a layer, the steeper its slope: gradients compound through depth. "
    elif abs(first - last) <= 0.25 and abs(per_layer) <= 0.02:
        text += "about the same slope at every depth. "
    else:
        valid = [v for v in slopes["attn_qk"] if v is not None]
        text += f"no steady pattern with depth (slopes from {fmt(min(valid), 3)} to {fmt(max(valid), 3)}). "
    controls = {k: depth_trend(v) for k, v in slopes.items() if k != "attn_qk"}
    alike = [k for k, t in controls.items() if t is not None and abs(t[0] - first) <= 0.25 * max(abs(first), 1)]
    if controls:
        text += "At layer 0 the controls grow like " + ", ".join(
            f"{KIND_NAMES[k]} T^{fmt(t[0], 3)}" for k, t in controls.items() if t is not None) + "; "  # fmt: skip
        text += (f"{', '.join(KIND_NAMES[k] for k in alike)} within 25% of W_q/W_k: nothing there is specific to the "
                 "attention logits." if alike else "none of them within 25% of W_q/W_k.")  # fmt: skip
    return text


def draw_layers(probe: dict, out: Path) -> str | None:
    """Slope against layer depth, one line per parameter type; the caption, or None without data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slopes = layer_slopes(probe)
    if not slopes:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for kind, values in slopes.items():
        pts = [(i, s) for i, s in enumerate(values) if s is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if kind == "attn_qk" else ".--", label=KIND_NAMES[kind])
    for entry in probe.get("single_layer", []):
        levels = in_regime({float(r["temperature"]): [w["grad_attn_qk"] for w in r["windows"]] for r in entry["results"]})
        slope = loglog_slope(list(levels), [geomean(v) for v in levels.values()])
        if slope is not None:
            ax.plot([entry["layer"]], [slope], "k*", ms=12)
    ax.plot([], [], "k*", ms=12, label="W_q, W_k with T in that layer alone")
    ax.axhline(-1, color="grey", lw=1, ls=":", label="1/T")
    ax.set(xlabel="layer", ylabel=f"log-log slope vs T (T = {', '.join(fmt(t) for t in described_temperatures(probe))})",
           title="gradient slope against T, per layer (T lowered in every layer)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        save_figure(fig, out / FIGURE, dpi=90)
    finally:
        plt.close(fig)
    return "Probe: gradient slope against T per layer and parameter type, and the single-layer test"
