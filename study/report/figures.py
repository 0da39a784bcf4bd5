"""The report's figures. Each function draws one file and returns its caption, or None when nothing was logged.

The figures draw the runs the findings use: the main arm (`findings.main_arm`, the sweep's most common optimizer
and learning rate). Runs of other arms (an SGD learning-rate bracket) are never averaged in: they get their own
figure (`arms`). Every caption says which runs it draws (`drawn`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from study import tags
from study.atomic import save_figure
from study.report import sources
from study.report import summary as S
from study.report.findings import (
    ONE_OVER_T,
    fp64_unreliable,
    gradient_source,
    k_all,
    layer_slopes,
    main_arm,
    per_t,
    step0,
)
from study.report.stats import (
    CONFIDENCE,
    Family,
    TooFew,
    family_level,
    fmt,
    geometric_interval,
    mean_interval,
    percent,
)
from study.report.summary import Summary

STYLES = ["-", "--", ":", "-.", (0, (3, 1, 1, 1))]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(t: float, temps: list[float]):
    import matplotlib.cm as cm

    if len(temps) < 2:
        return cm.viridis(0.0)
    lo, hi = math.log(min(temps)), math.log(max(temps))
    return cm.viridis((math.log(t) - lo) / (hi - lo))


def _k_order(summaries: list[Summary]) -> list[str]:
    return sorted({s.k_label for s in summaries}, key=lambda k: math.inf if k == "all" else int(k))


def drawn(runs: list[Summary]) -> str:
    """Which runs a figure draws, for its caption: "main arm (adamw, lr 3e-05): 18 runs"."""
    if not runs:
        return "no runs"
    arms = sorted({(s.optimizer, s.learning_rate) for s in runs}, key=str)
    if len(arms) == 1:
        optimizer, lr = arms[0]
        return f"{optimizer}, lr {fmt(lr)}: {len(runs)} runs"
    return f"{len(runs)} runs of {len(arms)} optimizer/learning-rate arms"


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=90)
    finally:
        _plt().close(fig)


def _means(data: dict[float, list[float]], geometric: bool = False) -> tuple[list[float], list[float], list[list[float]]]:
    """(T, mean, [below, above]) per level: the mean over runs (geometric for positive quantities spanning decades)
    with its descriptive t-interval (`stats.mean_interval` / `stats.geometric_interval`, at CONFIDENCE) as error-bar
    lengths; a level with fewer runs than an interval needs gets its mean alone (bars of length 0)."""
    temps, means, bars = [], [], [[], []]
    with family_level(Family(1)):  # descriptive: CONFIDENCE alone
        for t, values in data.items():
            try:
                iv = geometric_interval(values) if geometric else mean_interval(values)
                mean, lo, hi = iv.estimate, iv.lo, iv.hi
            except TooFew:
                mean = float(np.exp(np.mean(np.log(values)))) if geometric else float(np.mean(values))
                lo = hi = mean
            temps.append(t)
            means.append(mean)
            bars[0].append(mean - lo)
            bars[1].append(hi - mean)
    return temps, means, bars


INTERVALS = f"bars: {percent(CONFIDENCE)} t-interval over runs (none with fewer than 3)"


def _legend_outside(ax, below: bool = False) -> None:
    """The legend to the right of the axes (or ``below`` them), where it covers no data point."""
    if below:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), borderaxespad=0.0)
    else:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def curves(summaries: list[Summary], out: Path) -> str | None:
    """Training loss and validation perplexity against step, one line per run; the legend names each (T, k) once
    (the seeds share its colour and line style)."""
    plt = _plt()
    temps, ks = sorted({s.temperature for s in summaries}), _k_order(summaries)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, tag in zip(axes, (tags.TRAIN_LOSS, tags.VAL_PPL)):
        named: set[tuple[float, str]] = set()
        for s in summaries:
            series = s.series(tag)
            if series:
                setting = (s.temperature, s.k_label)
                label = None if setting in named else f"T={s.temperature:g} k={s.k_label}"
                named.add(setting)
                ls = STYLES[ks.index(s.k_label) % len(STYLES)]
                # a marker on every point of a short series: one validation per run is one point, which a line
                # alone does not draw
                marker = "o" if len(series) <= 3 else None
                ax.plot(*zip(*series), color=_color(s.temperature, temps), ls=ls, lw=1, marker=marker, ms=4,
                        label=label)
        ax.set_xlabel("step")
        ax.set_title(tag)
    axes[1].set_yscale("log")
    if axes[1].get_legend_handles_labels()[0] or axes[0].get_legend_handles_labels()[0]:
        _legend_outside(axes[1] if axes[1].get_legend_handles_labels()[0] else axes[0])
    _save(fig, out / "curves.png")
    return (f"{tags.TRAIN_LOSS} and {tags.VAL_PPL} per run (colour: T, line style: k; one line per seed); "
            f"{drawn(summaries)}")


UNRELIABLE_LABEL = "hollow: off fp64 at step 0, left out by the findings"


def sensitivity(summaries: list[Summary], out: Path) -> str | None:
    """Per-run W_q/W_k gradient and Jacobian norms vs T (the values the gradient and Jacobian rows read), beside the
    saturated and above-bound rows (means with intervals). The float32 W_q/W_k norms at the levels the step-0 fp64
    check contradicts are drawn hollow and labelled: the findings leave them out; the float64 step-0 norms, where
    logged, are the ones the findings fit."""
    runs = k_all(summaries)
    bad = fp64_unreliable(runs, S.FP64_QK)
    qk = per_t(runs, lambda s: s.values.get(S.GRAD_QK))
    series = {
        "|grad W_q, W_k| float32 (median over steps)": {t: v for t, v in qk.items() if t not in bad},
        "|grad W_q, W_k| float64 at step 0 (the findings' fit)": per_t(runs, lambda s: s.values.get(S.STEP0_QK)),
        "attention Jacobian (mean)": per_t(runs, lambda s: s.values.get(S.JACOBIAN)),
    }
    left_out = {t: v for t, v in qk.items() if t in bad}
    if not any(series.values()) and not left_out:
        return None
    rows = {}
    for key, label in (
        (S.SATURATED, "saturated rows (max weight > 0.99)"),
        (S.NEAR_QUARTER, "rows with an entry >= 0.9 x 1/(4T)"),
        (S.ENTRY_RATIO, "largest entry x 4T (mean)"),
    ):
        if data := per_t(runs, lambda s, key=key: s.values.get(key)):
            rows[label] = data
    plt = _plt()
    fig, axes = plt.subplots(1, 2 if rows else 1, figsize=(13 if rows else 7, 7), squeeze=False)
    ax = axes[0][0]
    temps = sorted({s.temperature for s in runs})
    grid = np.geomspace(min(temps), max(temps), 50)
    for (label, data), marker in zip(series.items(), "oDs"):
        pts = [(t, v) for t, vs in data.items() for v in vs if v > 0]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, label=label, alpha=0.7)
    pts = [(t, v) for t, vs in left_out.items() for v in vs if v > 0]
    if pts:
        ax.scatter(*zip(*pts), marker="o", facecolors="none", edgecolors="tab:blue",
                   label=f"|grad W_q, W_k| float32 at T = {', '.join(fmt(t) for t in sorted(left_out))} ({UNRELIABLE_LABEL})")  # fmt: skip
    for ref, style, label in ((1 / (4 * grid), "k--", "1/(4T) (entrywise bound)"), (1 / (2 * grid), "k:", "1/(2T)")):
        ax.plot(grid, ref, style, lw=1, label=label)
    ax.set(xscale="log", yscale="log", xlabel="temperature T", ylabel="norm", title="sensitivity vs T (k = all)")
    _legend_outside(ax, below=True)
    if rows:
        ax2 = axes[0][1]
        for label, data in rows.items():
            x, y, bars = _means(data)
            ax2.errorbar(x, y, yerr=bars, fmt="o-", capsize=3, label=label)
        ax2.set(xscale="log", xlabel="temperature T", ylabel="fraction / ratio of sampled rows", ylim=(-0.02, 1.02))
        ax2.set_title(INTERVALS, fontsize=8)
        ax2.legend(fontsize=7)
    _save(fig, out / "sensitivity_vs_T.png")
    hollow = (f"; hollow: the float32 W_q/W_k norms at T = {', '.join(fmt(t) for t in sorted(left_out))}, numerically "
              "unreliable (off fp64 at step 0) and left out by the findings") if left_out else ""  # fmt: skip
    return ("gradient and Jacobian norms vs T (left, one point per run) beside the saturated rows and how close rows "
            f"come to the entrywise bound 1/(4T) (right: means with their intervals){hollow}; k = all, {drawn(runs)}")


def layer_sensitivity(summaries: list[Summary], out: Path) -> str | None:
    """Per-layer log-log slope against T of each parameter group's gradient norm, against the layer's depth; its
    title and caption name the T levels the slopes rest on (`findings.gradient_source`)."""
    slopes = layer_slopes(summaries)
    if not slopes:
        return None
    runs, _, note = gradient_source(k_all(main_arm(summaries)))
    levels = ", ".join(fmt(t) for t in sorted({s.temperature for s in runs}))
    source = "float64 step-0 norms" if step0(runs) else "float32 medians over the logged steps"
    rests = f"T = {levels} ({source})" + (f"; left out: {note.removeprefix('; left out, ')}" if note else "")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5))
    for (group, by_layer), marker in zip(slopes.items(), "os^vD"):
        ax.plot(list(by_layer), list(by_layer.values()), marker=marker, ls="-", lw=1, label=group)
    ax.axhspan(ONE_OVER_T.band[0], ONE_OVER_T.band[1], color="tab:green", alpha=0.15, label="1/T band (-1 +- 0.25)")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="layer (0 = first: its gradient crosses every low-T layer)", ylabel="log-log slope vs T")
    ax.set_title(f"per-layer gradient sensitivity to T (k = all, main arm)\nfitted on T = {levels} ({source})",
                 fontsize=10)  # fmt: skip
    _legend_outside(ax)
    _save(fig, out / "layer_sensitivity.png")
    return (f"per-layer slope of each gradient norm against T, by depth (green: the 1/T band), fitted on {rests}; "
            f"k = all, {drawn(k_all(summaries))}")


def dilution(summaries: list[Summary], out: Path) -> str | None:
    """Lemma 1 in training: validation max weight and H/log n vs the visible count n, one line per run (k = all)."""
    runs = [s for s in k_all(summaries) if s.run is not None]
    data = [(s, S.last_by_group(s.run, sources.BY_VISIBLE_MAX_WEIGHT), S.last_by_group(s.run, sources.BY_VISIBLE_ENTROPY)) for s in runs]
    data = [d for d in data if d[1]]
    if not data:
        return None
    plt = _plt()
    temps = sorted({s.temperature for s, _, _ in data})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for s, weight, entropy in data:
        color = _color(s.temperature, temps)
        ax.plot(list(weight), list(weight.values()), "o-", color=color, lw=1, label=f"T={s.temperature:g}")
        ax2.plot(list(entropy), list(entropy.values()), "o-", color=color, lw=1, label=f"T={s.temperature:g}")
    ns = np.array(sorted({n for _, d, _ in data for n in d}), dtype=float)
    ax.plot(ns, 1 / ns, "k--", lw=1, label="1/n (uniform)")
    ax.set(xscale="log", yscale="log", xlabel="visible keys n (bins of powers of 2)", ylabel="mean max weight")
    ax2.set(xscale="log", xlabel="visible keys n (bins of powers of 2)", ylabel="mean H / log n", ylim=(0, 1.02))
    for a in (ax, ax2):
        handles, labels = a.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        a.legend(unique.values(), unique.keys(), fontsize=7)
    _save(fig, out / "dilution_vs_n.png")
    return ("Lemma 1 in training: validation max weight and H / log n vs visible keys n, one line per run; k = all, "
            f"{drawn([s for s, _, _ in data])}")


def attention_vs_t(summaries: list[Summary], out: Path) -> str | None:
    """Final validation entropy and distance to uniform vs T, per k: the mean over runs with its interval. A k run at
    only some of the figure's T (a top-k arm at two levels) is drawn as points at those T, not a line across."""
    logged = [t for t in sources.ATTENTION_TAGS if any(s.final.get(t) is not None for s in summaries)]
    if not logged:
        return None
    plt = _plt()
    temps = sorted({s.temperature for s in summaries})
    fig, axes = plt.subplots(1, len(logged), figsize=(4.5 * len(logged) + 2, 4), squeeze=False)
    for ax, tag in zip(axes[0], logged):
        for k in _k_order(summaries):
            data = per_t([s for s in summaries if s.k_label == k], lambda s, tag=tag: s.final.get(tag))
            if not data:
                continue
            x, y, bars = _means(data)
            every_t = len(data) == len(temps)
            runs = sorted({len(v) for v in data.values()})
            label = f"k={k}" + ("" if every_t else f" (T = {', '.join(fmt(t) for t in data)} only)") + (
                f", {runs[0]} run per T: no interval" if runs == [1] else "")  # fmt: skip
            ax.errorbar(x, y, yerr=bars, fmt="o-" if every_t else "o", capsize=3, label=label)
        ax.set(xscale="log", xlabel="temperature T")
        ax.set_title(sources.ATTENTION_TAGS[tag], fontsize=9)
    _legend_outside(axes[0][-1])
    _save(fig, out / "attention_vs_T.png")
    return (f"final validation entropy and distance to uniform vs T (mean over seeds; {INTERVALS}; a k run at only "
            f"some T: points at those T); {drawn(summaries)}")


