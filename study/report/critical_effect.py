"""Theorem 1 as an effect size: the KS distance and d/E against N/L, and N* against the number of heads pooled.

N* (Algorithm 3) is the first N at which a KS test can no longer tell the per-head distances d from their
expectations E, so it is a property of the test's design as much as of the model: pooling more heads gives the test
more power and moves N* up. The effect sizes here do not depend on that count: per text window, the KS statistic
(the largest gap between the two distributions over heads) and d/E (the mean over heads of d over that of E; 1 when
d and E agree), each at every N/L with a t-interval over the windows. They describe; they are not findings (no
rule, outside the Bonferroni family). Read from `study analyze`'s results.json (`alg3_effect_size`,
`alg3_n_star_by_heads`, `alg3_effect_size_by_heads`).

The N* findings are labelled design-dependent for that reason (`design_note` writes what goes beside them): d/E
against N/L from 9, 27 and 54 of the pooled heads (`study.frozen.analysis.critical.head_sample`), each with N* of
the same heads, so a reader sees N* move with the count while the effect size stays.
"""

from __future__ import annotations

import math
from pathlib import Path

from study.atomic import save_figure
from study.report.stats import CONFIDENCE, Interval, TooFew, fmt, mean_interval, percent
from study.report.table import table

WHAT = "text windows"


def _interval(values: list[float | None], log: bool = False) -> Interval | None:
    """Mean over windows (geometric with ``log``) with its t-interval, or None with fewer than 3 windows."""
    kept = [v for v in values if v is not None and (v > 0 if log else True)]
    try:
        iv = mean_interval([math.log(v) for v in kept] if log else kept, WHAT)
    except TooFew:
        return None
    if not log:
        return iv
    return Interval(math.exp(iv.estimate), math.exp(iv.lo), math.exp(iv.hi), iv.n, iv.level, unit=iv.unit)


