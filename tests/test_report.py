"""`study report` on a real (tiny) sweep: figures exist and the table's numbers are the logged scalars."""

from __future__ import annotations

import math

import pytest

from study import tags
from study.report import build_report
from study.report import main as report_main
from study.report.read import read_scalars
from study.sweep import main
from tests.test_sweep import write_spec


@pytest.mark.slow
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
    assert "too few: 2 levels" in slope_row and "| too few |" in slope_row  # 2 values of T, 1 seed
    sanity = text.split("## Sanity checks")[1].split("## Per temperature")[0].split("## Controls")[0]
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


def _sweep_of_fake_runs(sweep, extra=()):
    """Finished softmax runs at 3 temperatures x 3 seeds whose gradient norm is 1/T, plus ``extra`` runs given
    as (name, params, state, grad norm)."""
    import json

    runs = []
    members = [
        (f"T{t:g}_kall_softmax_s{seed}", {"temperature": t, "top_k": None, "normalizer": "softmax", "seed": seed},
         "finished", 1.0 / t * (1 + 0.01 * seed))
        for t in (0.1, 0.3, 1.0) for seed in (0, 1, 2)
    ]  # fmt: skip
    for name, params, state, grad in [*members, *extra]:
        write_fake_run(sweep, name, params, {
            "train/loss": [(0, 5.0), (1, 4.0)],
            "val/ppl": [(2, 50.0)],
            "grad_norm/total": [(0, grad), (1, grad)],
            "grad_norm/attn_q": [(0, grad), (1, grad)],
            "grad_norm/attn_k": [(0, grad), (1, grad)],
            "val/attention/jacobian/mean": [(2, grad / 10)],
        })
        status = json.loads((sweep / name / "status.json").read_text())
        (sweep / name / "status.json").write_text(json.dumps({**status, "state": state, "reason": "killed"}))
        runs.append({"name": name, "params": params})
    (sweep / "plan.json").write_text(json.dumps({"sweep": sweep.name, "runs": runs}))
    return build_report(sweep).read_text()


@pytest.mark.slow
def test_unfinished_and_failed_runs_never_count_as_replicates(tmp_path):
    """A run killed or failed part way holds a partial log: the findings, sanity checks and per-T table of a
    sweep with such runs are those of its finished runs alone, and the others are named apart."""
    clean = _sweep_of_fake_runs(tmp_path / "clean")
    extra = [
        (f"T0.1_kall_softmax_s{seed}", {"temperature": 0.1, "top_k": None, "normalizer": "softmax", "seed": seed},
         state, 1000.0)
        for seed, state in ((3, "running"), (4, "failed"), (5, "missing"))
    ]  # fmt: skip
    mixed = _sweep_of_fake_runs(tmp_path / "mixed", extra)

    def section(text, start, end):
        return text.split(start)[1].split(end)[0]

    assert "grow like 1/T in training | slope 0 (no dependence on T) | log-log slope of the median |grad W_q, W_k| over all layers vs T (k = all) | -1" in clean.replace("\\|", "|")
    for start, end in (("| claim (docs/paper.md) |", "## Sanity"), ("## Sanity", "## Runs")):
        assert section(mixed, start, end) == section(clean, start, end), start
    assert mixed.split("\n")[2].startswith("12 runs: 1 failed, 9 finished, 1 missing, 1 running.")
    assert ("Not counted: 3 run(s) that did not finish (`T0.1_kall_softmax_s3` running, `T0.1_kall_softmax_s4` "
            "failed, `T0.1_kall_softmax_s5` missing)") in mixed
    runs_table = section(mixed, "## Runs", "## Figures")
    assert all(f"| T0.1_kall_softmax_s{seed} |" in runs_table for seed in range(6))


def test_figures_show_their_data(tmp_path, monkeypatch):
    """One validation per run is a point with a marker; a panel with nothing to show says why; the heatmap's numbers
    share one format and stay readable on their cell's colour."""
    from types import SimpleNamespace

    import matplotlib.colors

    from study.report import figures as F
    from study.report import summary as S
    from study.report.summary import Summary

    drawn = {}
    monkeypatch.setattr(F, "_save", lambda fig, path: drawn.__setitem__(path.name, fig))
    ppl = {0.01: 2230.0, 0.1: 900.0, 1.0: 595.0}
    run = SimpleNamespace(series=lambda tag: [(24, 700.0)] if tag == tags.VAL_PPL else [(0, 7.0), (5, 6.5), (10, 6.4), (15, 6.3)])
    summaries = [Summary(f"T{t}_k{k}_s{seed}", t, k, seed=seed, final={tags.VAL_PPL: p},
                         values={S.SPIKES: 0, S.CLIPPED: 0.0}, run=run)
                 for t, p in ppl.items() for k in (None, 8) for seed in (0, 1)]

    F.curves(summaries, tmp_path)
    loss_ax, ppl_ax = drawn["curves.png"].axes[:2]
    assert all(line.get_marker() == "o" for line in ppl_ax.lines)  # single points drawn
    assert all(line.get_marker() in (None, "None", "") for line in loss_ax.lines)  # long curves stay lines

    assert F.stability(summaries, tmp_path) is None  # no event at all: no figure of empty panels
    summaries[0].state = "diverged"
    caption = F.stability(summaries, tmp_path)
    (diverged,) = drawn["stability_vs_T.png"].axes  # no panel without an event, none for clipping that is off
    assert [p.get_height() for p in diverged.patches] == [1, 0, 0]
    assert "clipping off in every run" in caption and "none in any run: loss spikes" in caption

    F.ppl_heatmap(summaries, tmp_path)
    ax = drawn["ppl_heatmap.png"].axes[0]
    cells = {t.get_text(): t.get_color() for t in ax.texts}
    assert set(cells) == {"2,230", "900", "595"}  # one format, no 2.23e+03 beside 595
    # the darkest cell (highest perplexity on magma_r) gets white text, the lightest black
    assert matplotlib.colors.to_rgb(cells["2,230"]) == (1.0, 1.0, 1.0)
    assert matplotlib.colors.to_rgb(cells["595"]) == (0.0, 0.0, 0.0)
