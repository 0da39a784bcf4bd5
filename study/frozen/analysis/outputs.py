"""What `study analyze` writes: results JSON, a per-head CSV, the claims table, one figure per algorithm and
(optionally) TensorBoard scalars. Each analysis supplies its own rows, figures and scalars (`registry.ANALYSES`)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from study.atomic import write_text_atomically

from . import registry

CSV_HEADER = ["analysis", "metric", "layer", "head", "L", "N", "T", "eps", "value"]


def write_outputs(results: dict, out_dir, *, figures: bool = True) -> dict:
    """Write results.json, per_head.csv, claims.md and figures (fig2a/2b/2c/3/4 and dilution) to out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ch = results["choices"]
    paths = {"json": out / "results.json", "csv": out / "per_head.csv", "claims": out / "claims.md"}
    write_text_atomically(paths["json"], json.dumps(results, indent=1, allow_nan=False))
    ids = ch.get("layers") or list(range(results["model"]["layers"]))  # per-layer arrays are in this order
    chosen = registry.chosen(results)

    rows = io.StringIO(newline="")
    wr = csv.writer(rows)
    wr.writerow(CSV_HEADER)
    for analysis in chosen:
        wr.writerows(analysis.csv_rows(results, ids))
    write_text_atomically(paths["csv"], rows.getvalue())

    # Measurements beside the paper's values, not verdicts: claims are judged in one place, `study report`, by one
    # rule each, with intervals over text windows (docs/findings.md).
    lines = ["| claim (paper) | paper | measured |", "|---|---|---|"]
    for c in results["claims"]:
        lines.append(f"| {c['claim']} | {c['paper']} | {c['measured'] or '-'} |")
    lines += ["", f"vectors: {ch['vectors']} ({ch['vector_note']}); distance reading: {ch['distance_reading']}; "
              f"KS alphas: {ch['alphas']}; reconstructed formulas: {', '.join(ch['reconstructions'])}."]
    windows = results["model"].get("batch", 1)
    if windows > 1:
        lines += ["", f"Pooled over {windows} text windows (results.json `source.windows`)."]
    lines += ["", "Measurements, not verdicts: `study report` judges these claims, each by one rule, with intervals "
              "over text windows (docs/findings.md, frozen-model findings)."]
    write_text_atomically(paths["claims"], "\n".join(lines) + "\n")
    if figures:
        for analysis in chosen:
            paths.update(analysis.figures(results, out))
    return {k: str(v) for k, v in paths.items()}


def write_tensorboard(results: dict, out: Path) -> Path:
    """Scalars per layer (step = layer index): distance per L, separability per N, gradient g per T, max weight per
    L; N* per alpha (step = L). Each analysis names its own (`Analysis.scalars`)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(out))
    try:
        for analysis in registry.chosen(results):
            for tag, value, step in analysis.scalars(results):
                writer.add_scalar(tag, value, step)
    finally:
        writer.close()
    return out
