"""The probe's outputs: probe.json (written by the command), TensorBoard scalars, the figure and console lines."""

from __future__ import annotations

import math
from pathlib import Path

from study import tags
from study.atomic import save_figure

SCALAR_KEYS = ("attn_qk", "rest", "total", "embedding")
JACOBIAN_KEYS = ("mean", "p10", "p50", "p90", "max", "frac_above_quarter_T", "frac_above_sqrt2", "entry_max_times_4T",
                 "entry_frac_above_0.5", "entry_frac_above_0.9")  # fmt: skip


def _positive(value) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def scalars(result: dict) -> dict[str, float]:
    """The TensorBoard scalars of one temperature's all-layer result."""
    out = {"temperature": result["temperature"], "loss": result["loss"]}
    for key in SCALAR_KEYS:
        out[tags.grad_norm(key)] = result[f"grad_{key}"]
    for key in JACOBIAN_KEYS:
        out[f"jacobian/{key}"] = result["jacobian"][key]
    out["saturated_fraction"] = result["jacobian"]["saturated_fraction"]
    for key in ("hessian_qk_norm", "hessian_qk_top"):
        if result.get(key) is not None:
            out[key] = result[key]
    named = {tags.probe(k): float(v) for k, v in out.items()}
    for kind, layers in result["layers"].items():
        for layer, values in enumerate(layers):
            finite = [v for v in values if _positive(v)]
            if finite:
                named[tags.probe_layer(layer, kind)] = math.exp(sum(map(math.log, finite)) / len(finite))
    return named


def single_scalars(layer: int, result: dict) -> dict[str, float]:
    out = {"loss": result["loss"], "grad_attn_qk": result["grad_attn_qk"]}
    out.update({f"jacobian/{k}": result["jacobian"][k] for k in JACOBIAN_KEYS})
    return {tags.probe_single_layer(layer, k): float(v) for k, v in out.items()}


def write_tensorboard(report: dict, out: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "tensorboard"))
    for step, result in enumerate(report["results"]):
        for tag, value in scalars(result).items():
            writer.add_scalar(tag, value, step)
    for entry in report.get("single_layer", []):
        for step, result in enumerate(entry["results"]):
            for tag, value in single_scalars(entry["layer"], result).items():
                writer.add_scalar(tag, value, step)
    writer.close()


def _geomean(values: list[float]) -> float | None:
    finite = [v for v in values if _positive(v)]
    return math.exp(sum(map(math.log, finite)) / len(finite)) if finite else None


def _plot(ax, xs, ys, *args, **kwargs) -> None:
    """Only the points that exist on a log axis (a 0 or a missing value is left out, not drawn as 0)."""
    pts = [(x, y) for x, y in zip(xs, ys) if _positive(y)]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], *args, **kwargs)


