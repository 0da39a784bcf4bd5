"""The probe's section of report.md (`study.report.probe` holds its numbers and its findings)."""

from __future__ import annotations

from study.report.probe import (
    DESCRIBE_MAX_T,
    FP64_TOLERANCE,
    KIND_NAMES,
    REGIME_MAX_T,
    UNRELIABLE,
    depth_statement,
    described_temperatures,
    fp32_over_fp64,
    layer_slopes,
    local_slopes,
    unreliable,
)
from study.report.stats import fmt
from study.report.table import table


def section(probe: dict | None, figure: str | None = None) -> list[str]:
    """The probe's part of report.md: what the data say with T in every layer, the local slopes, fp32 against
    fp64, Corollary 3 entrywise, the per-layer table."""
    if not probe or not probe.get("results"):
        return []
    results = probe["results"]
    single = probe.get("single_layer", [])
    slopes = layer_slopes(probe)
    lines = ["## Probe (frozen model, no training)", "",
             f"`study probe` on {probe.get('model', '?')}: {probe.get('windows', '?')} independent text windows of "
             f"{probe.get('seq_len', '?')} tokens across the documents of `{probe.get('text', '?')}` (the replicates; "
             "the same windows at every T). The finding above lowers T in one layer at a time; with T lowered in every "
             "layer the numbers below are described, not judged.", "", depth_statement(slopes), ""]  # fmt: skip
    if bad := unreliable(results):
        lines += [f"With T in every layer the fp32 gradients are {UNRELIABLE} at " + ", ".join(
            f"T={fmt(t)} (fp32/fp64 = {fmt(r, 3)})" for t, r in bad) + ": the description and the per-layer slopes "
            "leave those T out; their local slopes are fp32 artefacts.", ""]  # fmt: skip
    columns = ["T pair", "W_q, W_k (every layer)"] + [f"layer {e['layer']} alone" for e in single]
    every = local_slopes({float(r["temperature"]): [w["grad_attn_qk"] for w in r["windows"]] for r in results})
    alone = [local_slopes({float(r["temperature"]): [w["grad_attn_qk"] for w in r["windows"]] for r in e["results"]})
             for e in single]  # fmt: skip
    rows = []
    for i, (a, b, s) in enumerate(every):
        mark = " (regime)" if b <= REGIME_MAX_T else ""
        rows.append([f"{fmt(a)} - {fmt(b)}{mark}", fmt(s, 3)] + [fmt(col[i][2], 3) for col in alone])
    lines += ["### Local slopes (log-log, between adjacent T; geometric means over windows)", "", table(columns, rows),
              "", f"The verdict uses the pairs marked (regime): T <= {fmt(REGIME_MAX_T)}.", ""]  # fmt: skip
    checked = [i for i, r in enumerate(results) if r.get("fp64") or any(e["results"][i].get("fp64") for e in single)]
    if checked:
        columns = ["T", "W_q, W_k (every layer) fp32/fp64"] + [f"layer {e['layer']} alone" for e in single]
        columns += ["Hessian norm fp32", "Hessian norm fp64"]
        rows = []
        for index in checked:
            r = results[index]
            ratios = [fp32_over_fp64(r)] + [fp32_over_fp64(e["results"][index]) for e in single]
            rows.append([fmt(r["temperature"])] + [fmt(x, 4) for x in ratios]
                        + [fmt(r.get("hessian_qk_norm"), 3), fmt((r.get("fp64") or {}).get("hessian_qk_norm"), 3)])  # fmt: skip
        lines += [f"### fp32 against the fp64 reference ({probe.get('fp64_windows', '?')} windows; the ratio farthest "
                  f"from 1; beyond {fmt(100 * FP64_TOLERANCE)}% a number is {UNRELIABLE})", "", table(columns, rows), ""]  # fmt: skip
    rows = [[fmt(r["temperature"]), fmt(r["jacobian"].get("entry_max_times_4T"), 4),
             fmt(r["jacobian"].get("entry_frac_above_0.5"), 3), fmt(r["jacobian"].get("entry_frac_above_0.9"), 3),
             fmt(r["jacobian"].get("saturated_fraction"), 3), fmt(r["jacobian"].get("max_times_2T"), 4)] for r in results]  # fmt: skip
    lines += ["### Corollary 3 entrywise (T in every layer, sampled rows)", "",
              "max |J_ij| <= 1/(4T) holds for every row by mathematics (the first column, at most 1, checks the code); "
              "the empirical question is how close real rows come to it. The spectral norm reaches 1/(2T) (last "
              "column, at most 1), so the bound does not hold as a spectral norm.", "",
              table(["T", "max over rows of max|J_ij| x 4T", "rows above 1/2 of the bound", "rows above 9/10",
                     "saturated rows", "max spectral norm x 2T"], rows), ""]  # fmt: skip
    if any(v is not None for values in slopes.values() for v in values):
        layers = len(next(iter(slopes.values())))
        rows = [[str(i)] + [fmt(slopes[k][i], 3) for k in slopes] for i in range(layers)]
        used = ", ".join(fmt(t) for t in described_temperatures(probe))
        lines += [f"### Per-layer slopes against T (T in every layer; fitted on T = {used}: T <= {fmt(DESCRIBE_MAX_T)} "
                  "without the T where fp32 was found unreliable)", "",
                  table(["layer"] + [KIND_NAMES[k] for k in slopes], rows), ""]  # fmt: skip
    if figure:
        lines += [f"![probe slopes per layer]({figure})", ""]
    what = "the probe's own figure: curves against T, Hessian, fp32/fp64"
    lines += [f"![{what}](../probe/probe.png)", ""]  # shown, not linked
    return lines
