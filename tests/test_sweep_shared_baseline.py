"""The step-0 validation of a setting, copied into its runs that did not measure it: TensorBoard draws it, labelled as
shared, the report's reader leaves it out (the report shares it once per setting itself)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from study import tags
from study.report.read import read_scalars
from study.sweep.config import Run
from study.sweep.shared_baseline import SHARED_FILE, share_step0_validation

PRETRAINED = {"model": {"model_name_or_path": "smollm2-135m"}}
STEP0 = {tags.VAL_LOSS: 4.0, tags.LEADING[tags.VAL_LOSS]: 4.0, tags.LOG10[tags.VAL_PPL]: 1.737}


def _run(sweep: Path, name: str, seed: int, val_step0: bool, temperature: float = 0.1, resolved=None,
         optimizer: str = "adamw") -> Run:  # fmt: skip
    """A finished run folder as a sweep leaves it: train/loss at steps 0..2, validation at the end (step 3), and the
    step-0 validation only where ``val_step0``."""
    from torch.utils.tensorboard import SummaryWriter

    folder = sweep / name
    writer = SummaryWriter(str(folder))
    for step in range(3):
        writer.add_scalar(tags.TRAIN_LOSS, 5.0 - step, step)
    if val_step0:
        for tag, value in STEP0.items():
            writer.add_scalar(tag, value, 0)
    for tag, value in STEP0.items():
        writer.add_scalar(tag, value / 2 + seed, 3)
    writer.close()
    (folder / "status.json").write_text(json.dumps({"state": "finished"}))
    params = {"temperature": temperature, "top_k": None, "normalizer": "softmax", "seed": seed, "optimizer": optimizer}
    return Run(0, name, folder, params, [], resolved if resolved is not None else PRETRAINED)


def _as_tensorboard_reads(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, pytest.approx(e.value, rel=1e-6)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_every_seed_draws_the_shared_step0_point_and_the_report_reads_only_what_it_measured(tmp_path):
    runs = [_run(tmp_path, "T0.1_kall_softmax_s0", 0, True), _run(tmp_path, "T0.1_kall_softmax_s1", 1, False),
            _run(tmp_path, "T0.1_kall_softmax_s1_sgd", 1, False, optimizer="sgd"),
            _run(tmp_path, "T1_kall_softmax_s1", 1, False, temperature=1.0)]  # fmt: skip
    before = {run.name: read_scalars(run.dir) for run in runs}
    states = dict.fromkeys(before, "finished")
    shared = share_step0_validation(runs, states, before)
    # the other seed and the other optimizer of T = 0.1 borrow from seed 0; T = 1 has no run that measured it
    assert shared == {"T0.1_kall_softmax_s1": "T0.1_kall_softmax_s0", "T0.1_kall_softmax_s1_sgd": "T0.1_kall_softmax_s0"}
    for name in shared:
        drawn = _as_tensorboard_reads(tmp_path / name)
        for tag, value in STEP0.items():  # the step-0 point, and the run's own final value kept after it
            assert drawn[tag] == [(0, pytest.approx(value)), (3, pytest.approx(value / 2 + 1))], (name, tag)
        acc = EventAccumulator(str(tmp_path / name)).Reload()
        (text,) = acc.Tensors(tags.SHARED_BASELINE)
        assert "**shared**" in text.tensor_proto.string_val[0].decode() and "T0.1_kall_softmax_s0" in (
            text.tensor_proto.string_val[0].decode())
        assert read_scalars(tmp_path / name) == before[name]  # the report reads the run's own measurement only
    assert not (tmp_path / "T1_kall_softmax_s1" / SHARED_FILE).exists()
    # again: the earlier copies are replaced, not added to
    assert share_step0_validation(runs, states, before) == shared
    assert sorted(p.name for p in (tmp_path / "T0.1_kall_softmax_s1").iterdir()).count(SHARED_FILE) == 1
    assert _as_tensorboard_reads(tmp_path / "T0.1_kall_softmax_s1")[tags.VAL_LOSS][0] == (0, pytest.approx(4.0))


def test_a_run_from_scratch_or_without_a_result_neither_lends_nor_borrows(tmp_path):
    scratch = {"model": {"model_name_or_path": None}}
    runs = [_run(tmp_path, "T0.1_kall_softmax_s0", 0, True, resolved=scratch),
            _run(tmp_path, "T0.1_kall_softmax_s1", 1, False, resolved=scratch)]  # fmt: skip
    scalars = {run.name: read_scalars(run.dir) for run in runs}
    assert share_step0_validation(runs, dict.fromkeys(scalars, "finished"), scalars) == {}  # its seed sets step 0
    runs = [_run(tmp_path / "b", "T0.1_kall_softmax_s0", 0, True), _run(tmp_path / "b", "T0.1_kall_softmax_s1", 1, False)]
    scalars = {run.name: read_scalars(run.dir) for run in runs}
    assert share_step0_validation(runs, {"T0.1_kall_softmax_s0": "finished", "T0.1_kall_softmax_s1": "failed"},
                                  scalars) == {}  # fmt: skip


def test_the_copy_is_read_before_the_runs_own_file(tmp_path):
    """Why the copy's file name sorts first: TensorBoard reads a run's files in name order and keeps the points in
    the order read. Planted: the same copy under a later name puts step 0 after the run's last step."""
    runs = [_run(tmp_path, "T0.1_kall_softmax_s0", 0, True), _run(tmp_path, "T0.1_kall_softmax_s1", 1, False)]
    scalars = {run.name: read_scalars(run.dir) for run in runs}
    share_step0_validation(runs, dict.fromkeys(scalars, "finished"), scalars)
    folder = tmp_path / "T0.1_kall_softmax_s1"
    late = folder / "events.out.tfevents.9999999999.late"
    os.replace(folder / SHARED_FILE, late)
    assert [step for step, _ in _as_tensorboard_reads(folder)[tags.VAL_LOSS]] == [3, 0]


def test_a_link_left_where_the_copy_is_written_is_removed_not_followed(tmp_path):
    sweep, outside = tmp_path / "sweep", tmp_path / "outside"
    sweep.mkdir()
    outside.mkdir()
    runs = [_run(sweep, "T0.1_kall_softmax_s0", 0, True), _run(sweep, "T0.1_kall_softmax_s1", 1, False)]
    planted = runs[1].dir / ".shared_baseline.0123456789abcdef.tmp"
    planted.symlink_to(outside, target_is_directory=True)
    before = {run.name: read_scalars(run.dir) for run in runs}
    assert share_step0_validation(runs, dict.fromkeys(before, "finished"), before) == {
        "T0.1_kall_softmax_s1": "T0.1_kall_softmax_s0"}
    assert list(outside.iterdir()) == [] and not os.path.lexists(planted)
    assert (runs[1].dir / SHARED_FILE).is_file()
    assert [p.name for p in runs[1].dir.iterdir() if p.name.startswith(".shared_baseline")] == []
