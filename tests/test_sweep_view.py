"""`study tensorboard`: the address colours the main arm's runs by T and puts every other arm in a group of its own.

The grouping is checked as TensorBoard forms it (`groupRuns`: runs with equal captured groups share a colour) on
the run names of the demo's plan (configs/sweeps/default.yaml) and of its --quick version, built by the sweep's
own planner (slow: the planner checks the guard and callbacks, which imports Lightning), and on a demo-shaped
grid named by `axes.run_name` alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from study import tags
from study.cli import main as study_main
from study.sweep import axes
from study.sweep.view import address, color_groups, command_line, plan_runs, run_color_regex

ROOT = Path(__file__).resolve().parents[1]


def _plan(quick: bool, tmp_path: Path):
    from study.sweep.config import build_plan

    plan = build_plan(ROOT / "configs/sweeps/default.yaml", quick=quick, save_dir=str(tmp_path))
    return plan, [(run.name, run.params) for run in plan.runs]


BASE = {"temperature": 1, "top_k": None, "normalizer": "softmax", "seed": 0, "learning_rate": 1e-4,
        "optimizer": "adamw", "qk_norm": False, "temperature_in": "softmax"}


def _demo_shaped_runs() -> list[tuple[str, dict]]:
    """The demo's grid, top-8 arm and SGD arm, named as the planner names them (`axes.run_name`)."""
    grids = [({"temperature": [0.01, 0.03, 0.1, 0.3, 1], "seed": [0, 1, 2, 3]}, {"temperature", "top_k", "normalizer", "seed"}),
             ({"temperature": [0.01, 1], "top_k": [8], "seed": [0]}, {"temperature", "top_k", "normalizer", "seed"}),
             ({"temperature": [0.01, 1], "seed": [1], "optimizer": ["sgd"], "learning_rate": [0.01, 1.0]},
              {"temperature", "top_k", "normalizer", "seed", "optimizer", "learning_rate"})]
    runs = []
    for grid, named in grids:
        combos = [{}]
        for key, values in grid.items():
            combos = [{**c, key: v} for c in combos for v in values]
        runs += [(axes.run_name({**BASE, **c}, swept=named), {**BASE, **c}) for c in combos]
    return runs


def test_a_demo_shaped_grid_is_coloured_by_T_with_the_other_arms_apart():
    runs = _demo_shaped_runs()
    assert runs[-1][0] == "T1_kall_softmax_s1_lr1_sgd"  # the planner's names
    _check_grouping(runs, n_main=20, n_other=6)


@pytest.mark.slow  # builds the plan, which imports Lightning
@pytest.mark.parametrize("quick", [False, True])
def test_the_demo_runs_are_coloured_by_T_with_the_other_arms_apart(quick, tmp_path):
    _, runs = _plan(quick, tmp_path)
    _check_grouping(runs, n_main=9 if quick else 20, n_other=13 if quick else 6)


def _check_grouping(runs: list[tuple[str, dict]], n_main: int, n_other: int) -> None:
    groups = color_groups(run_color_regex(runs), [name for name, _ in runs])
    assert all(key is not None for key in groups.values()), groups  # every run in a group, none on its own colour
    main = {name: params for name, params in runs
            if params["top_k"] is None and params["optimizer"] == "adamw" and params["normalizer"] == "softmax"}
    others = {name: params for name, params in runs if name not in main}
    assert (len(main), len(others)) == (n_main, n_other)
    # the main arm: one group per temperature, its seeds together, named by the T part of the name
    by_t: dict[float, set] = {}
    for name, params in main.items():
        by_t.setdefault(params["temperature"], set()).add(groups[name])
    assert all(len(keys) == 1 for keys in by_t.values()) and len({k for keys in by_t.values() for k in keys}) == len(by_t)
    assert {t: next(iter(keys))[0] for t, keys in by_t.items()} == {t: f"T{t:g}" for t in by_t}
    # every other setting: one group of its own (whatever its T), never a temperature's
    main_keys = {groups[name] for name in main}
    for name, params in others.items():
        assert groups[name] not in main_keys, name
        same_setting = [o for o, p in others.items()
                        if {k: v for k, v in p.items() if k not in ("temperature", "seed")}
                        == {k: v for k, v in params.items() if k not in ("temperature", "seed")}]
        assert {groups[o] for o in same_setting} == {groups[name]}, name
        assert sum(groups[o] == groups[name] for o in others) == len(same_setting), name
    # the SGD runs at T = 1 are not coloured as the T = 1 runs of the main arm (the unstable-looking T = 1)
    sgd_t1 = [n for n, p in others.items() if p["optimizer"] == "sgd" and p["temperature"] == 1]
    assert sgd_t1 and all(groups[n] != groups[next(m for m, p in main.items() if p["temperature"] == 1)] for n in sgd_t1)
    # the sweep's other runs (pretraining, the report's run) match nothing: each keeps a colour of its own
    assert color_groups(run_color_regex(runs), ["pretrain", "report", "probe"]) == dict.fromkeys(
        ["pretrain", "report", "probe"])
    # the main arm's mean over seeds at each T takes that T's colour
    t1 = next(m for m, p in main.items() if p["temperature"] == 1)
    assert color_groups(run_color_regex(runs), [tags.seed_mean_run("T1")])[tags.seed_mean_run("T1")] == groups[t1]


