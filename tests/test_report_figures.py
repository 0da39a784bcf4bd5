"""The report's figures draw the main arm only: a sweep-like set of runs with an SGD arm beside an AdamW grid, each
figure's data checked against the AdamW runs alone, and the arm drawn on its own."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from study import tags
from study.report import figures as F
from study.report import sources
from study.report import summary as S
from study.report.read import RunData
from study.report.summary import Summary

MAIN_PPL = {0.01: 2000.0, 0.1: 300.0, 1.0: 40.0}  # AdamW, by T (seed s adds s)
ARM_PPL = 1180.0  # the SGD runs that finish: far above the AdamW runs at T = 1


def _run(name: str, ppl: float, weight: float) -> RunData:
    scalars = {
        tags.TRAIN_LOSS: [(0, 5.0), (5, 4.5), (10, 4.0), (13, 3.9)],
        tags.VAL_PPL: [(14, ppl)],
        "val/attention/by_visible/max_weight/n2": [(14, weight)],
        "val/attention/by_visible/max_weight/n4": [(14, weight / 2)],
        "val/attention/by_visible/normalized_entropy/n2": [(14, 0.5)],
        "val/attention/by_visible/normalized_entropy/n4": [(14, 0.6)],
    }
    return RunData(name, Path(name), {}, {"state": "finished"}, {}, scalars)


def _summary(t, k, seed, optimizer, lr, ppl, state="finished", entropy=0.4, grad=1.0) -> Summary:
    name = f"T{t}_k{'all' if k is None else k}_s{seed}_{optimizer}_lr{lr}"
    return Summary(
        name, t, k, seed=seed, state=state, optimizer=optimizer, learning_rate=lr,
        final={tags.VAL_PPL: ppl, sources.NORMALIZED_ENTROPY: entropy},
        values={S.SPIKES: 3 if optimizer == "sgd" else 0, S.CLIPPED: 0.0, S.GRAD_NORM: grad, S.GRAD_QK: grad,
                S.JACOBIAN: 0.1},
        run=_run(name, ppl, 0.9 if optimizer == "sgd" else 0.3),
    )  # fmt: skip


@pytest.fixture
def sweep() -> tuple[list[Summary], list[Summary]]:
    main = [_summary(t, k, seed, "adamw", 3e-5, p + seed, entropy=0.4 + 0.01 * seed, grad=1 / t)
            for t, p in MAIN_PPL.items() for k in (None, 8) for seed in (0, 1, 2)]  # fmt: skip
    arm = [
        _summary(0.01, None, 1, "sgd", lr, math.nan, state="diverged", entropy=0.99, grad=1e10) for lr in (0.01, 1.0)
    ] + [_summary(1.0, None, 1, "sgd", lr, ARM_PPL, entropy=0.99, grad=1e3) for lr in (0.01, 1.0)]
    return main, arm


def test_every_figure_draws_the_main_arm_only(sweep, tmp_path, monkeypatch):
    main, arm = sweep
    drawn = {}
    monkeypatch.setattr(F, "_save", lambda fig, path: drawn.__setitem__(path.name, fig))
    made = F.figures(main + arm, tmp_path)
    not_drawn = F.not_drawn(main + arm, made)
    assert set(made) == {"curves.png", "sensitivity_vs_T.png", "dilution_vs_n.png", "attention_vs_T.png",
                         "ppl_heatmap.png", "arms.png"}  # fmt: skip
    # the AdamW runs had no spike and no divergence: no figure of zero-height bars, a sentence instead
    assert list(not_drawn) == ["stability_vs_T.png"] and "any of the 18 runs" in not_drawn["stability_vs_T.png"]
    for name, caption in made.items():  # every caption says which runs it draws
        if name != "arms.png":
            assert "adamw, lr 3e-05: " in caption, name
    assert "adamw, lr 3e-05: 18 runs" in made["curves.png"] and "adamw, lr 3e-05: 9 runs" in made["dilution_vs_n.png"]

    loss_ax, ppl_ax = drawn["curves.png"].axes[:2]
    assert len(loss_ax.lines) == 18 and len(ppl_ax.lines) == 18  # one line per AdamW run, none of the arm
    assert ARM_PPL not in {float(y) for line in ppl_ax.lines for y in line.get_ydata()}
    labels = [t.get_text() for t in ppl_ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == 6  # each (T, k) once

    ax = drawn["sensitivity_vs_T.png"].axes[0]
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    assert len(points) == 2 * 9 and points[:, 1].max() == pytest.approx(100.0)  # 1/T of AdamW, never the arm's 1e10

    weight_ax = drawn["dilution_vs_n.png"].axes[0]
    runs = [line for line in weight_ax.lines if line.get_label().startswith("T=")]
    assert len(runs) == 9 and all(line.get_ydata()[0] == pytest.approx(0.3) for line in runs)

    entropy_ax = drawn["attention_vs_T.png"].axes[0]
    k_all = next(c for c in entropy_ax.containers if c.get_label() == "k=all")
    assert list(k_all.lines[0].get_ydata()) == pytest.approx([0.41] * 3)  # the AdamW seeds' mean, not pulled to 0.99

    heat = drawn["ppl_heatmap.png"].axes[0]
    texts = {t.get_text() for t in heat.texts}
    geometric = math.exp(np.mean(np.log([40.0, 41.0, 42.0])))
    assert f"{geometric:.1f}" == "41.0" and "41.0" in texts  # T = 1, k = all: the AdamW runs alone (with the arm: 156)

    arms_ax = drawn["arms.png"].axes[0]
    by_label = {line.get_label(): line for line in arms_ax.lines}
    assert list(by_label["sgd lr 0.01"].get_ydata()) == [ARM_PPL]
    # the two diverged SGD runs at T = 0.01 sit side by side around 0.01, not one on the other
    crosses = [float(by_label[f"sgd lr {lr}: diverged"].get_xdata()[0]) for lr in ("0.01", "1")]
    assert crosses[0] != crosses[1] and all(0.8 * 0.01 < x < 1.25 * 0.01 for x in crosses)
    assert "4 runs" in made["arms.png"]


def test_no_arm_no_arms_figure(sweep, tmp_path, monkeypatch):
    main, _ = sweep
    monkeypatch.setattr(F, "_save", lambda fig, path: None)
    assert "arms.png" not in F.figures(main, tmp_path)


def test_per_temperature_table_cells_live_on_their_scale(sweep):
    """Norms and perplexities: geometric mean with a positive interval (a linear one ran below zero); a value every
    run shares: that value with its count; unstable runs: a count with its exact bound; the arm is left out."""
    from study.report import markdown as md
    from study.report.stats import mean_interval

    main, arm = sweep
    spread = [_summary(0.01, None, s, "adamw", 3e-5, 2000.0, grad=g) for s, g in enumerate((1e9, 1e10, 3e10))]
    for s in spread:
        s.values[S.VAL_LOSS_BASELINE] = 8.105  # shared step-0 validation: one value for every seed
    assert mean_interval([1e9, 1e10, 3e10]).lo < 0  # what the linear cell showed
    text = md.per_t_table(spread + [m for m in main if m.temperature != 0.01] + arm)
    header, _, *rows = text.splitlines()

    def cells(line: str) -> list[str]:  # split on the unescaped pipes
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]

    row = dict(zip(cells(header), cells(rows[0])))
    assert row["T"] == "0.01" and row["runs"] == "3" and row["diverged"] == "0"  # the SGD runs at 0.01 are not here
    grad = row["\\|grad W_q,W_k\\| (geometric)"]
    estimate, lo, hi = (float(x) for x in grad.replace("[", "").replace(",", "").replace("]", "").split())
    assert estimate == pytest.approx(math.exp(np.mean(np.log([1e9, 1e10, 3e10]))), rel=1e-3) and 0 < lo < estimate < hi
    assert row["step-0 val/loss"] == "8.105 (all 3 equal)"
    assert row["unstable runs [exact CI]"] == "0/3 [0, 0.708]"  # Clopper-Pearson: 1 - 0.025 ** (1/3)


def test_report_opens_with_the_plain_summary_from_its_json():
    from study.report.markdown import plain_summary

    data = {
        "runs": {"finished": 20, "diverged": 2},
        "family": {"level": 0.9971, "confidence": 0.95},
        "findings": [
            {"claim": "g grows like 1/T", "verdict": "not supported", "paper_value": "1/T", "experiment": "probe",
             "interval": {"estimate": -0.2761, "lo": -0.47, "hi": -0.0823}},
            {"claim": "3. N* grows with L", "verdict": "supported", "paper_value": "0.06 L", "experiment": "frozen",
             "interval": {"estimate": 1.026, "lo": 0.967, "hi": 1.086}},
            {"claim": "low T unstable", "verdict": "inconclusive", "paper_value": None, "experiment": "training",
             "interval": None, "value": "too few: 3 vs 3 runs; more"},
            {"claim": "last layer like 1/T", "verdict": "underpowered", "paper_value": "1/T", "experiment": "training",
             "interval": {"estimate": -0.7, "lo": -1.4, "hi": 0.0}},
        ],
    }  # fmt: skip
    text = plain_summary(data)
    first = text.splitlines()[0]
    assert first.startswith("22 runs (2 diverged, 20 finished); 4 claims judged: 1 supported, 1 not supported, 1 inconclusive, 1 underpowered")
    assert "- 3\\. N* grows with L: paper 0.06 L, ours 1.03 [0.967, 1.09] (frozen)." in text  # not a numbered list
    assert "- low T unstable: paper -, ours too few: 3 vs 3 runs (training)." in text
    assert text.index("Supported") < text.index("Not what") < text.index("Undecided") < text.index("Not decidable with")


def test_report_events_hold_the_summary_scorecard_and_figures(tmp_path):
    """`study report` writes its summary and scorecard as Text and its figures as Images (the run "report");
    a rewrite replaces the earlier events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from study import tags
    from study.report.tensorboard import write_report_events

    plt = F._plt()
    for name in ("curves.png", "sensitivity_vs_T.png"):
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1])
        fig.savefig(tmp_path / name, dpi=50)
        plt.close(fig)
    write_report_events(tmp_path, "old", "old", ["curves.png"])
    write_report_events(tmp_path, "22 runs; **plain**", "| claim |\n|---|", ["curves.png", "sensitivity_vs_T.png"])
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    assert acc.Tags()["scalars"] == []  # no line in any chart
    text = acc.Tensors(tags.REPORT_SUMMARY)[0].tensor_proto.string_val[0].decode()
    assert text == "22 runs; **plain**" and acc.Tensors(tags.REPORT_SCORECARD)[0].step == 0
    images = acc.Tags()["images"]
    assert images == [tags.report_figure("00_sensitivity_vs_T"), tags.report_figure("01_curves")]  # key figure first
    image = acc.Images(images[0])[0]
    assert image.encoded_image_string == (tmp_path / "sensitivity_vs_T.png").read_bytes()
    assert (image.width, image.height) == (150, 100)