def _stability_panels(summaries: list[Summary]) -> tuple[list[tuple], list[str], bool]:
    """(the stability panels with an event in some run, the titles of those without any, whether clipping is off
    in every run). A panel of zero-height bars shows nothing, so it is left out and named instead; the clipped-steps
    panel exists only where some run clips."""
    panels = [
        (f"loss spikes above {S.SPIKE_FACTOR} x running median (sum)", lambda s: s.values.get(S.SPIKES), sum),
        ("diverged runs", lambda s: float(s.diverged), sum),
    ]
    clipping_off = all(s.clip is None for s in summaries)
    if not clipping_off:
        panels.append(("fraction of clipped steps (mean)", lambda s: s.values.get(S.CLIPPED), np.mean))
    quiet = [title for title, value, _ in panels if not any(value(s) for s in summaries)]
    return [p for p in panels if p[0] not in quiet], quiet, clipping_off


def stability(summaries: list[Summary], out: Path) -> str | None:
    """Loss spikes, divergences and (when any run clips) clipped steps per T, each T labelled with its number of
    runs (sums over groups of different sizes are not rates). With clipping off in every run the clipped-steps
    panel is left out (the caption says so) rather than drawn empty; with no event at all there is no figure
    (`not_drawn` says so in words)."""
    panels, quiet, clipping_off = _stability_panels(summaries)
    if not panels:  # nothing happened: no figure; the report says so in words (`not_drawn`)
        return None
    plt = _plt()
    runs = {t: len(v) for t, v in per_t(summaries, lambda s: 1.0).items()}  # per T, for the tick labels
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 4), squeeze=False)
    axes = axes[0]
    for ax, (title, value, reduce) in zip(axes, panels):
        data = {t: float(reduce(v)) for t, v in per_t(summaries, value).items()}
        if data:
            ax.bar(range(len(data)), list(data.values()))
            ax.set_xticks(range(len(data)), [f"{t:g}\n({runs.get(t, 0)} runs)" for t in data])
        ax.set_xlabel("temperature T")
        ax.set_title(title, fontsize=9)
    _save(fig, out / "stability_vs_T.png")
    clip_note = "; clipping off in every run (no clipped-steps panel)" if clipping_off else ""
    none = f"; none in any run: {', '.join(quiet)}" if quiet else ""
    return f"loss spikes and divergences vs T (all k){clip_note}{none}; {drawn(summaries)}"


