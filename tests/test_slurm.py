"""scripts/slurm_sweep.sh end to end on a real single-node SLURM (slurm-wlm + munge), on CPU.

The test starts munged (unless one answers), slurmctld and slurmd as root with a slurm.conf for this machine,
submits a tiny sweep with the script (pretraining job, array of runs with 2 DDP tasks each, report job), waits
for the queue to empty and checks every run. It skips, saying why, where SLURM is not installed or not root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_sweep import ROOT, env, status, write_spec

DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "squeue")


def _why_not() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).is_file()]
    if missing:
        return f"SLURM is not installed (missing {missing}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the SLURM daemons are started as root, and this is not root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _conf(folder: Path) -> Path:
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    conf.write_text(
        "\n".join(
            [
                "ClusterName=study",
                f"SlurmctldHost={host}",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "SlurmUser=root",
                "AuthType=auth/munge",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "MpiDefault=none",
                "JobAcctGatherType=jobacct_gather/none",
                "ReturnToService=2",
                f"StateSaveLocation={folder / 'state'}",
                f"SlurmdSpoolDir={folder / 'spool'}",
                f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
                f"SlurmdPidFile={folder / 'slurmd.pid'}",
                f"SlurmctldLogFile={folder / 'slurmctld.log'}",
                f"SlurmdLogFile={folder / 'slurmd.log'}",
                f"NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            ]
        )
        + "\n"
    )
    return conf


def _stop(pid_file: Path) -> None:
    if pid_file.is_file():
        try:
            os.kill(int(pid_file.read_text().strip()), 15)
        except (ProcessLookupError, ValueError):
            pass


@pytest.fixture
def slurm(tmp_path_factory):
    reason = _why_not()
    if reason:
        print(f"test_slurm skipped: {reason}")
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    conf = _conf(folder)
    started_munged = subprocess.run([_exe("munge"), "-n"], capture_output=True).returncode != 0
    munge_pid = Path("/run/munge/munged.pid")
    if started_munged:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        subprocess.run([_exe("munged"), "--force"], check=True, capture_output=True)
    cluster_env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        subprocess.run([_exe("slurmctld"), "-f", str(conf)], env=cluster_env, check=True)
        subprocess.run([_exe("slurmd"), "-f", str(conf)], env=cluster_env, check=True)
        deadline = time.time() + 60
        while (
            "idle"
            not in subprocess.run(["sinfo", "-h"], env=cluster_env, capture_output=True, text=True).stdout
        ):
            assert time.time() < deadline, (folder / "slurmctld.log").read_text()[-2000:]
            time.sleep(1)
        yield cluster_env
    finally:
        _stop(folder / "slurmd.pid")
        _stop(folder / "slurmctld.pid")
        if started_munged:
            _stop(munge_pid)


@pytest.mark.slow
def test_slurm_sweep_script_end_to_end_on_cpu(slurm, tmp_path):
    spec = write_spec(
        tmp_path,
        {"temperature": [0.5, 1.0]},
        {"trainer.max_steps": 2, "trainer.val_check_interval": 2},
        pretrain={
            "overrides": {
                "trainer.max_steps": 2,
                "trainer.val_check_interval": 2,
                "model.warmup_steps": 1,  # within the 2 steps (a longer warm-up is refused up front)
                "model.n_layer": 1,
                "model.n_head": 2,
                "model.n_embd": 32,
                "data.max_train_blocks": 48,
                "data.max_val_blocks": 4,
                "data.cache_dir": str(ROOT / "logs" / "cache"),
            }
        },
    )
    run_env = {
        **env(),
        **slurm,
        "GPUS": "0",
        "TASKS": "2",
        "PARTITION": "",
        "TIME": "00:10:00",
        "STUDY": f"{sys.executable} -m study.cli",
    }
    submitted = subprocess.run(
        ["bash", str(ROOT / "scripts" / "slurm_sweep.sh"), str(spec)],
        env=run_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
    deadline = time.time() + 420
    while subprocess.run(["squeue", "-h"], env=slurm, capture_output=True, text=True).stdout.strip():
        assert time.time() < deadline, "jobs still queued after 7 minutes"
        time.sleep(2)
    outputs = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("slurm-*.out")))
    sweep = tmp_path / "logs" / "tiny"
    assert status(sweep / "pretrain")["state"] == "finished", outputs[-3000:]
    for name in ("T0.5_kall_softmax_s0", "T1_kall_softmax_s0"):
        st = status(sweep / name)
        assert st["state"] == "finished" and st["global_step"] == 2, outputs[-3000:]
    assert outputs.count("GLOBAL_RANK: 1, MEMBER: 2/2") == 3  # pretraining and both runs on 2 processes
    assert (sweep / "report" / "report.md").is_file(), outputs[-3000:]
