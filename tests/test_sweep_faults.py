"""Every way a run ends leaves status.json saying so; a damaged checkpoint is set aside; reruns finish the run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from study.report.read import read_scalars
from tests.test_sweep import ROOT, env, status, write_spec

# Subprocesses and whole sweeps: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow


def sweep(spec, faults: bool) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--no-estimate"]
    extra = {"STUDY_FAULTS": "1"} if faults else {}
    return subprocess.run(cmd, env={**env(), **extra}, cwd=ROOT, capture_output=True, text=True, timeout=300)


def one_run_spec(tmp_path, fault: dict):
    return write_spec(
        tmp_path,
        {"temperature": [0.5]},
        {"trainer.max_steps": 6, "trainer.val_check_interval": 6},
        callbacks=[fault],
    )


def test_ctrl_c_is_recorded_and_a_truncated_checkpoint_is_set_aside(tmp_path):
    spec = one_run_spec(
        tmp_path, {"class_path": "tests.faults.KillAtStep", "init_args": {"step": 3, "signal": "SIGINT"}}
    )
    run = tmp_path / "logs" / "tiny" / "T0.5_kall_softmax_s0"
    first = sweep(spec, faults=True)
    assert first.returncode != 0
    st = status(run)
    assert st["state"] == "failed" and "interrupted: KeyboardInterrupt" in st["reason"], st
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # a write cut short
    second = sweep(spec, faults=False)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    st = status(run)
    assert st["state"] == "finished" and st["global_step"] == 6 and st["attempts"] == 2
    assert any("last.ckpt does not load: renamed last.ckpt.corrupt" in n for n in st["notes"]), st["notes"]
    assert st["notes"][-1] == "no readable checkpoint: starting over" and st["resumed_from_step"] is None
    assert (run / "checkpoints" / "last.ckpt.corrupt").is_file()
    # the first attempt's steps were purged: each step once
    steps = [s for s, _ in read_scalars(run)["train/loss"]]
    assert steps == list(range(6))


def test_a_full_disk_is_recorded_and_the_rerun_resumes(tmp_path):
    spec = one_run_spec(
        tmp_path, {"class_path": "tests.faults.FileSizeLimitAtStep", "init_args": {"step": 3}}
    )
    run = tmp_path / "logs" / "tiny" / "T0.5_kall_softmax_s0"
    first = sweep(spec, faults=True)
    assert first.returncode != 0
    st = status(run)
    assert st["state"] == "failed" and "Errno 27" in st["reason"], st  # EFBIG, as ENOSPC on a full disk
    assert "args" not in st  # the full status could not be written: the compact one was, in place
    second = sweep(spec, faults=False)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    st = status(run)
    assert st["state"] == "finished" and st["global_step"] == 6
    assert st["resumed_from_step"] == 2  # the last checkpoint written before the disk filled


def test_sigterm_is_recorded(tmp_path):
    spec = one_run_spec(
        tmp_path, {"class_path": "tests.faults.KillAtStep", "init_args": {"step": 3, "signal": "SIGTERM"}}
    )
    first = sweep(spec, faults=True)
    assert first.returncode != 0
    st = status(tmp_path / "logs" / "tiny" / "T0.5_kall_softmax_s0")
    assert st["state"] == "failed" and st["reason"].startswith("interrupted: SIGTERM"), st


def test_a_disk_that_stays_full_fails_each_run_and_the_sweep_ends_with_its_closing_line(tmp_path):
    """From step 3 of the first run on no file may grow past 1 byte (as on a full disk), for the rest of the
    sweep: every run fails, none stops the sweep, and the closing line still comes (it used to end with [Errno 28]
    from a message written to a run's log on that disk)."""
    spec = write_spec(
        tmp_path, {"temperature": [0.5, 1.0, 2.0]}, {"trainer.max_steps": 6, "trainer.val_check_interval": 6},
        callbacks=[{"class_path": "tests.faults.FileSizeLimitAtStep", "init_args": {"step": 3, "limit": 1}}],
    )
    done = sweep(spec, faults=True)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("[")] == [
        "[1/3] T0.5_kall_softmax_s0", "[2/3] T1_kall_softmax_s0", "[3/3] T2_kall_softmax_s0"]
    assert lines[-1].startswith("study sweep tiny: ") and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "finished" not in lines[-1]  # nothing could be recorded: each run is redone by the next sweep


def test_sigterm_to_the_parallel_parent_stops_and_records_its_runs(tmp_path):
    """The parent used to die at once and print nothing, its two runs training on as orphans holding their locks."""
    import json
    import signal
    import time

    from study.sweep.lock import busy

    spec = write_spec(tmp_path, {"temperature": [0.5, 1.0]},
                      {"trainer.max_steps": 100000, "trainer.val_check_interval": 6})
    cmd = [sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--no-estimate", "--parallel", "2"]
    parent = subprocess.Popen(cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = [tmp_path / "logs" / "tiny" / name for name in ("T0.5_kall_softmax_s0", "T1_kall_softmax_s0")]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not all((r / "checkpoints").is_dir() for r in runs):  # both training
        assert parent.poll() is None, parent.communicate()
        time.sleep(0.5)
    holders = [json.loads((r / "run.lock").read_text())["pid"] for r in runs]
    parent.send_signal(signal.SIGTERM)
    out, err = parent.communicate(timeout=180)
    assert parent.returncode == 128 + 15, out[-2000:] + err[-2000:]
    assert [line for line in out.splitlines() if line.startswith("study sweep: stopped")] == [
        "study sweep: stopped by SIGTERM; 2 running job(s) stopped and recorded (T0.5_kall_softmax_s0, "
        "T1_kall_softmax_s0); rerun the same command to resume"]
    for run, pid in zip(runs, holders):
        assert busy(run) is None  # its lock released: no process of it is left
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pass
        else:
            raise AssertionError(f"run process {pid} of {run.name} still running")
        st = status(run)
        assert st["state"] == "failed" and st["reason"].startswith("interrupted"), st
