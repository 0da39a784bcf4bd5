"""Reading a sweep folder back: damaged plan.json / status.json files are named, the other runs still read."""

from __future__ import annotations

import json
import time

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
    # Event files are read in name order: events.out.tfevents.<second>.<host>.<pid>.<writer count>. Two writers in
    # one second of one process sort by their count as text, so the 10th writer of a test process sorted before
    # the 9th and the purge ran backwards (a flake of the full suite): the resumed attempt starts a second later.
    time.sleep(1.05)
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


# ---- damaged event files (issue 32, item 3) -------------------------------------------------------------------
def _finished_run(sweep, name, final_val=1930.0, steps=60):
    """A finished run as a sweep leaves it: status with its final metrics, an event file with every step."""
    run = sweep / name
    run.mkdir(parents=True)
    status = {"state": "finished", "params": {"temperature": 1.0, "seed": int(name[-1])}, "global_step": steps,
              "metrics": {"val/loss": final_val}}
    (run / "status.json").write_text(json.dumps(status))
    with SummaryWriter(run) as writer:
        writer.add_scalar("val/loss", 8095.0, 0)  # the step-0 baseline
        for step in range(steps):
            writer.add_scalar("train/loss", 10.0 - step / 10, step)
            writer.add_text("note", "x" * 200, step)  # bulk, so that a damaged block lands inside a record
        writer.add_scalar("val/loss", final_val, steps - 1)
    return run


def _event_file(run):
    (path,) = run.glob("events.out.tfevents.*")
    return path


def _states(sweep):
    problems: list[str] = []
    _, runs = load_sweep(sweep, problems)
    return {r.name: r.state for r in runs}, problems


def test_a_sound_run_counts_and_says_nothing(tmp_path):
    _finished_run(tmp_path / "sw", "s0")
    assert _states(tmp_path / "sw") == ({"s0": "finished"}, [])


def test_zeroed_bytes_in_an_event_file_make_the_run_damaged_not_a_result(tmp_path):
    run = _finished_run(tmp_path / "sw", "s0")
    path = _event_file(run)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(4096)
    path.write_bytes(bytes(data))
    states, problems = _states(tmp_path / "sw")
    assert states == {"s0": "damaged"}
    assert len(problems) == 1 and "damaged: not counted" in problems[0] and "fails its CRC check" in problems[0]


def test_an_event_file_cut_short_is_damaged(tmp_path):
    run = _finished_run(tmp_path / "sw", "s0")
    path = _event_file(run)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    states, problems = _states(tmp_path / "sw")
    assert states == {"s0": "damaged"} and "final validation" in problems[0] and "1930" in problems[0]


def test_a_finished_run_without_event_files_is_named_not_a_replicate(tmp_path):
    run = _finished_run(tmp_path / "sw", "s0")
    _finished_run(tmp_path / "sw", "s1")
    _event_file(run).unlink()
    states, problems = _states(tmp_path / "sw")
    assert states == {"s0": "damaged", "s1": "finished"} and "no event file" in problems[0]


def test_a_truncated_tail_in_a_superseded_event_file_is_expected(tmp_path):
    """A kill mid-write leaves the first attempt's file with a cut last record; the resumed attempt's file has the
    rest: read up to the cut, say nothing."""
    run = tmp_path / "sw" / "s0"
    run.mkdir(parents=True)
    with SummaryWriter(run, filename_suffix=".a") as first:
        for step in range(30):
            first.add_scalar("train/loss", 10.0 - step / 10, step)
    (first_file,) = run.glob("*.a")
    first_file.write_bytes(first_file.read_bytes()[:-7])  # the kill
    with SummaryWriter(run, purge_step=20, filename_suffix=".b") as second:
        for step in range(20, 60):
            second.add_scalar("train/loss", 10.0 - step / 10, step)
        second.add_scalar("val/loss", 1930.0, 59)
    (run / "status.json").write_text(json.dumps({"state": "finished", "global_step": 60,
                                                 "metrics": {"val/loss": 1930.0}}))
    assert _states(tmp_path / "sw") == ({"s0": "finished"}, [])


def test_a_folder_read_again_is_parsed_again_only_when_its_own_event_files_changed(tmp_path):
    """`read_scalars` keeps what it parsed while the run's own event files are unchanged (the sweep reads its runs
    before its report does): a new file of the run's is read, and a caller's change never reaches the kept copy."""
    writer = SummaryWriter(str(tmp_path))
    writer.add_scalar("train/loss", 2.0, 0)
    writer.close()
    first = read_scalars(tmp_path)
    first["train/loss"].append((9, 9.0))  # a caller's change does not reach the kept copy
    assert read_scalars(tmp_path) == {"train/loss": [(0, 2.0)]}
    writer = SummaryWriter(str(tmp_path))  # a resumed attempt: a file of its own
    writer.add_scalar("train/loss", 1.0, 1)
    writer.close()
    assert read_scalars(tmp_path) == {"train/loss": [(0, 2.0), (1, 1.0)]}