def write_figure(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    t = [r["temperature"] for r in results]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    ax = axes[0, 0]
    for entry in report.get("single_layer", []):
        _plot(ax, t, [_geomean([w["grad_attn_qk"] for w in r["windows"]]) for r in entry["results"]], "o-",
              label=f"layer {entry['layer']}")
    if report.get("single_layer"):
        ref = _geomean([w["grad_attn_qk"] for w in report["single_layer"][0]["results"][0]["windows"]])
        if ref:
            _plot(ax, t, [ref * t[0] / x for x in t], "k--", lw=1, label="1/T")
    ax.set(xscale="log", yscale="log", xlabel="T (in that layer only)", title="single layer: its own |grad W_q, W_k|")
    ax = axes[0, 1]
    layers = len(results[0]["layers"]["attn_qk"])
    for layer in sorted({0, layers // 2, layers - 1}):
        _plot(ax, t, [_geomean(r["layers"]["attn_qk"][layer]) for r in results], "o-", label=f"W_q,W_k layer {layer}")
        _plot(ax, t, [_geomean(r["layers"]["residual"][layer]) for r in results], "x:", label=f"residual layer {layer}")
    ax.set(xscale="log", yscale="log", xlabel="T (every layer)", title="T in every layer: per-layer gradients")
    ax = axes[0, 2]
    for key, label in (("grad_attn_qk", "W_q, W_k"), ("grad_rest", "rest"), ("grad_embedding", "embeddings")):
        _plot(ax, t, [r[key] for r in results], "o-", label=label)
    ax.set(xscale="log", yscale="log", xlabel="T (every layer)", title="whole model (mean over windows)")
    ax = axes[1, 0]
    for key in ("p10", "p50", "p90", "max"):
        _plot(ax, t, [r["jacobian"][key] for r in results], "o-", label=f"spectral norm {key}")
    _plot(ax, t, [1 / (4 * x) for x in t], "k--", lw=1, label="1/(4T)")
    _plot(ax, t, [1 / (2 * x) for x in t], "k:", lw=1, label="1/(2T) (exact max)")
    twin = ax.twinx()
    twin.plot(t, [r["jacobian"]["saturated_fraction"] for r in results], "rs:", label="saturated rows")
    twin.plot(t, [r["jacobian"]["entry_frac_above_0.5"] for r in results], "m^:", label="max |J_ij| > 1/(8T)")
    twin.set(ylim=(-0.02, 1.02), ylabel="fraction of rows")
    twin.legend(fontsize=7, loc="lower left")
    ax.set(xscale="log", yscale="log", xlabel="T (every layer)", title="attention Jacobian on sampled rows")
    ax = axes[1, 1]
    _plot(ax, t, [r["loss"] for r in results], "o-", label="loss")
    _plot(ax, t, [r.get("hessian_qk_norm") for r in results], "s-", label="Hessian norm (W_q, W_k), fp32")
    _plot(ax, t, [(r.get("fp64") or {}).get("hessian_qk_norm") for r in results], "k+", ms=10, label="same, fp64")
    ax.set(xscale="log", yscale="log", xlabel="T (every layer)", title="loss and curvature (0 or missing: not drawn)")
    ax = axes[1, 2]
    for name, rows in [("all layers", results)] + [(f"layer {e['layer']} alone", e["results"]) for e in report.get("single_layer", [])]:
        ratios = [fp32_over_fp64(r) for r in rows]
        _plot(ax, t, ratios, "o-", label=name)
    ax.axhline(1, color="grey", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="T", title="|grad W_q, W_k|: fp32 / fp64 (windows checked)")
    for a in axes.flat:
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    fig.tight_layout()
    try:
        save_figure(fig, out / "probe.png", dpi=80)
    finally:
        plt.close(fig)


def fp32_over_fp64(result: dict) -> float | None:
    """The largest-deviating ratio fp32 / fp64 of the W_q/W_k gradient norm over the windows the reference
    repeated (None when it did not run at this T)."""
    reference = (result.get("fp64") or {}).get("grad_attn_qk")
    if not reference:
        return None
    ratios = [w["grad_attn_qk"] / r for w, r in zip(result["windows"], reference) if r > 0]
    return max(ratios, key=lambda x: abs(math.log(x)) if x > 0 else math.inf) if ratios else None


def console_lines(report: dict) -> list[str]:
    lines = []
    for r in report["results"]:
        lines.append(f"T={r['temperature']:g}: loss {r['loss']:.4g}, |grad W_q,W_k| {r['grad_attn_qk']:.4g}, rest "
                     f"{r['grad_rest']:.4g}, Jacobian p50 {r['jacobian']['p50']:.4g}, saturated "
                     f"{r['jacobian']['saturated_fraction']:.3g}")  # fmt: skip
    for entry in report.get("single_layer", []):
        values = ", ".join(f"{r['grad_attn_qk']:.3g}" for r in entry["results"])
        lines.append(f"layer {entry['layer']} alone, |grad W_q,W_k| by T: {values}")
    return lines
