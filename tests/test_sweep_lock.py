"""Several sweep processes on one sweep folder: each run is trained by exactly one of them (a lock per run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from study.sweep import main
from study.sweep.lock import LOCK_FILE, RunBusy, RunLock, busy
from tests.test_sweep import ROOT, env, status, write_spec


def test_a_held_run_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        held = busy(run)
        assert isinstance(held, RunBusy) and held.holder["pid"] == os.getpid()
        assert f"pid {os.getpid()}" in str(held) and LOCK_FILE in str(held)
    assert busy(run) is None  # released on exit
    # a lock file left by a process that was killed (no live holder): taken over, the old holder reported
    (run / LOCK_FILE).write_text(json.dumps({"pid": 999999999, "host": "gone", "since": "then"}))
    lock = RunLock(run).acquire()
    assert lock.taken_over == {"pid": 999999999, "host": "gone", "since": "then"}
    lock.release()


def test_a_killed_holder_releases_its_run(tmp_path):
    run = tmp_path / "run"
    code = f"from study.sweep.lock import RunLock; RunLock({str(run)!r}).acquire(); print('held', flush=True); input()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    assert busy(run).holder["pid"] == proc.pid
    proc.kill()
    proc.wait()
    assert busy(run) is None


@pytest.mark.slow
def test_sweep_leaves_runs_held_by_another_process(tmp_path, capsys):
    spec = write_spec(
        tmp_path, {"seed": [0, 1]}, {"trainer.max_steps": 2, "trainer.val_check_interval": 2}, report=True
    )
    held_dir = tmp_path / "logs" / "tiny" / "T1_kall_softmax_s1"
    with RunLock(held_dir):
        assert main(["--config", str(spec), "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert status(tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0")["state"] == "finished"
    assert not (held_dir / "status.json").exists()  # not touched
    assert f"T1_kall_softmax_s1 is held by pid {os.getpid()}" in out
    assert f"then: study report {tmp_path / 'logs' / 'tiny'}" in out
    assert not (tmp_path / "logs" / "tiny" / "report").exists()


@pytest.mark.slow
def test_two_sweeps_at_once_train_each_run_once(tmp_path):
    spec = write_spec(
        tmp_path, {"seed": [0, 1, 2]}, {"trainer.max_steps": 4, "trainer.val_check_interval": 4}
    )
    cmd = [sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--no-estimate"]
    procs = [
        subprocess.Popen(
            cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    sweep = tmp_path / "logs" / "tiny"
    for seed in (0, 1, 2):
        run = sweep / f"T1_kall_softmax_s{seed}"
        st = status(run)
        assert st["state"] == "finished" and st["attempts"] == 1, outputs
        assert len(list(run.glob("events.out.tfevents.*"))) == 1
        assert not list((run / "checkpoints").glob("*-v1.ckpt"))  # no second writer
