"""The main arm's mean over seeds per T: one TensorBoard run per T with the mean and its band, whose Custom Scalars
category comes first in the layout TensorBoard merges from every run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from study import tags
from study.report.read import read_scalars
from study.sweep.config import Run
from study.sweep.seed_means import CATEGORY, CHARTS, step_mean, write_seed_means
from tests.tensorboard_reads import merged_layout

GRAD = tags.LOG10_GRAD_QK


def test_a_steps_band_is_the_t_interval_with_three_seeds_and_the_range_below():
    values = [1.0, 2.0, 4.0]
    mean, low, high = step_mean(values)
    half = scipy_stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / np.sqrt(3)  # the closed form, from scipy
    assert (mean, low, high) == pytest.approx((7 / 3, 7 / 3 - half, 7 / 3 + half))
    assert step_mean([1.0, 3.0]) == (2.0, 1.0, 3.0)  # two seeds: their range
    assert step_mean([5.0]) == (5.0, 5.0, 5.0)  # a shared step-0 validation: one value, no spread
    assert step_mean([1.0, float("inf"), 3.0]) == (2.0, 1.0, 3.0)  # a diverged step is left out
    assert step_mean([float("nan")]) is None


def _run(sweep: Path, name: str, params: dict, grad: list[float], state: str = "finished") -> Run:
    from torch.utils.tensorboard import SummaryWriter

    folder = sweep / name
    writer = SummaryWriter(str(folder))
    for step, value in enumerate(grad):
        writer.add_scalar(GRAD, value, step)
    writer.close()
    (folder / "status.json").write_text(json.dumps({"state": state}))
    return Run(0, name, folder, params, [])


def _runs(sweep: Path) -> list[Run]:
    main = {"temperature": 0.1, "top_k": None, "normalizer": "softmax", "optimizer": "adamw"}
    return [
        _run(sweep, "T0.1_kall_softmax_s0", {**main, "seed": 0}, [1.0, 2.0]),
        _run(sweep, "T0.1_kall_softmax_s1", {**main, "seed": 1}, [2.0, 3.0]),
        _run(sweep, "T0.1_kall_softmax_s2", {**main, "seed": 2}, [3.0, 7.0]),
        _run(sweep, "T1_kall_softmax_s0", {**main, "temperature": 1, "seed": 0}, [0.0]),  # one seed: no mean
        _run(sweep, "T1_kall_softmax_s1", {**main, "temperature": 1, "seed": 1}, [9.0], state="failed"),
        # another arm (SGD) at T = 0.1: never averaged into the main arm's mean
        _run(sweep, "T0.1_kall_softmax_s1_sgd", {**main, "seed": 1, "optimizer": "sgd"}, [100.0, 100.0]),
    ]


def test_the_mean_run_per_T_holds_the_main_arms_mean_and_band(tmp_path):
    runs = _runs(tmp_path)
    scalars = {run.name: read_scalars(run.dir) for run in runs}
    states = {run.name: json.loads((run.dir / "status.json").read_text())["state"] for run in runs}
    written = write_seed_means(tmp_path, runs, states, scalars)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [tags.seed_mean_run("T0.1")]
    acc = EventAccumulator(str(written[0]), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    series = {part: [(e.step, e.value) for e in acc.Scalars(tags.seed_mean(GRAD, part))] for part in tags.SEED_MEAN_PARTS}
    assert [step for step, _ in series["mean"]] == [0, 1]
    for step, values in ((0, [1.0, 2.0, 3.0]), (1, [2.0, 3.0, 7.0])):
        want = step_mean(values)
        assert [series[part][step][1] for part in tags.SEED_MEAN_PARTS] == pytest.approx(want, rel=1e-6)
    about = acc.Tensors(tags.SEED_MEAN_TEXT)[0].tensor_proto.string_val[0].decode()
    assert "3 seeds" in about and "sgd" not in about
    assert tags.SEED_MEAN_TEXT.split("/")[0] > tags.REPORT_SUMMARY.split("/")[0]  # the Text tab: after the report's
    # written again: replaced, not added to
    write_seed_means(tmp_path, runs, states, scalars)
    assert len(list(written[0].glob("events.out.tfevents.*"))) == 1


def test_the_means_category_comes_first_in_tensorboards_merged_layout(tmp_path):
    """TensorBoard's Custom Scalars plugin merges the layouts of every run in run-name order: the mean runs' folder
    sorts before the runs, so their category leads; its margin charts point at the mean runs' tags."""
    from torch.utils.tensorboard import SummaryWriter

    runs = _runs(tmp_path)
    for run in runs:  # each run's own layout, as TensorBoardLayout writes it
        writer = SummaryWriter(str(run.dir))
        writer.add_custom_scalars({"run summary": {"gradient": ["Multiline", [GRAD]]}})
        writer.close()
    scalars = {run.name: read_scalars(run.dir) for run in runs}
    write_seed_means(tmp_path, runs, dict.fromkeys(scalars, "finished"), scalars)
    layout = merged_layout(tmp_path)
    assert [c["title"] for c in layout["category"]] == [CATEGORY, "run summary"]
    margins = [chart["margin"]["series"][0] for chart in layout["category"][0]["chart"]]
    assert [m["value"] for m in margins] == [tags.seed_mean(tag, "mean") for tag in CHARTS]
    assert {m["lower"] for m in margins} == {tags.seed_mean(tag, "low") for tag in CHARTS}


def test_a_link_planted_at_the_mean_runs_is_replaced_not_followed(tmp_path):
    sweep, outside = tmp_path / "sweep", tmp_path / "outside"
    sweep.mkdir()
    outside.mkdir()
    runs = _runs(sweep)
    (sweep / tags.SEED_MEAN_RUN).symlink_to(outside, target_is_directory=True)
    scalars = {run.name: read_scalars(run.dir) for run in runs}
    written = write_seed_means(sweep, runs, dict.fromkeys(scalars, "finished"), scalars)
    assert list(outside.iterdir()) == []  # nothing written through the link
    root = sweep / tags.SEED_MEAN_RUN
    assert not root.is_symlink() and root.is_dir() and written and all(p.is_dir() for p in written)


def test_a_sweep_with_no_mean_to_draw_has_no_mean_runs_folder(tmp_path):
    """One seed per temperature: no mean run, and no empty folder that TensorBoard would list as a run; mean runs
    left by an earlier, larger state of the sweep are removed, not shown beside runs they no longer average."""
    runs = _runs(tmp_path)
    scalars = {run.name: read_scalars(run.dir) for run in runs}
    assert write_seed_means(tmp_path, runs, dict.fromkeys(scalars, "finished"), scalars)
    one_seed = [run for run in runs if run.params["seed"] == 0]
    assert write_seed_means(tmp_path, one_seed, dict.fromkeys(scalars, "finished"), scalars) == []
    assert not (tmp_path / tags.SEED_MEAN_RUN).exists()
