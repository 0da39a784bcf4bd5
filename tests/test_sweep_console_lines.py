"""The sweep's console lines that need no run: the heartbeat that gives the first ETA before the first run ends, and
the closing line's account of diverged runs (the planned arms apart from the main arm) with the TensorBoard command.
"""

from __future__ import annotations

import time
from pathlib import Path

from study.sweep.command import divergences
from study.sweep.config import Plan, Run
from study.sweep.pool import SweepProgress
from tests.test_sweep_view import _demo_shaped_runs


def _demo_plan() -> Plan:
    runs = [Run(i, name, Path("logs/default") / name, params, []) for i, (name, params) in enumerate(_demo_shaped_runs())]
    return Plan("default", Path("configs/sweeps/default.yaml"), Path("logs/default"), Path("configs/smollm2.yaml"),
                runs, None, True, False)


def test_the_closing_line_tells_the_planned_arms_divergences_from_the_main_arms():
    plan = _demo_plan()
    names = [run.name for run in plan.runs]
    states = ["finished"] * len(names)
    assert divergences(plan, states) == ""
    sgd = [i for i, n in enumerate(names) if n.startswith("T0.01_") and n.endswith("_sgd")]
    for i in sgd:
        states[i] = "diverged"
    assert divergences(plan, states) == (
        "; diverged: 2 in the arms beside the main grid (T0.01_kall_softmax_s1_lr0.01_sgd, "
        "T0.01_kall_softmax_s1_lr1_sgd), none in the main arm")
    states[names.index("T0.01_kall_softmax_s2")] = "diverged"  # a main-arm run: named apart, not planned
    assert divergences(plan, states).endswith("1 in the main arm, not planned (T0.01_kall_softmax_s2)")
    states = ["finished"] * len(names)
    states[names.index("T0.03_kall_softmax_s0")] = "diverged"
    assert divergences(plan, states) == "; diverged: 1 in the main arm, not planned (T0.03_kall_softmax_s0)"


def test_a_heartbeat_gives_the_eta_before_the_first_run_ends(capsys):
    progress = SweepProgress(26, 2, estimate_s=1200.0, heartbeat_s=60.0)
    assert progress.heartbeat(["probe", "analyze"]) is None  # nothing is late yet
    progress.start = progress.last_line = time.perf_counter() - 300.0  # five minutes in, no run ended
    line = progress.heartbeat(["probe", "T0.01_kall_softmax_s0"])
    assert line is not None and line.startswith("[0/26] in flight: probe, T0.01_kall_softmax_s0 | elapsed 5:0")
    assert line.endswith("| ETA 15:00") or line.endswith("| ETA 14:59")  # the estimate less the 5 minutes used
    assert capsys.readouterr().out.strip() == line
    assert progress.heartbeat(["probe"]) is None  # one a minute at most
    progress.last_line -= 61.0
    assert progress.heartbeat([]) is None  # nothing in flight: nothing to report
    # after a run ends, its line resets the clock, and the ETA is the runs' own rate
    progress.update(Run(0, "T0.01_kall_softmax_s0", None, {}, []), {"state": "finished", "duration_s": 50.0}, slot_s=60.0)
    progress.last_line -= 61.0
    assert progress.heartbeat(["T0.01_kall_softmax_s1"]).endswith("| ETA 12:30")  # 60 s a slot x 25 left / 2 slots
    # an estimate spent before any run ended is said, not shown as 0:00
    late = SweepProgress(4, 1, estimate_s=60.0, heartbeat_s=1.0)
    late.start = late.last_line = time.perf_counter() - 120.0
    assert late.heartbeat(["T1_kall_softmax_s0"]).endswith("| ETA: past the estimate")
    unknown = SweepProgress(4, 1, None, heartbeat_s=1.0)
    unknown.last_line -= 2.0
    assert "ETA" not in unknown.heartbeat(["T1_kall_softmax_s0"])
