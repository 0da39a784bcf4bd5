"""Per-run summaries, findings against the paper's claims, figures and report.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.report import tags
from study.report.read import RunData, load_sweep

NOT_LOGGED = "not logged"
LOW_T, HIGH_T = 0.03, 0.3  # "low" and "high" temperature groups of the stability findings
SPIKE_WINDOW, SPIKE_FACTOR = 10, 1.2
ZERO = 1e-12  # medians below this are zeros up to rounding (e.g. the Jacobian of one-hot rows)


def fmt(value: float | None) -> str:
    if value is None:
        return NOT_LOGGED
    return f"{value:.6g}"


# ---- per-run summary ------------------------------------------------------------------------------------------
@dataclass
class Summary:
    run: RunData
    temperature: float
    top_k: int | None
    final: dict[str, float | None]  # last logged value per tag
    grad_norm: float | None  # median pre-clip total gradient norm over logged steps
    grad_norm_tag: str | None
    jacobian: float | None  # median of tags.JACOBIAN
    clipped_fraction: float | None
    spikes: int | None
    skipped: int

    @property
    def diverged(self) -> bool:
        return self.run.state == "diverged"

    @property
    def k_label(self) -> str:
        return "all" if self.top_k is None else str(self.top_k)


def _last(series: list[tuple[int, float]] | None) -> float | None:
    return series[-1][1] if series else None


def _median(series: list[tuple[int, float]] | None) -> float | None:
    if not series:
        return None
    values = [v for _, v in series if math.isfinite(v)]
    return float(np.median(values)) if values else None


def count_spikes(series: list[tuple[int, float]] | None) -> int | None:
    """Logged training losses above SPIKE_FACTOR x the median of the SPIKE_WINDOW previous logged values."""
    if not series:
        return None
    values = [v for _, v in series]
    spikes = 0
    for i in range(SPIKE_WINDOW, len(values)):
        reference = float(np.median(values[i - SPIKE_WINDOW : i]))
        if not math.isfinite(values[i]) or values[i] > SPIKE_FACTOR * reference:
            spikes += 1
    return spikes


def summarize(run: RunData) -> Summary:
    final = {
        t: _last(run.series(t))
        for t in (tags.TRAIN_LOSS, tags.VAL_LOSS, tags.VAL_PPL, *tags.ATTENTION_TAGS, tags.NONZERO)
    }
    grad_tag = next((t for t in tags.GRAD_NORM_SOURCES if run.series(t)), None)
    grad = run.series(grad_tag) if grad_tag else None
    clipped = None
    if grad and run.series(tags.GRAD_NORM_CLIPPED):
        after = dict(run.series(tags.GRAD_NORM_CLIPPED))
        pairs = [(v, after[s]) for s, v in grad if s in after]
        clipped = sum(a < v * (1 - 1e-6) for v, a in pairs) / len(pairs) if pairs else None
    elif grad:
        clip = run.setting("trainer.gradient_clip_val")
        clipped = (sum(v > float(clip) for _, v in grad) / len(grad)) if clip else 0.0
    skipped = int(run.status.get("skipped_steps") or (_last(run.series(tags.GUARD_SKIPPED)) or 0))
    return Summary(
        run=run,
        temperature=float(run.params.get("temperature", 1.0)),
        top_k=run.params.get("top_k"),
        final=final,
        grad_norm=_median(grad),
        grad_norm_tag=grad_tag,
        jacobian=_median(run.series(tags.JACOBIAN)),
        clipped_fraction=clipped,
        spikes=count_spikes(run.series(tags.TRAIN_LOSS)),
        skipped=skipped,
    )


# ---- statistics -----------------------------------------------------------------------------------------------
def loglog_slope(xs: list[float], ys: list[float]) -> float | None:
    pts = [
        (math.log(x), math.log(y))
        for x, y in zip(xs, ys)
        if x > 0 and y is not None and y > 0 and math.isfinite(y)
    ]
    if len({p[0] for p in pts}) < 2:
        return None
    a = np.array(pts)
    return float(np.polyfit(a[:, 0], a[:, 1], 1)[0])


def spearman(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic)


def _k_value(s: Summary) -> float:
    return math.inf if s.top_k is None else float(s.top_k)


def _by_T(summaries: list[Summary], value) -> dict[float, list[float]]:
    out: dict[float, list[float]] = {}
    for s in summaries:
        v = value(s)
        if v is not None:
            out.setdefault(s.temperature, []).append(v)
    return dict(sorted(out.items()))


# ---- findings -------------------------------------------------------------------------------------------------
@dataclass
class Finding:
    claim: str
    measurement: str
    value: str
    verdict: str
    rule: str


def verdict(supported: bool, not_supported: bool) -> str:
    return "supported" if supported else ("not supported" if not_supported else "inconclusive")


def slope_finding(
    claim: str, tag: str, t_range: str, per_t: dict[float, list[float]], quantity: str, logged: bool
) -> Finding:
    """A "grows like 1/T" claim: log-log slope of the per-T geometric mean of ``per_t`` (needs >= 3 values of T)."""
    rule = (
        f"log-log slope of the per-T geometric-mean {quantity} (>= 3 values of T): "
        "supported if <= -0.5, not supported if > -0.2, else inconclusive"
    )
    if len(per_t) < 3:
        value = f"only {len(per_t)} value(s) of T{t_range}" if logged else NOT_LOGGED
        return Finding(claim, f"`{tag}`", value, "inconclusive", rule)
    slope = loglog_slope(list(per_t), [float(np.exp(np.mean(np.log(v)))) for v in per_t.values()])
    judged = "inconclusive" if slope is None else verdict(slope <= -0.5, slope > -0.2)
    where = f" (T{t_range})" if t_range else ""
    return Finding(claim, f"slope of median `{tag}` vs T{where}", fmt(slope), judged, rule)


def findings(summaries: list[Summary]) -> list[Finding]:
    out = []

    # Claim 5 (Corollary 3): the attention Jacobian bound
    jac = [(s.temperature, s.jacobian) for s in summaries if s.jacobian is not None]
    rule = "supported if every run's median Jacobian norm <= 1/(2T) (exact spectral maximum); not supported if any exceeds 1.05/(2T)"
    if jac:
        ratio = max(j * 2 * t for t, j in jac)
        judged = verdict(ratio <= 1.0, ratio > 1.05)
        out.append(
            Finding(
                "5. |d alpha/d l| <= min(1/(4T), sqrt 2) (can reach 1/(2T))",
                f"max over runs of median `{tags.JACOBIAN}` x 2T",
                fmt(ratio),
                judged,
                rule,
            )
        )
    else:
        out.append(
            Finding(
                "5. |d alpha/d l| <= min(1/(4T), sqrt 2) (can reach 1/(2T))",
                f"`{tags.JACOBIAN}`",
                NOT_LOGGED,
                "inconclusive",
                rule,
            )
        )

    # Claim 5: the attention Jacobian itself follows 1/T (top-1 runs have one-hot rows: their Jacobian is 0)
    per_t = _by_T(summaries, lambda s: s.jacobian if s.jacobian is not None and s.jacobian > ZERO else None)
    out.append(
        slope_finding(
            "5. attention sensitivity |d alpha/d l| grows like 1/T",
            tags.JACOBIAN,
            "",
            per_t,
            "attention Jacobian norm over all T (runs whose median is 0, i.e. one-hot top-1 rows, left out)",
            logged=bool(jac),
        )
    )

    # Claim 5: sensitivity follows 1/T at low T (total pre-clip gradient norm in training)
    low = [s for s in summaries if s.temperature <= 0.1 + 1e-12 and s.grad_norm is not None]
    tag_used = next((s.grad_norm_tag for s in low if s.grad_norm_tag), tags.GRAD_NORM)
    out.append(
        slope_finding(
            "5. gradient sensitivity grows like 1/T at low T",
            tag_used,
            " <= 0.1",
            _by_T(low, lambda s: s.grad_norm),
            "gradient norm over T <= 0.1",
            logged=bool(low),
        )
    )

    # Claim 6: more selected tokens -> closer to uniform
    for tag, claim, sign in (
        (tags.ENTROPY, "6. more selected tokens -> attention entropy rises", 1),
        (tags.KL_UNIFORM, "6. more selected tokens -> distance to uniform (KL) falls", -1),
    ):
        rule = f"median over T of Spearman rho(k, final `{tag}`) (k = all ranked last): supported if {'>= 0.8' if sign > 0 else '<= -0.8'}, not supported if {'<= 0' if sign > 0 else '>= 0'}, else inconclusive"
        rhos = []
        for t in sorted({s.temperature for s in summaries}):
            group = [s for s in summaries if s.temperature == t and s.final.get(tag) is not None]
            rho = spearman([_k_value(s) for s in group], [s.final[tag] for s in group])
            if rho is not None and math.isfinite(rho):
                rhos.append(rho)
        if rhos:
            rho = float(np.median(rhos))
            judged = verdict(sign * rho >= 0.8, sign * rho <= 0)
            out.append(
                Finding(claim, f"median Spearman rho over {len(rhos)} temperatures", fmt(rho), judged, rule)
            )
        elif any(s.final.get(tag) is not None for s in summaries):
            out.append(Finding(claim, f"`{tag}`", "fewer than 3 values of k at every T", "inconclusive", rule))
        else:
            out.append(Finding(claim, f"`{tag}`", NOT_LOGGED, "inconclusive", rule))

    # Claim 6: low temperature makes training unstable
    def group(pred):
        return [s for s in summaries if pred(s.temperature)]

    lo, hi = group(lambda t: t <= LOW_T + 1e-12), group(lambda t: t >= HIGH_T - 1e-12)
    rule = f"unstable = diverged, or >= 1 loss spike, or >= 1 skipped step; supported if the unstable fraction at T <= {LOW_T} exceeds that at T >= {HIGH_T} by >= 0.25, not supported if it is not larger, else inconclusive"

    def unstable(s: Summary) -> bool:
        return s.diverged or (s.spikes or 0) > 0 or s.skipped > 0

    if lo and hi:
        f_lo, f_hi = sum(map(unstable, lo)) / len(lo), sum(map(unstable, hi)) / len(hi)
        judged = verdict(f_lo - f_hi >= 0.25, f_lo <= f_hi)
        out.append(
            Finding(
                "6. low temperature makes training unstable",
                f"unstable fraction, T <= {LOW_T} vs T >= {HIGH_T}",
                f"{fmt(f_lo)} vs {fmt(f_hi)}",
                judged,
                rule,
            )
        )
    else:
        out.append(
            Finding(
                "6. low temperature makes training unstable",
                "unstable fraction",
                "no runs in one of the groups",
                "inconclusive",
                rule,
            )
        )

    rule = f"mean fraction of clipped steps at T <= {LOW_T} minus at T >= {HIGH_T}: supported if >= 0.25, not supported if <= 0, else inconclusive"
    c_lo = [s.clipped_fraction for s in lo if s.clipped_fraction is not None]
    c_hi = [s.clipped_fraction for s in hi if s.clipped_fraction is not None]
    if c_lo and c_hi:
        diff = float(np.mean(c_lo) - np.mean(c_hi))
        judged = verdict(diff >= 0.25, diff <= 0)
        out.append(
            Finding(
                "6. low temperature makes training unstable (clipping)",
                "clipped-step fraction difference",
                fmt(diff),
                judged,
                rule,
            )
        )
    else:
        out.append(
            Finding(
                "6. low temperature makes training unstable (clipping)",
                f"`{tags.GRAD_NORM}`",
                NOT_LOGGED if not (c_lo or c_hi) else "no runs in one of the groups",
                "inconclusive",
                rule,
            )
        )

    rule = "median final val/ppl at the lowest T / at the T closest to 1: supported if > 1.1, not supported if < 1.0, else inconclusive (diverged runs count as infinite)"
    temps = sorted({s.temperature for s in summaries})
    if len(temps) >= 2:
        t_ref = min(temps, key=lambda t: abs(math.log(t)))
        t_min = temps[0]

        def ppl(s: Summary) -> float | None:
            return math.inf if s.diverged else s.final.get(tags.VAL_PPL)

        a = [p for s in summaries if s.temperature == t_min and (p := ppl(s)) is not None]
        b = [p for s in summaries if s.temperature == t_ref and (p := ppl(s)) is not None]
        if a and b and t_min != t_ref:
            ratio = float(np.median(a) / np.median(b))
            judged = verdict(ratio > 1.1, ratio < 1.0)
            out.append(
                Finding(
                    "6. (derived) low T hurts the fine-tuned model",
                    f"median val/ppl T={t_min:g} / T={t_ref:g}",
                    fmt(ratio),
                    judged,
                    rule,
                )
            )
        else:
            out.append(
                Finding(
                    "6. (derived) low T hurts the fine-tuned model",
                    f"`{tags.VAL_PPL}`",
                    NOT_LOGGED,
                    "inconclusive",
                    rule,
                )
            )
    return out


# ---- figures --------------------------------------------------------------------------------------------------
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


STYLES = ["-", "--", ":", "-.", (0, (3, 1, 1, 1))]


def figures(summaries: list[Summary], out: Path) -> dict[str, str]:
    """Write the figures; returns {figure file: what it shows} for those written (missing tags: no figure)."""
    plt = _plt()
    made: dict[str, str] = {}
    temps = sorted({s.temperature for s in summaries})
    ks = sorted({s.k_label for s in summaries}, key=lambda k: math.inf if k == "all" else int(k))

    def style(s: Summary):
        return STYLES[ks.index(s.k_label) % len(STYLES)]

    # loss and perplexity curves
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, tag in zip(axes, (tags.TRAIN_LOSS, tags.VAL_PPL)):
        for s in summaries:
            series = s.run.series(tag)
            if series:
                ax.plot(
                    *zip(*series),
                    color=_color(s.temperature, temps),
                    ls=style(s),
                    lw=1,
                    label=f"T={s.temperature:g} k={s.k_label}",
                )
        ax.set_xlabel("step")
        ax.set_ylabel(tag)
        ax.set_title(tag)
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=6, ncol=2, loc="upper right")
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=90)
    plt.close(fig)
    made["curves.png"] = "train/loss and val/ppl per setting (colour: T, line style: k)"

    # gradient norm vs T
    with_grad = [s for s in summaries if s.grad_norm is not None or s.jacobian is not None]
    if with_grad:
        fig, ax = plt.subplots(figsize=(7, 5))
        t_grid = np.geomspace(min(temps), max(temps), 50)
        for key, label, marker in (
            ("grad_norm", "total grad norm (pre-clip, median)", "o"),
            ("jacobian", "attention Jacobian (median)", "s"),
        ):
            # Exact zeros (the Jacobian of top-1's one-hot rows) have no place on a log scale.
            pts = [(s.temperature, v) for s in with_grad if (v := getattr(s, key)) is not None and v > ZERO]
            if not pts:
                continue
            ax.scatter(*zip(*pts), marker=marker, label=label, alpha=0.7)
            slope = loglog_slope(*map(list, zip(*pts)))
            if slope is not None:
                xs, ys = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
                b = float(np.mean(ys) - slope * np.mean(xs))
                ax.plot(t_grid, np.exp(b) * t_grid**slope, lw=1, label=f"fit: slope {slope:.2f}")
        ax.plot(t_grid, 1 / (4 * t_grid), "k--", lw=1, label="1/(4T)")
        ax.plot(t_grid, 1 / (2 * t_grid), "k:", lw=1, label="1/(2T)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("temperature T")
        ax.set_ylabel("norm")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "grad_norm_vs_T.png", dpi=90)
        plt.close(fig)
        made["grad_norm_vs_T.png"] = (
            "gradient norm vs T (log-log) with fitted slope and the 1/(4T), 1/(2T) references "
            "(runs with a zero Jacobian, i.e. top-1, not drawn)"
        )

    # attention statistics vs k and vs T
    logged = [t for t in tags.ATTENTION_TAGS if any(s.final.get(t) is not None for s in summaries)]
    if logged:
        for axis in ("k", "T"):
            fig, axes = plt.subplots(1, len(logged), figsize=(4.5 * len(logged), 4), squeeze=False)
            for ax, tag in zip(axes[0], logged):
                groups = temps if axis == "k" else ks
                for g in groups:
                    members = [
                        s
                        for s in summaries
                        if (s.temperature if axis == "k" else s.k_label) == g and s.final.get(tag) is not None
                    ]
                    if axis == "k":
                        members.sort(key=_k_value)
                        xs = [ks.index(s.k_label) for s in members]
                    else:
                        members.sort(key=lambda s: s.temperature)
                        xs = [s.temperature for s in members]
                    if members:
                        ax.plot(
                            xs,
                            [s.final[tag] for s in members],
                            "o-",
                            label=f"{'T' if axis == 'k' else 'k'}={g if axis == 'T' else format(g, 'g')}",
                        )
                if axis == "k":
                    ax.set_xticks(range(len(ks)), ks)
                else:
                    ax.set_xscale("log")
                ax.set_xlabel("top-k" if axis == "k" else "temperature T")
                ax.set_title(tags.ATTENTION_TAGS[tag], fontsize=9)
            axes[0][0].legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(out / f"attention_vs_{axis}.png", dpi=90)
            plt.close(fig)
            made[f"attention_vs_{axis}.png"] = f"final entropy / distance to uniform vs {axis}"

    # stability vs T
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    clipped = _by_T(summaries, lambda s: s.clipped_fraction)
    for ax, (title, data) in zip(
        axes,
        (
            ("fraction of clipped steps (mean over k)", {t: float(np.mean(v)) for t, v in clipped.items()}),
            (
                "loss spikes (sum over k)",
                {t: float(sum(v)) for t, v in _by_T(summaries, lambda s: s.spikes).items()},
            ),
            (
                "diverged runs",
                {t: float(sum(v)) for t, v in _by_T(summaries, lambda s: float(s.diverged)).items()},
            ),
        ),
    ):
        if data:
            ax.bar(range(len(data)), list(data.values()))
            ax.set_xticks(range(len(data)), [f"{t:g}" for t in data])
        else:
            ax.text(0.5, 0.5, NOT_LOGGED, ha="center", transform=ax.transAxes)
        ax.set_xlabel("temperature T")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "stability_vs_T.png", dpi=90)
    plt.close(fig)
    made["stability_vs_T.png"] = "fraction of clipped steps, loss spikes and divergences vs T"

    # final perplexity heatmap
    grid = np.full((len(temps), len(ks)), np.nan)
    text = [["" for _ in ks] for _ in temps]
    for s in summaries:
        i, j = temps.index(s.temperature), ks.index(s.k_label)
        ppl = s.final.get(tags.VAL_PPL)
        if s.diverged:
            text[i][j] = "div"
        if ppl is not None and not s.diverged:
            grid[i, j] = ppl
            text[i][j] = f"{ppl:.3g}"
    fig, ax = plt.subplots(figsize=(1.3 * len(ks) + 3, 0.6 * len(temps) + 2))
    im = ax.imshow(np.log10(grid), cmap="magma_r", aspect="auto")
    for i in range(len(temps)):
        for j in range(len(ks)):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8, color="tab:blue")
    ax.set_xticks(range(len(ks)), ks)
    ax.set_yticks(range(len(temps)), [f"{t:g}" for t in temps])
    ax.set_xlabel("top-k")
    ax.set_ylabel("temperature T")
    ax.set_title("final val/ppl (colour: log10)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(out / "ppl_heatmap.png", dpi=90)
    plt.close(fig)
    made["ppl_heatmap.png"] = "final validation perplexity, T x k (div = diverged)"
    return made


# ---- normalisers ----------------------------------------------------------------------------------------------
def normalizer_of(s: Summary) -> str:
    return str(s.run.params.get("normalizer") or s.run.setting("model.attention.normalizer", "softmax"))


NORMALIZER_COLUMNS = [
    "normalizer",
    "runs",
    "diverged",
    "median val/ppl",
    "median H/log n",
    "median non-zero keys",
    "median grad norm",
]


def normalizer_rows(summaries: list[Summary]) -> list[list[str]]:
    """One row per normaliser: medians over its runs (all T and k) of the final values."""

    def med(values: list[float | None]) -> float | None:
        values = [v for v in values if v is not None and math.isfinite(v)]
        return float(np.median(values)) if values else None

    rows = []
    for name in sorted({normalizer_of(s) for s in summaries}):
        group = [s for s in summaries if normalizer_of(s) == name]
        rows.append(
            [
                name,
                str(len(group)),
                str(sum(s.diverged for s in group)),
                fmt(med([s.final.get(tags.VAL_PPL) for s in group if not s.diverged])),
                fmt(med([s.final.get(tags.NORMALIZED_ENTROPY) for s in group])),
                fmt(med([s.final.get(tags.NONZERO) for s in group])),
                fmt(med([s.grad_norm for s in group])),
            ]
        )
    return rows


def normalizer_figure(summaries: list[Summary], out: Path) -> str:
    """Final val/ppl and gradient norm vs T, one line per normaliser (median over k)."""
    plt = _plt()
    names = sorted({normalizer_of(s) for s in summaries})
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (label, value) in zip(
        axes,
        (
            ("final val/ppl", lambda s: None if s.diverged else s.final.get(tags.VAL_PPL)),
            ("final H / log n (validation)", lambda s: s.final.get(tags.NORMALIZED_ENTROPY)),
            ("median pre-clip grad norm", lambda s: s.grad_norm),
        ),
    ):
        for name in names:
            per_t = _by_T([s for s in summaries if normalizer_of(s) == name], value)
            if per_t:
                ax.plot(list(per_t), [float(np.median(v)) for v in per_t.values()], "o-", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("temperature T")
        ax.set_title(label, fontsize=9)
    axes[0].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "normalizers.png", dpi=90)
    plt.close(fig)
    return "normalizers.png"


# ---- report.md ------------------------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


RUN_COLUMNS = [
    "run",
    "T",
    "k",
    "normalizer",
    "seed",
    "state",
    "steps",
    "train/loss",
    "val/loss",
    "val/ppl",
    "H/log n",
    "KL uniform",
    "grad norm (median)",
    "clipped frac",
    "spikes",
    "skipped",
    "reason",
]


def run_rows(summaries: list[Summary]) -> list[list[str]]:
    rows = []
    for s in summaries:
        p = s.run.params
        rows.append(
            [
                s.run.name,
                f"{s.temperature:g}",
                s.k_label,
                str(p.get("normalizer", "")),
                str(p.get("seed", "")),
                s.run.state,
                str(s.run.status.get("global_step", "")),
                fmt(s.final.get(tags.TRAIN_LOSS)),
                fmt(s.final.get(tags.VAL_LOSS)),
                fmt(s.final.get(tags.VAL_PPL)),
                fmt(s.final.get(tags.NORMALIZED_ENTROPY)),
                fmt(s.final.get(tags.KL_UNIFORM)),
                fmt(s.grad_norm),
                fmt(s.clipped_fraction),
                "" if s.spikes is None else str(s.spikes),
                str(s.skipped),
                (s.run.status.get("reason") or "") if s.run.state != "finished" else "",
            ]
        )
    return rows


def build_report(sweep_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    plan, runs = load_sweep(sweep_dir)
    summaries = [summarize(r) for r in runs]
    normalizers = sorted({normalizer_of(s) for s in summaries})
    # The paper's claims are about softmax: with several normalisers the findings and the T x k figures use the
    # softmax runs, and the others are compared in their own section.
    primary = [s for s in summaries if normalizer_of(s) == "softmax"] or summaries
    found = findings(primary)
    made = figures(primary, out) if primary else {}
    if len(normalizers) > 1:
        made[normalizer_figure(summaries, out)] = "final val/ppl, H/log n and gradient norm vs T per normaliser"
    states: dict[str, int] = {}
    for r in runs:
        states[r.state] = states.get(r.state, 0) + 1
    all_tags = {t for r in runs for t in r.scalars}
    wanted = [
        tags.TRAIN_LOSS,
        tags.VAL_LOSS,
        tags.VAL_PPL,
        *tags.ATTENTION_TAGS,
        tags.GRAD_NORM,
        tags.GRAD_NORM_CLIPPED,
        tags.JACOBIAN,
    ]
    missing = [t for t in wanted if t not in all_tags]
    parts = [
        f"# Sweep report: {plan.get('sweep', sweep_dir.name)}",
        "",
        f"{len(runs)} runs: "
        + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        + f". Source: `{sweep_dir}` (plan.json, status.json, TensorBoard events).",
        "",
        "## Findings",
        "",
        _table(
            ["claim (paper.md)", "measurement", "value", "verdict", "rule"],
            [[f.claim, f.measurement, f.value, f.verdict, f.rule] for f in found],
        ),
        "",
        "Claims 1-4 (dilution, distance, critical N, separability) are properties of a frozen model's attention and are "
        "measured by the analysis tools, not by this training sweep.",
        "",
        f"Definitions: a loss spike is a logged `{tags.TRAIN_LOSS}` above {SPIKE_FACTOR} x the median of the {SPIKE_WINDOW} previous "
        "logged values; a clipped step is one whose pre-clip total gradient norm exceeds `trainer.gradient_clip_val` (or whose "
        f"`{tags.GRAD_NORM_CLIPPED}` is below `{tags.GRAD_NORM}`); gradient norms are medians over logged steps; final values "
        "are the last logged point.",
        "",
        *(
            [
                "## Normalisers",
                "",
                f"Findings and the T x k figures above use the softmax runs ({len(primary)}); every normaliser's runs, "
                "medians over all its T and k:",
                "",
                _table(NORMALIZER_COLUMNS, normalizer_rows(summaries)),
                "",
            ]
            if len(normalizers) > 1
            else []
        ),
        "## Runs",
        "",
        _table(RUN_COLUMNS, run_rows(summaries)),
        "",
        "## Figures",
        "",
    ]
    for name, what in made.items():
        parts += [f"### {what}", "", f"![{what}]({name})", ""]
    if missing:
        parts += [
            "## Not logged",
            "",
            "These tags were not found in any run (no figure or finding uses made-up values): "
            + ", ".join(f"`{t}`" for t in missing),
            "",
        ]
    path = out / "report.md"
    path.write_text("\n".join(parts))
    return path
