"""`study sweep --workers N`: worker processes that each train runs one after another, against one process per run
(`--parallel`): the same runs, the same values, each run trained once; and the options it does not combine with."""

from __future__ import annotations

import json

import pytest

from study.report.read import read_scalars
from study.sweep import main
from tests.test_sweep import write_spec

GRID = {"temperature": [0.1, 1.0], "seed": [0, 1]}


@pytest.mark.slow
def test_workers_train_each_run_once_with_the_values_of_one_process_per_run(tmp_path, capsys):
    (tmp_path / "workers").mkdir()
    (tmp_path / "pool").mkdir()
    spec = write_spec(tmp_path / "workers", GRID)
    assert main(["--config", str(spec), "--workers", "2", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert "2 worker processes" in out and "[4/4]" in out
    reference = write_spec(tmp_path / "pool", GRID)
    assert main(["--config", str(reference), "--parallel", "2", "--no-estimate"]) == 0
    by_workers, by_pool = tmp_path / "workers" / "logs" / "tiny", tmp_path / "pool" / "logs" / "tiny"
    names = sorted(p.name for p in by_pool.iterdir() if (p / "status.json").is_file())
    assert len(names) == 4
    for name in names:
        status = json.loads((by_workers / name / "status.json").read_text())
        assert status["state"] == "finished" and status["attempts"] == 1  # trained once, by one worker
        ours, theirs = read_scalars(by_workers / name), read_scalars(by_pool / name)
        for tag in ("train/loss", "val/loss", "grad_norm/total"):
            if tag in theirs:
                assert ours[tag] == theirs[tag], (name, tag)  # bit for bit: one run's state never leaks into the next
    logs = sorted(p.name for p in (by_workers / "workers").iterdir())
    assert logs == ["worker-0.log", "worker-1.log"]


@pytest.mark.parametrize("extra", [["--parallel", "2"], ["--run-index", "0"], ["--workers", "0"]],
                         ids=["parallel", "run-index", "zero"])
def test_workers_refuse_what_needs_one_process_per_run(tmp_path, capsys, extra):
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    argv = ["--config", str(spec), *(["--workers", "2"] if extra[0] != "--workers" else []), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--workers" in err
    assert not (tmp_path / "logs" / "tiny").exists()  # refused before any run or plan was written


def test_a_run_whose_attention_spec_is_refused_stops_the_sweep_before_any_run(tmp_path, capsys):
    # each axis value is valid alone; together (uniform at T = 0.1) the spec refuses them: before the plan is written
    spec = write_spec(tmp_path, {"normalizer": ["uniform"], "temperature": [0.1, 1.0]})
    assert main(["--config", str(spec), "--dry-run"]) == 2
    assert "temperature=0.1 has no effect with normalizer 'uniform'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_signal_to_the_sweep_stops_the_workers_and_every_run_they_held_is_recorded(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.test_sweep import ROOT, env

    spec = write_spec(tmp_path, GRID, {"trainer.max_steps": 200, "trainer.val_check_interval": 200})
    proc = subprocess.Popen([sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--workers", "2",
                             "--no-estimate"], cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    sweep = tmp_path / "logs" / "tiny"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(sweep.glob("*/status.json")):
        time.sleep(0.2)  # a worker has taken its first run (before or during its fit)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopped the 2 workers (SIGTERM)" in out
    states = {p.parent.name: json.loads(p.read_text())["state"] for p in sweep.glob("*/status.json")}
    assert states and "running" not in states.values(), states  # every run a worker held says how it ended
