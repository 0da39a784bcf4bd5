"""What `study analyze` writes: results JSON, a per-head CSV, the claims table and one figure per algorithm."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np


def _box(ax, data: list, labels: list, title: str, ylabel: str):
    clean = [[v for v in d if v is not None and math.isfinite(v)] for d in data]
    ax.boxplot(clean, showfliers=False)
    ax.set_xticks(range(1, len(labels) + 1), [str(x) for x in labels])
    ax.set_title(title)
    ax.set_ylabel(ylabel)


def _heads(per_layer: list, index: int) -> list:
    return [v for layer in per_layer for v in layer[index]]


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(results: dict, out_dir, *, figures: bool = True) -> dict:
    """Write results.json, per_head.csv, claims.md and figures (fig2a/2b/2c/3/4 and dilution) to out_dir."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ch = results["choices"]
    paths = {"json": out / "results.json", "csv": out / "per_head.csv", "claims": out / "claims.md"}
    paths["json"].write_text(json.dumps(results, indent=1, allow_nan=False))
    n_analysed = len(results["lemma1_dilution"]["max_weight"])
    ids = ch.get("layers") or list(range(n_analysed))  # per-layer arrays are in this order

    with paths["csv"].open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["analysis", "metric", "layer", "head", "L", "N", "T", "eps", "value"])
        for metric, per_layer in results["alg1_distance_vs_length"].items():
            for layer, rows in zip(ids, per_layer):
                for li, vals in enumerate(rows):
                    for head, v in enumerate(vals):
                        wr.writerow(["alg1", metric, layer, head, ch["lengths"][li], ch["n_fixed"], "", "", v])
        for metric, per_layer in results["alg2_distance_vs_n"].items():
            for layer, rows in zip(ids, per_layer):
                for ni, vals in enumerate(rows):
                    for head, v in enumerate(vals):
                        wr.writerow(["alg2", metric, layer, head, ch["lengths"][-1], ch["ns"][ni], "", "", v])
        for metric, per_layer in results["alg4_separability"].items():
            if metric == "radius":
                continue
            for layer, rows in zip(ids, per_layer):
                for ni, vals in enumerate(rows):
                    for head, v in enumerate(vals):
                        wr.writerow(["alg4", metric, layer, head, ch["lengths"][-1], ch["separability_ns"][ni],
                                     "", "", v])
        for layer, heads in zip(ids, results["alg5_gradient"]["g_per_head"]):
            for head, per_t in enumerate(heads):
                for ti, per_e in enumerate(per_t):
                    for ei, v in enumerate(per_e):
                        wr.writerow(["alg5", "g", layer, head, ch["lengths"][-1], "", ch["temperatures"][ti],
                                     ch["epsilons"][ei], v])
        for metric, per_layer in results["lemma1_dilution"].items():
            for layer, heads in zip(ids, per_layer):
                for head, vals in enumerate(heads):
                    for li, v in enumerate(vals):
                        wr.writerow(["lemma1", metric, layer, head, ch["lengths"][li], "", "", "", v])

    lines = ["| claim (paper) | measured | rule | verdict |", "|---|---|---|---|"]
    for c in results["claims"]:
        lines.append(f"| {c['claim']} | {c['measured'] or '-'} | {c['rule']} | {c['verdict']} |")
    lines += ["", f"vectors: {ch['vectors']} ({ch['vector_note']}); distance reading: {ch['distance_reading']}; "
              f"KS alphas: {ch['alphas']}; reconstructed formulas: {', '.join(ch['reconstructions'])}."]
    paths["claims"].write_text("\n".join(lines) + "\n")
    if not figures:
        return {k: str(v) for k, v in paths.items()}

    a1 = results["alg1_distance_vs_length"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    _box(ax, [_heads(a1["d_sum_outside"], i) for i in range(len(ch["lengths"]))], ch["lengths"],
         f"Fig. 2a: distance d vs L (N={ch['n_fixed']}, box over heads)", "token-averaged d")
    for key, style in (("bound", "r--"), ("expectation", "g:"), ("mc_expectation", "m-.")):
        if key in a1:
            med = [np.nanmedian([np.nan if v is None else v for v in _heads(a1[key], i)])
                   for i in range(len(ch["lengths"]))]
            ax.plot(range(1, len(med) + 1), med, style, label=f"median {key}")
    ax.set_yscale("log")
    ax.set_xlabel("L")
    ax.legend()
    paths["fig2a"] = _save(plt, fig, out / "fig2a_distance_vs_length.png")

    a2 = results["alg2_distance_vs_n"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    _box(ax, [_heads(a2["d_sum_outside"], i) for i in range(len(ch["ns"]))], ch["ns"],
         f"Fig. 2b: distance d vs N (L={ch['lengths'][-1]})", "token-averaged d")
    ax.set_xlabel("N")
    paths["fig2b"] = _save(plt, fig, out / "fig2b_distance_vs_n.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for alpha in ch["alphas"]:
        pts = [(r["length"], r["n_star"][str(alpha)]) for r in results["alg3_critical_n"]
               if r["n_star"][str(alpha)] is not None]
        if pts:
            ax.plot(*zip(*pts), "o-", label=f"N* (KS alpha={alpha})")
    ls = np.array(ch["lengths"], dtype=float)
    ax.plot(ls, 0.06 * ls, "k--", label="paper: 0.06 L")
    ax.set_xlabel("L")
    ax.set_ylabel("critical N*")
    ax.set_title("Fig. 2c: critical N vs L")
    ax.legend()
    paths["fig2c"] = _save(plt, fig, out / "fig2c_critical_n.png")

    a4 = results["alg4_separability"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    _box(ax, [_heads(a4["ratio"], i) for i in range(len(ch["separability_ns"]))], ch["separability_ns"],
         "Fig. 3: geometric separability N_s/N (box over heads)", "N_s / N")
    for key, style in (("lower", "r--"), ("upper", "g--")):
        med = [np.nanmedian([np.nan if v is None else v for v in _heads(a4[key], i)])
               for i in range(len(ch["separability_ns"]))]
        ax.plot(range(1, len(med) + 1), med, style, label=f"median {key} bound")
    ax.axhspan(0.70, 0.85, color="grey", alpha=0.2, label="paper: 0.70-0.85")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("N")
    ax.legend()
    paths["fig3"] = _save(plt, fig, out / "fig3_separability.png")

    a5 = results["alg5_gradient"]
    temps = np.array(ch["temperatures"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for ei, eps in enumerate(ch["epsilons"]):
        ax.loglog(temps, [row[ei] for row in a5["g_max_over_heads"]], "o-", label=f"g, eps={eps:g} (max heads)")
    ax.loglog(temps, a5["spectral_max_over_heads"], "k-", label="spectral norm (max)")
    ax.loglog(temps, a5["bound_min_quarter_over_t_sqrt2"], "r--", label="min(1/(4T), sqrt 2)")
    ax.loglog(temps, a5["half_over_t"], "r:", label="1/(2T)")
    ax.set_xlabel("T")
    ax.set_ylabel("sensitivity")
    ax.set_title("Fig. 4: gradient sensitivity vs temperature")
    ax.legend(fontsize=8)
    paths["fig4"] = _save(plt, fig, out / "fig4_gradient_sensitivity.png")

    dl = results["lemma1_dilution"]["max_weight"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    per_len = [[heads[li] for layer in dl for heads in layer] for li in range(len(ch["lengths"]))]
    _box(ax, per_len, ch["lengths"], "Lemma 1: max attention weight at visible count L", "max weight")
    ax.plot(range(1, len(ch["lengths"]) + 1), 1 / ls, "k--", label="1/L")
    ax.set_yscale("log")
    ax.legend()
    paths["dilution"] = _save(plt, fig, out / "lemma1_dilution.png")
    return {k: str(v) for k, v in paths.items()}
