"""The launch scripts: torchrun on 2 CPU processes for real; the SLURM script's job options with a stand-in sbatch."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_sweep import ROOT, env, status, write_spec

# Subprocesses and whole sweeps: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


@pytest.mark.skipif(shutil.which("torchrun", path=str(BIN)) is None, reason="no torchrun next to python")
def test_torchrun_sweep_script_runs_one_run_on_two_processes(tmp_path):
    spec = write_spec(
        tmp_path, {"temperature": [1.0]}, {"trainer.max_steps": 2, "trainer.val_check_interval": 2}
    )
    path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "torchrun_sweep.sh"),
            str(spec),
            "0",
            "2",
            "--trainer.accelerator=cpu",
        ],
        env={**env(), "PATH": path},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr
    assert status(tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0")["state"] == "finished"


def fake_sbatch(folder: Path) -> Path:
    """An `sbatch` that records its arguments (one line per call) and answers job ids 101, 102, ..."""
    script = folder / "sbatch"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'n=$(wc -l < {folder}/calls 2>/dev/null || echo 0); echo "$*" >> {folder}/calls; echo $((101 + n))\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder / "calls"


@pytest.mark.parametrize("gpus", ["0", "4"])
def test_slurm_script_options(tmp_path, gpus):
    spec = write_spec(tmp_path, {"temperature": [0.5, 1.0], "seed": [0, 1]})
    calls = fake_sbatch(tmp_path)
    study = f"{sys.executable} -m study.cli"
    extra = {"GPUS": gpus, "PARTITION": "", "SBATCH_OPTS": "--account=abc --qos=low", "STUDY": study}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "slurm_sweep.sh"), str(spec)],
        env={**env(), **extra, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    pretrain, array, report = calls.read_text().splitlines()
    for line in (pretrain, array, report):
        assert "--account=abc --qos=low" in line and "--partition" not in line
    assert ("--gres" in array) == (gpus != "0") and "--gres" not in report
    tasks = "1" if gpus == "0" else gpus
    accelerator = "cpu" if gpus == "0" else "gpu"
    assert (
        f"--ntasks-per-node={tasks}" in array
        and "--array=0-3" in array
        and "--dependency=afterany:101" in array
    )
    assert f"--trainer.accelerator={accelerator} --trainer.devices={tasks} --trainer.strategy=ddp" in array
    assert report.endswith(f"study.cli report {tmp_path / 'logs' / 'tiny'}") and "afterany:102" in report
    assert f"the report 103 -> {tmp_path / 'logs' / 'tiny'}" in result.stdout


def test_slurm_script_quotes_paths_in_its_wrapped_commands(tmp_path):
    """`--wrap` is a shell string: a sweep path with a space and a `;` used to split into two commands."""
    folder = tmp_path / "my sweeps; touch pwned"
    folder.mkdir()
    spec = write_spec(folder, {"temperature": [1.0]}, {"trainer.val_check_interval": 2})
    calls = tmp_path / "calls"
    calls.mkdir()
    sbatch = tmp_path / "sbatch"  # records each call's arguments NUL-separated, answers job ids 101, 102, ...
    sbatch.write_text(
        "#!/usr/bin/env bash\n"
        f'n=$(ls {calls} | wc -l); printf "%s\\0" "$@" > {calls}/$n; echo $((101 + n))\n'
    )
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    srun = tmp_path / "srun"  # prints the command it would start, one argument a line
    srun.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    study = f"{sys.executable} -m study.cli"
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "slurm_sweep.sh"), str(spec), "--trainer.max_steps=2"],
        env={**env(), "GPUS": "0", "PARTITION": "", "STUDY": study, "PATH": path},
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    wraps = []
    for n in range(3):
        args = (calls / str(n)).read_text().split("\0")
        wraps.append(args[args.index("--wrap") + 1])
    ran = subprocess.run(["bash", "-c", wraps[0].replace(" || true", "")], env={**env(), "PATH": path},
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    argv = ran.stdout.splitlines()
    assert argv[argv.index("--config") + 1] == str(spec) and argv[-3:] == ["--trainer.max_steps=2", "--run-index",
                                                                           "pretrain"]
    assert wraps[2] == f"{study} report " + str(folder / "logs" / "tiny").replace(" ", "\\ ").replace(";", "\\;")
    assert not (tmp_path / "pwned").exists()
