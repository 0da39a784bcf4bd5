"""Acceptance: kill -9 a tiny sweep at random points (pretraining, fine-tuning, checkpoint writes, the report),
rerun until it completes; it ends as an uninterrupted sweep does: every run finished, one value per step in
TensorBoard, the same losses and the same final weights."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest
import torch

from study import tags
from study.report.read import read_scalars
from study.sweep import main
from tests.test_sweep import ROOT, env, status, write_spec

# Subprocesses and whole sweeps: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow

STEPS = 6
PRETRAIN = {
    "trainer.max_steps": STEPS,
    "model.warmup_steps": 1,  # within the steps (a longer warm-up is refused up front)
    "trainer.val_check_interval": STEPS,
    "trainer.check_val_every_n_epoch": None,
    "trainer.limit_val_batches": 1,
    "trainer.log_every_n_steps": 1,
    "trainer.enable_progress_bar": False,
    "model.n_layer": 1,
    "model.n_head": 2,
    "model.n_embd": 32,
    "data.batch_size": 4,
    "data.max_train_blocks": 12,  # 3 batches an epoch: the kills land mid-epoch and across epochs
    "data.max_val_blocks": 4,
    "data.cache_dir": str(ROOT / "logs" / "cache"),
}


def make_spec(folder):
    folder.mkdir()
    return write_spec(
        folder,
        {"temperature": [0.5, 1.0]},
        {
            "trainer.max_steps": STEPS,
            "trainer.val_check_interval": STEPS,
            "trainer.check_val_every_n_epoch": None,
            "data.max_train_blocks": 12,
        },
        pretrain={"overrides": PRETRAIN},
        report=True,
    )


def test_kill_9_at_random_points_then_rerun_until_done(tmp_path):
    reference = make_spec(tmp_path / "reference")
    assert main(["--config", str(reference), "--no-estimate"]) == 0
    spec = make_spec(tmp_path / "killed")
    cmd = [sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--no-estimate"]
    rng, kills = random.Random(2026), []
    for _ in range(12):
        proc = subprocess.Popen(
            cmd,
            env=env(),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        delay = rng.uniform(4.0, 11.0) if len(kills) < 5 else None  # startup takes about 4 s
        try:
            code = proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the sweep and anything it started
            proc.wait()
            kills.append(round(delay, 1))
            continue
        assert code == 0, f"a rerun failed (kills at {kills} s)"
        break
    else:
        pytest.fail(f"the sweep did not complete (kills at {kills} s)")
    ref_dir, got_dir = tmp_path / "reference" / "logs" / "tiny", tmp_path / "killed" / "logs" / "tiny"
    assert (got_dir / "report" / "report.md").is_file()
    for name in ("pretrain", "T0.5_kall_softmax_s0", "T1_kall_softmax_s0"):
        assert status(got_dir / name)["state"] == "finished", (name, kills)
        loss = tags.pretrain(tags.TRAIN_LOSS) if name == "pretrain" else tags.TRAIN_LOSS
        got, ref = read_scalars(got_dir / name)[loss], read_scalars(ref_dir / name)[loss]
        assert [s for s, _ in got] == list(range(STEPS)), (name, kills)
        assert [v for _, v in got] == pytest.approx([v for _, v in ref], abs=1e-5), (name, kills)
        got_w = torch.load(got_dir / name / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
        ref_w = torch.load(ref_dir / name / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
        for key in ref_w:
            torch.testing.assert_close(got_w[key], ref_w[key], rtol=0, atol=1e-6, msg=f"{name} {key} {kills}")
    print(f"killed at {kills} s")
