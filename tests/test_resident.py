"""`study.resident`: the peak resident memory of a fresh process, against allocations of known size."""

from __future__ import annotations

import os
import sys

import pytest

from study.resident import ChildFailed, command_peak, in_fresh_process

MB = 2**20


def test_a_commands_peak_is_its_own_and_follows_what_it_allocated(tmp_path):
    ballast = bytearray(400 * MB)  # this process is larger than either child: neither may report its size
    script = tmp_path / "allocate.py"
    script.write_text("import sys\nx = bytearray(int(sys.argv[1]) * 2**20)\nprint('allocated')\nsys.exit(int(sys.argv[2]))\n")
    sys.path.insert(0, str(tmp_path))
    try:
        small = command_peak("allocate", ["20", "0"], tmp_path / "small.log", env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        large = command_peak("allocate", ["300", "3"], tmp_path / "large.log", env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    finally:
        sys.path.remove(str(tmp_path))
    assert small["returncode"] == 0 and large["returncode"] == 3  # the exit code, and the peak even on failure
    assert small["max_rss_bytes"] < 100 * MB < len(ballast)
    assert 270 * MB < large["max_rss_bytes"] - small["max_rss_bytes"] < 330 * MB
    assert "allocated" in (tmp_path / "large.log").read_text()


def allocate(megabytes: int) -> int:
    import torch

    return int(torch.ones(megabytes * MB // 4).sum())


def fail() -> None:
    raise ValueError("the measured function failed")


@pytest.mark.slow
def test_a_function_in_a_fresh_process_reports_its_peak_above_the_imports():
    result, resident = in_fresh_process(allocate, 300)
    assert result == 300 * MB // 4
    assert 280 * MB < resident["max_rss_bytes"] - resident["base_rss_bytes"] < 400 * MB
    with pytest.raises(ChildFailed, match="the measured function failed"):
        in_fresh_process(fail)


def test_the_sweep_console_names_each_runs_peak_resident_memory():
    from types import SimpleNamespace

    from study.sweep.pool import SweepProgress

    progress = SweepProgress(total=2)
    run = SimpleNamespace(name="T0.1_s0")
    line = progress.update(run, {"state": "finished", "duration_s": 61.0, "global_step": 14, "max_rss_bytes": 2.21e9})
    assert "(step 14; peak 2.2 GB)" in line
    assert "peak" not in progress.update(run, {"state": "finished", "max_rss_bytes": 2.21e9}, skipped=True)
