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
    assert any(name.startswith("base config ") for name in st["depends"])  # what the run trained with


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


def _fake_finished(sweep_dir: Path, index: int) -> dict:
    """Mark run `index` of the plan.json a `--dry-run` wrote as finished, as a sweep records it."""
    entry = json.loads((sweep_dir / "plan.json").read_text())["runs"][index]
    run = sweep_dir / entry["name"]
    run.mkdir(parents=True, exist_ok=True)
    status = {"name": entry["name"], "state": "finished", "fingerprint": entry["fingerprint"], "depends": entry["depends"]}
    (run / "status.json").write_text(json.dumps(status))
    return entry


def test_an_edited_base_config_is_refused_not_pooled(tmp_path, capsys):
    """Editing learning_rate in the base YAML and adding a seed trained the new run at the new rate and pooled it
    with the old one as two seeds of one setting."""
    from tests.test_sweep import ROOT

    base = tmp_path / "base.yaml"
    base.write_text((ROOT / "configs" / "default.yaml").read_text())
    spec = write_spec(tmp_path, {"seed": [0]}, base=str(base))
    assert main(["--config", str(spec), "--dry-run"]) == 0
    entry = _fake_finished(tmp_path / "logs" / "tiny", 0)
    assert entry["depends"][f"base config {base}"].startswith("sha256 ")
    assert "data: the embedded corpus" in entry["depends"]
    base.write_text(base.read_text().replace("learning_rate: ", "learning_rate: 2.0e-3 # was "))
    spec = write_spec(tmp_path, {"seed": [0, 1]}, base=str(base))
    capsys.readouterr()
    assert main(["--config", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"run {entry['name']} was trained with other inputs than this sweep would use now: base config {base} " \
           "changed (sha256 " in err and "never pooled" in err
    assert len(json.loads((tmp_path / "logs" / "tiny" / "plan.json").read_text())["runs"]) == 1  # not rewritten


def test_a_changed_data_file_is_refused_by_name(tmp_path, text_files, capsys):
    train, val = text_files
    overrides = {"data.source": "files", "data.train_files": [train], "data.val_files": [val], "data.vocab_size": 300}
    spec = write_spec(tmp_path, {"temperature": [1.0]}, overrides)
    assert main(["--config", str(spec), "--dry-run"]) == 0
    _fake_finished(tmp_path / "logs" / "tiny", 0)
    assert main(["--config", str(spec), "--dry-run"]) == 0  # unchanged: accepted
    Path(train).write_text(Path(train).read_text() + "one more line\n")
    capsys.readouterr()
    assert main(["--config", str(spec), "--dry-run"]) == 2
    assert f"file {train} (data.train_files[0]) changed (sha256 " in capsys.readouterr().err