def not_drawn(summaries: list[Summary], made: dict[str, str]) -> dict[str, str]:
    """{figure: why} for the figures `figures` left out because they would show nothing: the stability figure of
    main-arm runs without any spike, divergence or clipped step, said in words instead."""
    main = main_arm(summaries)
    if not main or "stability_vs_T.png" in made or _stability_panels(main)[0]:
        return {}
    return {"stability_vs_T.png": f"stability_vs_T.png is not drawn: no divergence, and no loss spike or clipped step "
            f"logged, in any of the {len(main)} runs it would draw ({drawn(main)}); the stability table lists every arm."}  # fmt: skip


def arms(summaries: list[Summary], out: Path) -> str | None:
    """The runs beside the main arm (an SGD learning-rate bracket), on their own: final val/ppl vs T, one marker per
    (optimizer, learning rate), a cross where the run diverged, with the main arm's geometric mean for reference."""
    main = main_arm(summaries)
    kept = {id(s) for s in main}
    others = [s for s in summaries if id(s) not in kept]
    if not others:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 5))
    finite = [p for s in summaries if not s.diverged and (p := s.final.get(tags.VAL_PPL)) and math.isfinite(p)]
    ceiling = max(finite) * 3 if finite else 10.0  # where a diverged run's cross is drawn
    main_ppl = per_t([s for s in main if not s.diverged], lambda s: s.final.get(tags.VAL_PPL))
    if main_ppl:
        x, y, bars = _means(main_ppl, geometric=True)
        ax.errorbar(x, y, yerr=bars, fmt="k-", lw=1.5, capsize=3,
                    label="main arm: geometric mean [interval]")  # fmt: skip
    cells = sorted({(s.optimizer, s.learning_rate or 0.0) for s in others})
    # runs drawn at one spot (diverged runs all sit at the ceiling; a cell's seeds at one T) are spread sideways
    # by a small factor on the log axis, so none hides another
    temps = sorted({s.temperature for s in others})
    span = math.log10(max(temps) / min(temps)) if len(temps) > 1 else 1.0
    seen: dict[tuple[float, float | None], int] = {}

    def dodge(t: float, y: float | None) -> float:
        i = seen[(t, y)] = seen.get((t, y), -1) + 1
        return t * 10 ** (0.025 * span * ((i + 1) // 2) * (1 if i % 2 else -1))

    for (optimizer, lr), marker in zip(cells, "osD^v<>p*h"):
        cell = [s for s in others if (s.optimizer, s.learning_rate or 0.0) == (optimizer, lr)]
        ok = [(dodge(s.temperature, p), p) for s in cell if not s.diverged and (p := s.final.get(tags.VAL_PPL))]
        bad = [dodge(s.temperature, None) for s in cell if s.diverged]
        label = f"{optimizer} lr {fmt(lr)}"
        line = ax.plot(*zip(*ok), marker=marker, ls="", ms=7, label=label)[0] if ok else None
        if bad:
            color = line.get_color() if line is not None else None
            ax.plot(bad, [ceiling] * len(bad), marker="x", ls="", ms=9, mew=2, color=color,
                    label=f"{label}: diverged" if ok else f"{label} (diverged)")
    ax.set(xscale="log", yscale="log", xlabel="temperature T", ylabel="final val/ppl",
           title="arms beside the main grid (x: diverged, drawn at the top, side by side)")  # fmt: skip
    _legend_outside(ax)
    _save(fig, out / "arms.png")
    return (f"the other arms on their own: final val/ppl vs T per optimizer and learning rate (x: diverged; runs at "
            f"one spot side by side), {len(others)} runs, beside the main arm's geometric mean ({drawn(main)}; "
            f"{INTERVALS})")


def _one_format(values: np.ndarray) -> str:
    """One number format for every cell: as many decimals as the smallest value needs for 3 significant digits,
    thousands separated (595 and 2,230, not 595 and 2.23e+03)."""
    smallest = float(np.min(values)) if values.size else 1.0
    decimals = max(0, 2 - math.floor(math.log10(smallest))) if smallest > 0 else 2
    return f"{{:,.{min(decimals, 4)}f}}"


def ppl_heatmap(summaries: list[Summary], out: Path) -> str | None:
    """Mean final val/ppl over seeds per (T, k); 'div' where every seed diverged, 'not run' where the sweep has no
    run (an arm at fewer T than the grid)."""
    temps, ks = sorted({s.temperature for s in summaries}), _k_order(summaries)
    grid = np.full((len(temps), len(ks)), np.nan)
    text = [["" for _ in ks] for _ in temps]
    for i, t in enumerate(temps):
        for j, k in enumerate(ks):
            cell = [s for s in summaries if s.temperature == t and s.k_label == k]
            ppl = [p for s in cell if not s.diverged and (p := s.final.get(tags.VAL_PPL))]
            if ppl:
                grid[i, j] = float(np.exp(np.mean(np.log(ppl))))
            elif cell and all(s.diverged for s in cell):
                text[i][j] = "div"
            elif not cell:
                text[i][j] = "not run"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.3 * len(ks) + 3, 0.6 * len(temps) + 2))
    cmap = plt.get_cmap("magma_r")
    im = ax.imshow(np.log10(grid), cmap=cmap, aspect="auto")
    fmt = _one_format(grid[np.isfinite(grid)])
    for i in range(len(temps)):
        for j in range(len(ks)):
            if np.isfinite(grid[i, j]):
                text[i][j] = fmt.format(grid[i, j])
                r, g, b, _ = cmap(im.norm(np.log10(grid[i, j])))
                color = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"  # readable on its cell
            else:
                color = "black"
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=10, color=color)
    ax.set_xticks(range(len(ks)), ks)
    ax.set_yticks(range(len(temps)), [f"{t:g}" for t in temps])
    ax.set(xlabel="top-k", ylabel="temperature T", title="final val/ppl, geometric mean over seeds (colour: log10)")
    fig.colorbar(im, ax=ax)
    _save(fig, out / "ppl_heatmap.png")
    return f"final validation perplexity, T x k (geometric mean over seeds; div = every seed diverged); {drawn(summaries)}"


