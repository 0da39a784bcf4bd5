"""`study report` on a real (tiny) sweep: figures exist and the table's numbers are the logged scalars."""

from __future__ import annotations

import math

from study.report import build_report
from study.report import main as report_main
from study.report.read import read_scalars
from study.sweep import main
from tests.test_sweep import write_spec


def test_report_from_real_logs(tmp_path):
    spec = write_spec(
        tmp_path,
        {"temperature": [0.01, 1.0], "top_k": [None, 2]},
        callbacks=[
            {"class_path": "tests.faults.NaNLossAtStep", "init_args": {"step": 4, "env": "NEVER_SET"}}
        ],
    )
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    sweep = tmp_path / "logs" / "tiny"
    assert report_main([str(sweep)]) == 0
    path = build_report(sweep)
    out = path.parent
    for name in ("curves.png", "sensitivity_vs_T.png", "dilution_vs_n.png", "stability_vs_T.png", "ppl_heatmap.png",
                 "attention_vs_T.png", "layer_sensitivity.png"):  # fmt: skip
        assert (out / name).stat().st_size > 1000, name
    text = path.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| T") and not line.startswith("| T |")]
    assert len(rows) == 4
    header = next(line for line in text.splitlines() if line.startswith("| run |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    for row in rows:
        cells = dict(zip(cols, [c.strip() for c in row.strip("|").split("|")]))
        scalars = read_scalars(sweep / cells["run"])
        for col, tag in (
            ("train/loss", "train/loss"),
            ("val/loss", "val/loss"),
            ("val/ppl", "val/ppl"),
            ("H/log n", "val/attention/normalized_entropy/mean"),
            ("KL uniform", "val/attention/kl_uniform/mean"),
        ):
            assert math.isclose(float(cells[col]), scalars[tag][-1][1], rel_tol=1e-3), (cells["run"], col)  # 4 digits
        grad = sorted(v for _, v in scalars["grad_norm/total"])  # the monitor's tag wins over the guard's
        median = (grad[(len(grad) - 1) // 2] + grad[len(grad) // 2]) / 2
        assert math.isclose(float(cells["grad norm (median)"]), median, rel_tol=1e-3)
        assert cells["state"] == "finished" and cells["steps"] == "6"
        # the monitor tags reached the events: Lemma 1 bins, saturated rows, rows near the entrywise bound, the
        # per-layer gradients, and a step-0 validation before the first update
        assert "val/attention/by_visible/max_weight/n2" in scalars and "val/attention/saturated/mean" in scalars
        assert "val/attention/jacobian/frac_near_quarter_T" in scalars
        assert "grad_norm/block_0/attn_q" in scalars and "grad_norm/block_0/mlp" in scalars
        assert scalars["val/loss"][0][0] == 0 and len(scalars["val/loss"]) == 2
    findings = text.split("## Findings")[1].split("## Sanity")[0]
    slope_row = next(line for line in findings.splitlines() if "grow like 1/T in training" in line)
    assert "too few: 2 levels" in slope_row and "| inconclusive |" in slope_row  # 2 values of T, 1 seed
    sanity = text.split("## Sanity checks")[1].split("## Per temperature")[0]
    assert "| pass |" in sanity and "FAIL" not in sanity and "entrywise" in sanity
    per_layer = text.split("## Per layer")[1].split("## Stability")[0]
    assert "| layer | low-T layers crossed | slope W_q,W_k | slope W_v | slope W_o | slope MLP |" in per_layer
    assert "## Stability by optimizer and learning rate" in text


def write_fake_run(sweep, name, params, scalars):
    """A run folder as a sweep leaves it: status.json and TensorBoard events with the given scalars."""
    import json

    from torch.utils.tensorboard import SummaryWriter

    run = sweep / name
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": "finished", "params": params, "global_step": 2}))
    writer = SummaryWriter(str(run))
    for tag, points in scalars.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    writer.close()


def test_normalizers_are_compared_in_their_own_section(tmp_path):
    import json

    sweep = tmp_path / "norms"
    runs = []
    for normalizer, ppl, entropy, nonzero in (("softmax", 100.0, 0.9, 8.0), ("sparsemax", 120.0, 0.4, 2.0)):
        for temperature in (0.1, 1.0):
            name = f"T{temperature:g}_kall_{normalizer}_s0"
            params = {"temperature": temperature, "top_k": None, "normalizer": normalizer, "seed": 0}
            write_fake_run(sweep, name, params, {
                "train/loss": [(0, 5.0), (1, 4.0)],
                "val/ppl": [(2, ppl * temperature)],
                "val/attention/normalized_entropy/mean": [(2, entropy)],
                "val/attention/nonzero/mean": [(2, nonzero)],
                "grad_norm/total": [(0, 1.0 / temperature), (1, 1.0 / temperature)],
            })
            runs.append({"name": name, "params": params})
    (sweep / "plan.json").write_text(json.dumps({"sweep": "norms", "runs": runs}))
    text = build_report(sweep).read_text()
    section = text.split("## Normalisers")[1].split("## Runs")[0]
    assert "softmax runs (2)" in section
    # medians over T of the final values
    assert "| softmax | 2 | 0 | 55 | 0.9 | 8 | 5.5 |" in section
    assert "| sparsemax | 2 | 0 | 66 | 0.4 | 2 | 5.5 |" in section
    assert (sweep / "report" / "normalizers.png").stat().st_size > 1000


def test_a_damaged_probe_json_is_named_and_the_report_goes_without_it(tmp_path, capsys):
    from study.report.build import load_probe

    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "probe.json").write_text('{"results": [')
    assert load_probe(tmp_path) is None
    assert "probe.json is damaged" in capsys.readouterr().out
