"""The sweep's up-front estimate: the probe and the analysis timed by their own `--estimate`, scheduled with the runs
as the pool runs them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from study.sweep import estimate


def test_makespan_starts_each_job_in_the_first_free_slot():
    assert estimate.makespan([10.0, 3.0, 3.0, 3.0], 2) == 10.0  # one slot runs the long job, the other the rest
    assert estimate.makespan([3.0, 3.0, 3.0, 10.0], 2) == 13.0  # the long job last starts at 3 s, in the slot free first
    assert estimate.makespan([10.0, 3.0, 3.0, 3.0], 1) == 19.0
    assert estimate.makespan([], 2) == 0.0


def test_the_plan_schedules_the_frozen_steps_first_in_the_slots_and_after_the_runs_alone(monkeypatch):
    monkeypatch.setattr(estimate, "estimate_run", lambda run, step_s, setup_s: 10.0)
    plan = SimpleNamespace(pretrain=None)
    runs = [object()] * 4
    timing = {"step_s": 1.0, "setup_s": 1.0}
    assert estimate.plan_estimate(plan, runs, False, timing, 2) == 20.0
    # the probe (50 s) fills one slot while the other runs the four runs
    assert estimate.plan_estimate(plan, runs, False, timing, 2, {"probe": 50.0, "analyze": 5.0}) == 50.0
    assert estimate.plan_estimate(plan, runs, False, timing, 2, {"probe": 15.0, "analyze": 5.0}) == 35.0
    assert estimate.plan_estimate(plan, runs, False, timing, 1, {"probe": 15.0, "analyze": 5.0}) == 60.0
    plan = SimpleNamespace(pretrain=object())
    assert estimate.plan_estimate(plan, runs, True, timing, 2, {"probe": 15.0}) == 10.0 + 30.0  # pretraining first


class FakeStep:
    def __init__(self, label: str, code: str, argv=()) -> None:
        self.label, self.code, self.argv = label, code, list(argv)

    def cached(self) -> bool:
        return False

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]


def test_each_step_is_timed_by_its_own_estimate_and_a_failure_or_an_unmade_model_says_why(monkeypatch, tmp_path):
    pretrain = SimpleNamespace(dir=tmp_path / "pretrain")
    good = FakeStep("probe", f"print('noise'); print({json.dumps(json.dumps({'seconds': 40.0, 'timed_s': 0.0}))})")
    broken = FakeStep("analyze", "import sys; sys.stderr.write('line\\nstudy analyze: error: boom\\n'); sys.exit(2)")
    unmade = FakeStep("probe", "raise SystemExit('never run')", ["--model", str(pretrain.dir / "hf")])
    monkeypatch.setattr(estimate, "frozen_steps", lambda plan: [good, broken])
    found = estimate.StepEstimates(SimpleNamespace(pretrain=pretrain), pretrain_todo=True, slots=2).start().result()
    # 40 s plus the fresh process's start-up (its wall time beyond what the estimate timed), but not much more
    assert 40.0 < found["probe"] < 40.0 + 30.0
    assert found["analyze"] == "exit code 2: study analyze: error: boom"
    monkeypatch.setattr(estimate, "frozen_steps", lambda plan: [unmade])
    found = estimate.StepEstimates(SimpleNamespace(pretrain=pretrain), pretrain_todo=True).start().result()
    assert found == {"probe": "its model is the one pretraining makes"}
    cached = FakeStep("probe", "")
    cached.cached = lambda: True
    monkeypatch.setattr(estimate, "frozen_steps", lambda plan: [cached])
    assert estimate.StepEstimates(SimpleNamespace(pretrain=None), pretrain_todo=False).start().result() == {}


def test_each_estimate_in_a_group_ends_when_its_process_does(monkeypatch):
    """Two at a time: the first slow (3 s), the second quick. The quick one's wall time (its start-up, added to the
    seconds it reports) must not include waiting for the slow one."""
    payload = json.dumps(json.dumps({"seconds": 1.0, "timed_s": 0.0}))
    slow = FakeStep("probe", f"import time; time.sleep(3); print({payload})")
    quick = FakeStep("analyze", f"print({payload})")
    monkeypatch.setattr(estimate, "frozen_steps", lambda plan: [slow, quick])
    found = estimate.StepEstimates(SimpleNamespace(pretrain=None), pretrain_todo=False, slots=2).start().result()
    assert found["probe"] >= 1.0 + 3.0 and found["analyze"] < found["probe"] - 2.0


def test_stop_ends_the_estimates_under_way(monkeypatch):
    slow = FakeStep("probe", "import time; time.sleep(60)")
    monkeypatch.setattr(estimate, "frozen_steps", lambda plan: [slow])
    running = estimate.StepEstimates(SimpleNamespace(pretrain=None), pretrain_todo=False).start()
    import time

    waited = time.perf_counter()
    while not running._procs and time.perf_counter() - waited < 30:  # until the process is started
        time.sleep(0.05)
    started = time.perf_counter()
    running.stop()
    assert time.perf_counter() - started < 10 and running.found["probe"].startswith("exit code")


@pytest.mark.parametrize("verb", ["probe", "analyze"])
def test_the_frozen_commands_take_the_estimate_flag(verb):
    from study.frozen.analysis.command import build_parser as analyze_parser
    from study.frozen.probe.command import build_parser as probe_parser

    parser = {"probe": probe_parser, "analyze": analyze_parser}[verb]()
    required = ["--model", "m", "--text", "t", "--out", str(Path("o"))]
    assert parser.parse_args([*required, "--estimate"]).estimate is True