def test_a_normaliser_arm_is_grouped_apart_even_when_its_name_has_underscores():
    params = {"temperature": 0.1, "top_k": None, "normalizer": "softmax", "seed": 0, "learning_rate": 1e-3,
              "optimizer": "adamw", "qk_norm": False, "temperature_in": "softmax"}
    runs = [("T0.1_kall_softmax_s0", params), ("T1e-05_kall_softmax_s1", {**params, "temperature": 1e-05, "seed": 1}),
            ("T0.1_kall_my_pkg.norms:My_s2_s0", {**params, "normalizer": "my_pkg.norms:My_s2"})]
    groups = color_groups(run_color_regex(runs), [name for name, _ in runs])
    assert groups["T0.1_kall_softmax_s0"] == ("T0.1", None, None)
    assert groups["T1e-05_kall_softmax_s1"] == ("T1e-05", None, None)
    assert groups["T0.1_kall_my_pkg.norms:My_s2_s0"] == (None, "_kall_my_pkg.norms:My_s2_", "")
    assert run_color_regex([("odd-name", params)]) is None  # no run of the plan's name shape: no grouping


def test_the_address_carries_the_grouping_and_no_smoothing():
    runs = _demo_shaped_runs()
    regex = run_color_regex(runs)
    url = address(regex, "localhost", 6007)
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    assert (parts.netloc, parts.fragment) == ("localhost:6007", "timeseries")
    assert query == {"smoothing": "0", "runColorGroup": "regex:" + regex}
    assert "#" not in parts.query and " " not in url  # the regex is quoted whole: nothing of it leaks into the path


def test_the_verb_reads_the_sweeps_plan_and_refuses_a_folder_without_one(tmp_path, capsys):
    runs = _demo_shaped_runs()
    sweep_dir = tmp_path / "default"
    sweep_dir.mkdir()
    # plan.json as `Plan.as_dict` writes it: the runs' names and params (with other fields the verb ignores)
    (sweep_dir / "plan.json").write_text(json.dumps({"sweep": "default", "runs": [
        {"index": i, "name": name, "params": params, "args": []} for i, (name, params) in enumerate(runs)]}))
    assert plan_runs(sweep_dir) == runs
    assert study_main(["tensorboard", str(sweep_dir), "--print-address"]) == 0
    assert capsys.readouterr().out.strip() == address(run_color_regex(runs))
    assert command_line(sweep_dir) == f"study tensorboard {sweep_dir}"
    assert study_main(["tensorboard", str(tmp_path / "nothing")]) == 2
    assert "no sweep folder" in capsys.readouterr().err
    (tmp_path / "bare").mkdir()
    assert study_main(["tensorboard", str(tmp_path / "bare"), "--print-address"]) == 1
    assert "has no plan.json" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "plan.json").write_text("{not json")
    assert study_main(["tensorboard", str(tmp_path / "bad"), "--print-address"]) == 1
    assert "not a readable sweep plan" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("node") is None, reason="no JavaScript engine here to read the regex as a browser")
def test_a_browser_reads_the_regex_as_python_does():
    """TensorBoard groups by `new RegExp(s)` and `JSON.stringify(match.slice(1))`: the same groups in JavaScript."""
    runs = _demo_shaped_runs()
    regex, names = run_color_regex(runs), [name for name, _ in runs] + ["pretrain", tags.seed_mean_run("T0.1")]
    script = ("const r = new RegExp(process.argv[1]); const out = {};"
              "for (const n of JSON.parse(process.argv[2])) { const m = n.match(r);"
              " out[n] = m ? m.slice(1).map(g => g === undefined ? null : g) : null; }"
              "console.log(JSON.stringify(out));")
    done = subprocess.run(["node", "-e", script, regex, json.dumps(names)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    in_python = {n: (list(k) if k is not None else None) for n, k in color_groups(regex, names).items()}
    assert json.loads(done.stdout) == in_python