def normalizers(summaries: list[Summary], out: Path) -> str | None:
    """Final val/ppl, H/log n and gradient norm vs T, one line per normaliser (median over k and seeds; main arm)."""
    summaries = main_arm(summaries)
    plt = _plt()
    names = sorted({s.normalizer for s in summaries})
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (
        ("final val/ppl", lambda s: None if s.diverged else s.final.get(tags.VAL_PPL)),
        ("final H / log n (validation)", lambda s: s.final.get(sources.NORMALIZED_ENTROPY)),
        ("median pre-clip grad norm", lambda s: s.values.get(S.GRAD_NORM)),
    )
    for ax, (label, value) in zip(axes, panels):
        for name in names:
            data = per_t([s for s in summaries if s.normalizer == name], value)
            if data:
                ax.plot(list(data), [float(np.median(v)) for v in data.values()], "o-", label=name)
        ax.set(xscale="log", xlabel="temperature T")
        ax.set_title(label, fontsize=9)
    axes[0].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    _save(fig, out / "normalizers.png")
    return f"final val/ppl, H/log n and gradient norm vs T per normaliser (median over k and seeds); {drawn(summaries)}"


def figures(summaries: list[Summary], out: Path) -> dict[str, str]:
    """Every figure of the softmax runs; {file: caption} for those drawn. Each draws the main arm only; the other
    arms get `arms.png`. A figure that would show nothing is not drawn (`not_drawn` says why)."""
    main = main_arm(summaries)
    made = {}
    for name, draw in (
        ("curves.png", curves),
        ("sensitivity_vs_T.png", sensitivity),
        ("layer_sensitivity.png", layer_sensitivity),
        ("dilution_vs_n.png", dilution),
        ("attention_vs_T.png", attention_vs_t),
        ("stability_vs_T.png", stability),
        ("ppl_heatmap.png", ppl_heatmap),
    ):
        caption = draw(main, out)
        if caption:
            made[name] = caption
    caption = arms(summaries, out)
    if caption:
        made["arms.png"] = caption
    return made