def _plain(iv: Interval | None) -> dict | None:
    return None if iv is None else {"estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n, "level": iv.level}


def effect_sizes(results: dict | None) -> list[dict]:
    """Per L: at each N <= L, N/L, the KS statistic and d/E over windows (each an Interval or None)."""
    block = (results or {}).get("alg3_effect_size")
    if not block:
        return []
    out = []
    for entry in block["by_length"]:
        windows_ks, windows_ratio = entry["ks"], entry["d_over_e"]
        points = []
        for j, n in enumerate(entry["ns"]):
            points.append({"n": n, "n_over_length": entry["n_over_length"][j],
                           "ks": _interval([w[j] for w in windows_ks]),
                           "d_over_e": _interval([w[j] for w in windows_ratio], log=True)})
        out.append({"length": entry["length"], "heads": block["heads"], "windows": len(windows_ks), "points": points})
    return out


SHOWN_AT = (0.06, 0.5)  # the N/L at which a row gives d/E: the paper's N*/L, and half the context


def _nearest(points: list[dict], target: float) -> dict:
    return min(points, key=lambda p: abs(math.log(p["n_over_length"] / target)))


def effect_by_heads(results: dict | None) -> list[dict]:
    """At the longest L, per head count of `alg3_effect_size_by_heads`: d/E at each N/L over windows (an Interval or
    None) and N*/L per KS alpha of the same heads."""
    block = (results or {}).get("alg3_effect_size_by_heads")
    out = []
    for subset in (block or {}).get("subsets", []):
        entry = subset["by_length"][-1]
        points = [{"n": n, "n_over_length": entry["n_over_length"][j],
                   "d_over_e": _interval([w[j] for w in entry["d_over_e"]], log=True)} for j, n in enumerate(entry["ns"])]
        out.append({"heads": subset["heads"], "heads_total": block["heads_total"], "length": entry["length"],
                    "windows": len(entry["d_over_e"]), "points": points, "n_star_over_length": entry["n_star_over_length"]})
    return out


def _at(points: list[dict]) -> str:
    return " | ".join(f"{fmt(p['n_over_length'], 3)}: {p['d_over_e'] if p['d_over_e'] is not None else 'no interval'}"
                      for p in (_nearest(points, x) for x in SHOWN_AT))


def _star(value: float | None) -> str:
    return "> L" if value is None else fmt(value, 3)


def design_note(results: dict | None, alpha: float) -> str:
    """What goes beside a design-dependent N* row: why, and d/E against N/L at 9, 27 and 54 pooled heads (with N*/L
    of the same heads), or, for a results.json written before the per-count block, d/E over every pooled head."""
    why = ("design-dependent: N* is where a KS test over the pooled heads loses power, so it moves with their count "
           "(outside the family, value kept); the effect size beside it is d/E, the mean over heads of d over that of "
           f"E, geometric mean over {WHAT} with its {percent(CONFIDENCE)} t-interval")
    rows = effect_by_heads(results)
    if rows:
        parts = [f"{r['heads']} heads (N*/L {_star(r['n_star_over_length'].get(str(alpha)))}): {_at(r['points'])}"
                 for r in rows]
        counts = ", ".join(str(r["heads"]) for r in rows[:-1]) + (" and " if len(rows) > 1 else "") + str(rows[-1]["heads"])
        return (f"{why}, from {counts} heads sampled evenly out of the {rows[0]['heads_total']} pooled "
                f"(layer-major, every total/count-th), at L = {rows[0]['length']} and N/L = "
                + " | ".join(fmt(x) for x in SHOWN_AT) + ": " + "; ".join(parts))
    curves = effect_sizes(results)
    if not curves:
        return why + ": no per-window d/E in this results.json"
    curve = curves[-1]
    return (f"{why}; 9, 27 and 54 heads: not in this results.json (written before `alg3_effect_size_by_heads`); "
            f"all {curve['heads']} pooled heads at L = {curve['length']}, N/L = {_at(curve['points'])}")


def _layer_ids(results: dict) -> list[int]:
    chosen = (results.get("choices") or {}).get("layers")
    return list(chosen) if chosen else list(range((results.get("model") or {}).get("layers", 0)))


def heads_rows(results: dict | None) -> list[dict]:
    """N* and N*/L per L for each subset of layers pooled (`alg3_n_star_by_heads`), with the layers' indices."""
    rows = (results or {}).get("alg3_n_star_by_heads") or []
    ids = _layer_ids(results or {})
    out = []
    for row in rows:
        pos = row["layer_positions"]
        layers = [ids[p] for p in pos] if ids and max(pos) < len(ids) else pos
        out.append({"layers": layers, "heads": row["heads"], "lengths": row["lengths"], "n_star": row["n_star"],
                    "n_star_over_length": row["n_star_over_length"]})
    return out


def effect_json(results: dict | None) -> dict:
    """report.json's `theorem1_effect_size`: the curves with their intervals and the N*-against-heads table."""
    return {"level": CONFIDENCE, "unit": WHAT,
            "curves": [{**{k: v for k, v in curve.items() if k != "points"},
                        "points": [{**p, "ks": _plain(p["ks"]), "d_over_e": _plain(p["d_over_e"])}
                                   for p in curve["points"]]} for curve in effect_sizes(results)],
            "n_star_by_heads": heads_rows(results),
            "effect_by_heads": [{**{k: v for k, v in r.items() if k != "points"},
                                 "points": [{**p, "d_over_e": _plain(p["d_over_e"])} for p in r["points"]]}
                                for r in effect_by_heads(results)]}


def figure_name(length: int) -> str:
    return f"theorem1_effect_L{length}.png"


def draw(results: dict | None, out: Path) -> list[str]:
    """One figure per L: the KS statistic and d/E against N/L, mean over windows with its interval. The file names."""
    curves = effect_sizes(results)
    if not curves:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for curve in curves:
        fig, (ks_ax, ratio_ax) = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key, label in ((ks_ax, "ks", "KS statistic, d against E"), (ratio_ax, "d_over_e", "d / E")):
            pts = [(p["n_over_length"], p[key]) for p in curve["points"] if p[key] is not None]
            if not pts:
                continue
            x = [p[0] for p in pts]
            ax.plot(x, [p[1].estimate for p in pts], "o-")
            ax.fill_between(x, [p[1].lo for p in pts], [p[1].hi for p in pts], alpha=0.3,
                            label=f"{percent(CONFIDENCE)} t-interval over {curve['windows']} {WHAT}")
            ax.axvline(0.06, color="k", ls="--", lw=1, label="paper: N* = 0.06 L")
            ax.set(xscale="log", xlabel="N / L", ylabel=label)
            if key == "d_over_e":
                ax.set_yscale("log")
                ax.axhline(1.0, color="grey", ls=":", lw=1)
            ax.legend(fontsize=7)
        fig.suptitle(f"Theorem 1 as an effect size, L = {curve['length']} ({curve['heads']} heads)")
        fig.tight_layout()
        name = figure_name(curve["length"])
        save_figure(fig, Path(out) / name, dpi=90)
        plt.close(fig)
        names.append(name)
    return names


def _layers_text(layers: list[int]) -> str:
    return ", ".join(str(i) for i in layers) if len(layers) <= 6 else f"{len(layers)} layers ({layers[0]}..{layers[-1]})"


def section(results: dict | None, figures: list[str]) -> list[str]:
    """The markdown: N* against heads pooled (a table per L) and the effect-size figures, with what they show."""
    rows = heads_rows(results)
    curves = effect_sizes(results)
    if not rows and not curves and not effect_by_heads(results):
        return []
    lines = ["## Theorem 1: effect size and the KS design (frozen model)", "",
             "N* is where a KS test over heads stops telling d from E, so pooling more heads (more power) moves it; "
             "the table recomputes N* from the same per-head d and E, pooling only some layers. The figures give the "
             "effect itself against N/L, which does not depend on how many heads are pooled: the KS statistic and "
             f"d/E (mean over heads of d over that of E), mean over windows [{percent(CONFIDENCE)} t-interval over "
             f"{WHAT}, a description outside the family].", ""]
    if rows:
        lengths = rows[0]["lengths"]
        alphas = list(rows[0]["n_star"][0]) if rows[0]["n_star"] else []
        for alpha in alphas:
            columns = ["layers pooled", "heads", *(f"N*/L at L={n}" for n in lengths)]
            body = [[_layers_text(r["layers"]), str(r["heads"]),
                     *("> L" if v is None else fmt(v, 3) for v in (x[alpha] for x in r["n_star_over_length"]))]
                    for r in rows]
            lines += [f"N*/L against the heads pooled (KS alpha = {alpha}; d and E pooled over windows):", "",
                      table(columns, body), ""]
    by_heads = effect_by_heads(results)
    if by_heads:
        targets = (0.03, 0.06, 0.125, 0.25, 0.5)
        alphas = sorted(by_heads[0]["n_star_over_length"])
        body = [[str(r["heads"]), *(_star(r["n_star_over_length"][a]) for a in alphas),
                 *(str(p["d_over_e"]) if (p := _nearest(r["points"], x))["d_over_e"] is not None else "-"
                   for x in targets)] for r in by_heads]
        columns = ["heads pooled", *(f"N*/L (alpha {a})" for a in alphas),
                   *(f"d/E at N/L ~ {fmt(x)}" for x in targets)]
        lines += [f"d/E against N/L and N*/L of the same heads, {', '.join(str(r['heads']) for r in by_heads)} heads "
                  f"sampled evenly out of the {by_heads[0]['heads_total']} pooled (L = {by_heads[0]['length']}; d/E: "
                  f"geometric mean over {by_heads[0]['windows']} {WHAT}, {percent(CONFIDENCE)} t-interval):", "",
                  table(columns, body), ""]
    for curve, name in zip(curves, figures):
        near = min(curve["points"], key=lambda p: abs(math.log(p["n_over_length"] / 0.06)))
        ks, ratio = near["ks"], near["d_over_e"]
        lines += [f"At L = {curve['length']}, N/L = {fmt(near['n_over_length'], 3)} (nearest the paper's 0.06): KS "
                  f"{ks if ks is not None else 'no interval'}, d/E {ratio if ratio is not None else 'no interval'}.",
                  "", f"![Theorem 1 effect size, L = {curve['length']}]({name})", ""]
    return lines
