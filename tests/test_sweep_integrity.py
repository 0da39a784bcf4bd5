"""A sweep runs nothing it should not, mixes nothing and loses nothing: runs with no step fail, a status that
cannot be written does not stop the sweep, names stay inside save_dir, changed dependencies are refused."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from study.sweep import main
from study.sweep import run as sweep_run
from tests.test_sweep import status, write_spec


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"data.max_train_blocks": 3}, "ValueError: the training data gives no batch: 3 block(s)"),
        ({"trainer.limit_train_batches": 0}, "trained no step (max_steps=6, limit_train_batches=0)"),
    ],
)
def test_a_run_that_trains_no_step_is_failed_not_finished(tmp_path, overrides, reason):
    spec = write_spec(tmp_path, {"temperature": [1.0]}, overrides)
    assert main(["--config", str(spec), "--no-estimate"]) == 1
    st = status(tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0")
    assert st["state"] == "failed" and st["reason"].startswith(reason), st


def test_a_status_that_cannot_be_written_does_not_stop_the_sweep(tmp_path, monkeypatch, capsys):
    """A full disk: the atomic write fails, and the in-place fallback has no file to write into (the run's first
    status) or cannot write either; both used to raise out of the sweep."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    sweep_run.write_status(tmp_path / "run", {"name": "run", "state": "running"})
    assert not (tmp_path / "run" / "status.json").exists()
    err = capsys.readouterr().err
    assert err.startswith("study sweep: could not record run as running (OSError: [Errno 28] No space left on "
                          "device; in place: FileNotFoundError") and err.rstrip().endswith("going on")
    # with a status there, the compact record is written in place
    monkeypatch.undo()
    (tmp_path / "run" / "status.json").write_text(json.dumps({"name": "run", "state": "running", "args": ["x"] * 50}))
    monkeypatch.setattr(Path, "write_text", full)
    sweep_run.write_status(tmp_path / "run", {"name": "run", "state": "failed", "reason": "disk full"})
    assert status(tmp_path / "run")["state"] == "failed" and capsys.readouterr().err == ""


@pytest.mark.parametrize("name", ["../../escape", "..", "a/b", "/tmp/abs-sweep-i23", "a\\b"])
def test_a_sweep_name_that_is_not_one_folder_is_refused_before_any_write(tmp_path, name, capsys):
    work = tmp_path / "work"
    work.mkdir()
    spec = write_spec(work, {"temperature": [1.0]}, name=name)
    before = sorted(p for p in tmp_path.rglob("*"))
    assert main(["--config", str(spec), "--dry-run"]) == 2
    assert sorted(p for p in tmp_path.rglob("*")) == before and not Path("/tmp/abs-sweep-i23").exists()
    err = capsys.readouterr().err
    assert f"sweep name {name!r} is not a plain folder name" in err


def test_a_run_name_that_is_not_one_folder_is_refused(tmp_path, monkeypatch):
    from study.sweep import axes
    from study.sweep.spec import SweepSpecError, build_plan

    monkeypatch.setattr(axes, "run_name", lambda params, swept=frozenset(): "../outside")
    with pytest.raises(SweepSpecError, match="run name '../outside' is not a plain folder name"):
        build_plan(write_spec(tmp_path, {"temperature": [1.0]}))
