"""Reading a sweep folder back: damaged plan.json / status.json files are named, the other runs still read."""

from __future__ import annotations

import json

from torch.utils.tensorboard import SummaryWriter

from study.report.read import dotted_get, load_sweep, read_scalars


def make_run(sweep, name, state, losses):
    run = sweep / name
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": state, "params": {"temperature": 1.0}}))
    with SummaryWriter(run) as writer:
        for step, loss in enumerate(losses):
            writer.add_scalar("train/loss", loss, step)
    return run


def test_damaged_files_are_named_and_the_other_runs_are_read(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep, "a", "finished", [3.0, 2.0])
    bad = make_run(sweep, "b", "finished", [4.0])
    (bad / "status.json").write_text('{"state": "fini')  # truncated by a kill
    plan = {
        "sweep": "sweep",
        "runs": [{"name": "a", "params": {"temperature": 1.0}}, {"name": "b", "params": {}}],
    }
    (sweep / "plan.json").write_text(json.dumps(plan))
    problems: list[str] = []
    _, runs = load_sweep(sweep, problems)
    assert [(r.name, r.state) for r in runs] == [("a", "finished"), ("b", "unreadable")]
    assert runs[0].series("train/loss") == [(0, 3.0), (1, 2.0)]
    assert len(problems) == 1 and str(bad / "status.json") in problems[0] and "JSONDecodeError" in problems[0]
    # a truncated plan: named, and the run folders are read instead
    (sweep / "plan.json").write_text('{"sweep": "sw')
    problems = []
    _, runs = load_sweep(sweep, problems)
    assert [r.name for r in runs] == ["a", "b"] and str(sweep / "plan.json") in problems[0]
    assert runs[0].params == {"temperature": 1.0}


def test_a_resumed_run_purges_the_steps_after_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    with SummaryWriter(run) as first:  # killed after logging steps 0..5
        for step in range(6):
            first.add_scalar("train/loss", 10.0 + step, step)
    with SummaryWriter(run, purge_step=4) as second:  # resumed from the checkpoint at step 4
        for step in (4, 6):  # it logs other steps (say, a longer period): the first attempt's step 5 must go
            second.add_scalar("train/loss", 20.0 + step, step)
    assert read_scalars(run)["train/loss"] == [
        (0, 10.0),
        (1, 11.0),
        (2, 12.0),
        (3, 13.0),
        (4, 24.0),
        (6, 26.0),
    ]


def test_dotted_get():
    assert dotted_get({"a": {"b": 2}}, "a.b") == 2
    assert dotted_get({"a": {"b": None}}, "a.b", 5) == 5 and dotted_get({}, "a.b", 7) == 7