def step0_sweep() -> list[Summary]:
    """AdamW runs at 3 T x 3 seeds whose fp32 W_q/W_k norm is off fp64 by 30x at T = 0.01, with float64 step-0 norms
    of 3 layers, and a top-8 arm of one seed at two of the T."""
    runs = []
    for t in MAIN_PPL:
        for seed in (0, 1, 2):
            s = _summary(t, None, seed, "adamw", 3e-5, MAIN_PPL[t] + seed, entropy=0.4 + 0.01 * seed + t, grad=1 / t)
            s.values.update({S.FP64_QK: 30.0 if t == 0.01 else 1.0, S.STEP0_QK: 2 / t, S.SATURATED: 0.1 * seed})
            s.step0_grads = {"W_q,W_k": {0: 1 / t**2, 1: 1 / t, 2: 1 / t}}
            runs.append(s)
    return runs + [_summary(t, 8, 0, "adamw", 3e-5, 500.0, entropy=0.2) for t in (0.01, 1.0)]  # one seed at two T


def test_figures_draw_unreliable_values_hollow_and_every_mean_with_its_interval(tmp_path, monkeypatch):
    """fp32 norms the fp64 check contradicts are hollow and labelled, the float64 step-0 norms filled; every mean has
    its interval; a k run at two of three T is points at those T, not a line across."""
    from scipy import stats as scipy_stats

    drawn = {}
    monkeypatch.setattr(F, "_save", lambda fig, path: drawn.__setitem__(path.name, fig))
    runs = step0_sweep()
    caption = F.sensitivity(runs, tmp_path)
    ax = drawn["sensitivity_vs_T.png"].axes[0]
    by_label = {c.get_label(): c for c in ax.collections}
    hollow = next(c for label, c in by_label.items() if "left out by the findings" in label)
    assert len(hollow.get_offsets()) == 3 and set(hollow.get_offsets()[:, 0]) == {0.01}  # the three T = 0.01 runs
    assert len(hollow.get_facecolors()) == 0 and len(hollow.get_edgecolors())  # no fill: hollow
    fp32 = by_label["|grad W_q, W_k| float32 (median over steps)"]
    assert set(fp32.get_offsets()[:, 0]) == {0.1, 1.0} and fp32.get_facecolors().any()  # filled where reliable
    fp64 = by_label["|grad W_q, W_k| float64 at step 0 (the findings' fit)"]
    assert sorted(fp64.get_offsets()[:, 1]) == pytest.approx(sorted(2 / t for t in MAIN_PPL for _ in range(3)))
    assert "hollow: the float32 W_q/W_k norms at T = 0.01" in caption
    rows = drawn["sensitivity_vs_T.png"].axes[1].containers[0]  # saturated rows: mean 0.1 with its interval
    expected = 0.1 + scipy_stats.t.ppf(0.975, 2) * np.std([0, 0.1, 0.2], ddof=1) / math.sqrt(3)
    assert rows.lines[0].get_ydata() == pytest.approx([0.1] * 3)
    assert [seg[1][1] for seg in rows.lines[2][0].get_segments()] == pytest.approx([expected] * 3)

    F.attention_vs_t(runs, tmp_path)
    entropy_ax = drawn["attention_vs_T.png"].axes[0]
    by_label = {c.get_label(): c for c in entropy_ax.containers}
    k_all, k8 = by_label["k=all"], by_label["k=8 (T = 0.01, 1 only), 1 run per T: no interval"]
    assert k_all.lines[0].get_linestyle() == "-" and k8.lines[0].get_linestyle() == "None"  # points, no line across
    assert list(k8.lines[0].get_xdata()) == [0.01, 1.0]
    bars = k_all.lines[2][0].get_segments()  # one bar per T: the t-interval of the three seeds' entropies
    half = scipy_stats.t.ppf(0.975, 2) * np.std([0.0, 0.01, 0.02], ddof=1) / math.sqrt(3)
    assert [seg[1][1] - seg[0][1] for seg in bars] == pytest.approx([2 * half] * 3)



def test_legends_lie_outside_the_data_and_the_layer_figure_names_its_levels(tmp_path, monkeypatch):
    drawn = {}
    monkeypatch.setattr(F, "_save", lambda fig, path: drawn.__setitem__(path.name, fig))
    runs = step0_sweep()

    def outside(fig, ax) -> bool:
        fig.canvas.draw()
        return ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1

    F.curves(runs, tmp_path)
    fig = drawn["curves.png"]
    assert outside(fig, fig.axes[1])  # the legend covers no point

    caption = F.layer_sensitivity(runs, tmp_path)
    title = drawn["layer_sensitivity.png"].axes[0].get_title()
    assert "fitted on T = 0.01, 0.1, 1 (float64 step-0 norms)" in title and "T = 0.01, 0.1, 1" in caption
