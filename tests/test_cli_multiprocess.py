"""`study fit` on 2 CPU processes from the command line: Lightning's DDP launcher and torchrun.

Lightning starts rank 1 by re-executing this process's command line, so these run the real `study` entry point
as a subprocess (inside pytest, rank 1 would re-run pytest). Both ranks must train: rank 1 reports itself, and the
run ends with `max_steps` done and a checkpoint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_cli import fit_args

# Subprocesses and whole sweeps: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DDP = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]


def env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }


def study_command() -> list[str]:
    """The installed `study` console script next to this interpreter (the entry point users type)."""
    script = Path(sys.executable).parent / "study"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "study.cli"]


def assert_both_ranks_trained(result: subprocess.CompletedProcess, run: Path) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in output, output[-3000:]
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2


def test_study_fit_ddp_on_two_cpu_processes(text_files, tmp_path):
    args = fit_args(text_files, tmp_path, *DDP, "--trainer.logger.init_args.version=ddp")
    result = subprocess.run(
        [*study_command(), *args], env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert_both_ranks_trained(result, tmp_path / "logs" / "default" / "ddp")


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun"
)
def test_study_fit_under_torchrun(text_files, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    args = fit_args(text_files, tmp_path, *DDP, "--trainer.logger.init_args.version=torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node=2", "-m", "study.cli", *args]
    result = subprocess.run(cmd, env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert_both_ranks_trained(result, tmp_path / "logs" / "default" / "torchrun")
