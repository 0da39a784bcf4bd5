"""Acceptance tests of `study sweep`: run folders, skip, kill-and-resume, bad specs, DDP and parallel launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from study.report.read import read_scalars
from study.sweep import build_plan, main
from study.sweep.config import SweepConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "trainer.max_steps": 6,
    "trainer.val_check_interval": 6,
    "trainer.limit_val_batches": 1,
    "trainer.log_every_n_steps": 1,
    "trainer.enable_progress_bar": False,
    "trainer.enable_model_summary": False,
    "model.n_layer": 1,
    "model.n_head": 2,
    "model.n_embd": 32,
    "model.warmup_steps": 2,
    "data.batch_size": 4,
    "data.max_train_blocks": 48,
    "data.max_val_blocks": 4,
    "data.cache_dir": str(ROOT / "logs" / "cache"),
}


def write_spec(tmp_path: Path, grid: dict, overrides: dict | None = None, **extra) -> Path:
    spec = {
        "name": "tiny",
        "base": str(ROOT / "configs" / "default.yaml"),
        "save_dir": str(tmp_path / "logs"),
        "threads": 1,
        "grid": grid,
        "overrides": {**TINY, **(overrides or {})},
        "guard": {"action": "stop", "log_grad_norm": True},
        "checkpoint": {"every_n_train_steps": 2},
        "report": False,
        **extra,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.mark.slow
def test_sweep_creates_runs_then_skips_them(tmp_path, capsys):
    spec = write_spec(tmp_path, {"temperature": [0.1, 1.0], "top_k": [None, 2]})
    assert main(["--config", str(spec)]) == 0
    sweep = tmp_path / "logs" / "tiny"
    folders = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    names = sorted(["T0.1_kall_softmax_s0", "T0.1_k2_softmax_s0", "T1_kall_softmax_s0", "T1_k2_softmax_s0"])
    assert folders == names  # no events folder beside the runs: TensorBoard would list it as an empty run
    assert (sweep / "hparams.json").is_file()  # the sweep's one HParams experiment, copied into each run's events
    plan = json.loads((sweep / "plan.json").read_text())
    assert [r["name"] for r in plan["runs"]] == [
        "T0.1_kall_softmax_s0",
        "T0.1_k2_softmax_s0",
        "T1_kall_softmax_s0",
        "T1_k2_softmax_s0",
    ]
    assert plan["runs"][1]["resolved"]["model"]["attention"]["top_k"] == 2
    out = capsys.readouterr().out
    assert "Estimated time" in out and "[4/4]" in out and "ETA" in out
    events = {}
    for name in names:
        run = sweep / name
        st = status(run)
        assert st["state"] == "finished" and st["global_step"] == 6
        assert (run / "checkpoints" / "last.ckpt").is_file()
        hp = yaml.safe_load((run / "config.yaml").read_text())
        assert hp["model"]["attention"]["temperature"] == float(name.split("_")[0][1:])
        events[name] = sorted(p.name for p in run.glob("events.out.tfevents.*"))
        assert events[name]
        loss = read_scalars(run)["train/loss"]
        assert len(loss) == 6
    # rerun: everything skipped, nothing rewritten
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert out.count("skipped (already finished)") == 4
    for name in names:
        assert sorted(p.name for p in (sweep / name).glob("events.out.tfevents.*")) == events[name]
        assert status(sweep / name)["attempts"] == 1


@pytest.mark.slow
def test_killed_run_resumes_without_duplicate_or_missing_steps(tmp_path):
    spec = write_spec(
        tmp_path,
        {"temperature": [0.5]},
        {"trainer.max_steps": 8, "trainer.val_check_interval": 8},
        callbacks=[{"class_path": "tests.faults.KillAtStep", "init_args": {"step": 5}}],
    )
    cmd = [sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--no-estimate"]
    first = subprocess.run(
        cmd, env={**env(), "STUDY_FAULTS": "1"}, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert first.returncode != 0
    run = tmp_path / "logs" / "tiny" / "T0.5_kall_softmax_s0"
    assert status(run)["state"] == "running"  # killed mid-run: never marked finished
    second = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    st = status(run)
    assert st["state"] == "finished" and st["global_step"] == 8 and st["attempts"] == 2
    assert st["resumed_from_step"] == 4, second.stdout[-3000:]  # last.ckpt every 2 steps, killed after step 5
    assert len(list(run.glob("events.out.tfevents.*"))) == 2  # the resumed run appended to the same folder
    steps = [s for s, _ in read_scalars(run)["train/loss"]]
    assert steps == list(range(8))  # every step once, none missing (TensorBoard shows each step once)


@pytest.mark.parametrize(
    ("grid", "extra", "message"),
    [
        ({}, {}, "grid` is empty"),
        ({"temperature": []}, {}, "empty list"),
        ({"temperature": [0.0]}, {}, "temperature"),
        ({"top_k": [0]}, {}, "top_k"),
        ({"normalizer": ["nope"]}, {}, "unknown normalizer"),
        ({"temprature": [1.0]}, {}, "unknown key(s) ['temprature']"),
        ({"temperature": [1.0]}, {"learning_rate": 1}, "unknown key(s) ['learning_rate']"),
        ({"temperature": [1.0]}, {"overrides": {"model.attention.temperature": 2}}, "which the grid varies"),
        ({"temperature": [1.0]}, {"guard": {"action": "explode"}}, "action"),
    ],
)
def test_bad_specs_fail_before_any_run(tmp_path, capsys, grid, extra, message):
    spec = write_spec(tmp_path, grid, **extra)
    if "overrides" in extra:  # replace the tiny overrides
        data = yaml.safe_load(spec.read_text())
        data["overrides"] = extra["overrides"]
        spec.write_text(yaml.safe_dump(data))
    with pytest.raises(SweepConfigError, match=None) as err:
        build_plan(spec)
    assert message in str(err.value)
    assert main(["--config", str(spec)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def test_extends_merges_grid_and_overrides_and_replaces_the_rest(tmp_path):
    parent = write_spec(tmp_path, {"temperature": [0.1, 1.0], "seed": [0]}, arms=[{"top_k": [4]}])
    child = tmp_path / "sub" / "child.yaml"
    child.parent.mkdir()
    child.write_text(yaml.safe_dump({"extends": f"../{parent.name}", "name": "child", "grid": {"seed": [5, 6]},
                                     "overrides": {"trainer.max_steps": 4, "trainer.val_check_interval": 4},
                                     "arms": []}))
    plan = build_plan(child)
    assert plan.sweep_dir.name == "child"
    assert sorted((r.params["temperature"], r.params["seed"]) for r in plan.runs) == [
        (0.1, 5), (0.1, 6), (1.0, 5), (1.0, 6)]  # the parent's temperatures, the child's seeds, no arm
    assert all("--trainer.max_steps=4" in r.args and "--model.n_embd=32" in r.args for r in plan.runs)


@pytest.mark.parametrize(("extends", "message"), [
    ("missing.yaml", "sweep config named by `extends` 'missing.yaml' not found"),
    ("self.yaml", "makes a cycle"),
    (3, "`extends` must name a sweep config file, got 3"),
])
def test_bad_extends_is_refused_naming_it(tmp_path, extends, message):
    path = tmp_path / "self.yaml"
    path.write_text(yaml.safe_dump({"extends": extends, "grid": {"seed": [0]}}))
    with pytest.raises(SweepConfigError, match=None) as err:
        build_plan(path)
    assert message in str(err.value)


@pytest.mark.slow
def test_default_and_hub_sweeps_parse():
    plan = build_plan(ROOT / "configs" / "sweeps" / "small-gpt2.yaml")
    assert len(plan.runs) == 30 and plan.pretrain is not None
    assert "T0.1_k4_softmax_s0" in [r.name for r in plan.runs]
    assert any(a == f"--model.model_name_or_path={plan.pretrain.dir / 'hf'}" for a in plan.runs[0].args)
    quick = build_plan(ROOT / "configs" / "sweeps" / "small-gpt2.yaml", quick=True)
    assert len(quick.runs) == 4 and quick.sweep_dir.name == "small-gpt2-quick"
    # The main job (configs/sweeps/default.yaml, SmolLM2) is checked in tests/test_main_job.py.
    normalizers = build_plan(ROOT / "configs" / "sweeps" / "normalizers.yaml")
    assert len(normalizers.runs) == 20
    assert {r.params["normalizer"] for r in normalizers.runs} == {
        "softmax",
        "sparsemax",
        "entmax15",
        "ssmax",
        "self_adjust",
    }
    hub = build_plan(ROOT / "configs" / "sweeps" / "gpt2-wikitext.yaml")
    assert len(hub.runs) == 60
    # the run's `study fit` arguments parse (print_config exits before the hub would be touched)
    result = subprocess.run(
        [sys.executable, "-m", "study.cli", "fit", *hub.runs[7].args, "--print_config"],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout)
    assert config["model"]["model_name_or_path"] == "gpt2"
    assert config["data"]["dataset_config"] == "wikitext-2-raw-v1"
    assert config["trainer"]["precision"] == "bf16-mixed" and config["trainer"]["strategy"] == "ddp"
    assert config["model"]["attention"]["temperature"] == hub.runs[7].params["temperature"]
    assert config["trainer"]["logger"]["init_args"]["version"] == hub.runs[7].name


@pytest.mark.slow
def test_ddp_run_and_parallel_subprocesses(tmp_path):
    spec = write_spec(
        tmp_path,
        {"temperature": [1.0], "seed": [0, 1]},
        {"trainer.max_steps": 4, "trainer.val_check_interval": 4},
    )
    # each run on 2 CPU processes with DDP; the two runs side by side as subprocesses
    cmd = [
        sys.executable,
        "-m",
        "study.cli",
        "sweep",
        "--config",
        str(spec),
        "--no-estimate",
        "--parallel",
        "2",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.accelerator=cpu",
    ]
    result = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=400)
    sweep = tmp_path / "logs" / "tiny"
    logs = "".join((p / "sweep.log").read_text() for p in sweep.iterdir() if (p / "sweep.log").is_file())
    assert result.returncode == 0, result.stdout[-2000:] + logs[-3000:]
    for seed in (0, 1):
        run = sweep / f"T1_kall_softmax_s{seed}"
        st = status(run)
        assert st["state"] == "finished" and st["global_step"] == 4
        assert len(read_scalars(run)["train/loss"]) == 4
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in logs


def test_run_names_are_exact_and_duplicate_values_are_merged(tmp_path, capsys):
    spec = write_spec(tmp_path, {"temperature": [0.1234561, 0.1234564, 1, 1.0], "top_k": [None, 2, 2.0]})
    plan = build_plan(spec)
    names = [r.name for r in plan.runs]
    assert len(set(names)) == len(names) == 6  # 3 temperatures x 2 top_k
    assert {r.params["temperature"] for r in plan.runs} == {0.1234561, 0.1234564, 1}
    assert "T0.1234561_kall_softmax_s0" in names and "T0.1234564_kall_softmax_s0" in names
    assert "T1_k2_softmax_s0" in names
    assert len(set(r.fingerprint for r in plan.runs)) == 6
    assert main(["--config", str(spec), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "grid `temperature` lists 1 and 1.0, the same setting: merged into one run" in err
    assert "grid `top_k` lists 2 and 2.0" in err


def test_each_run_has_one_guard_whether_the_base_config_or_the_spec_brings_it(tmp_path):
    def guards(plan):
        cbs = plan.runs[0].resolved["trainer"]["callbacks"]
        return [cb["init_args"] for cb in cbs if cb["class_path"].endswith("NonFiniteGuard")]

    assert guards(build_plan(write_spec(tmp_path, {"seed": [0]}))) == [
        {"action": "stop", "log_grad_norm": True}
    ]
    assert guards(build_plan(write_spec(tmp_path, {"seed": [0]}, guard={"action": "skip"}))) == [
        {"action": "skip"}
    ]
    assert guards(build_plan(write_spec(tmp_path, {"seed": [0]}, guard={"enabled": False}))) == []
    assert guards(build_plan(write_spec(tmp_path, {"seed": [0]}, guard=None))) == [
        {"action": "stop"}
    ]  # the base's


def test_a_bad_override_is_refused_before_any_run(tmp_path, capsys):
    spec = write_spec(tmp_path, {"seed": [0, 1]}, {"trainer.max_stepz": 3})
    assert main(["--config", str(spec), "--no-estimate"]) == 2
    err = capsys.readouterr().err
    assert "refuses its arguments: unrecognized arguments: --trainer.max_stepz=3; did you mean --trainer.max_steps?; nothing was run" in err
    assert not list((tmp_path / "logs" / "tiny").glob("*/status.json"))


def test_a_run_subprocess_gets_the_sweeps_threads():
    """`--parallel` runs are `study sweep --run-index` subprocesses: --threads must reach them (they would set
    their torch threads from the spec instead)."""
    from study.sweep.pool import run_command

    cmd = run_command(Path("s.yaml"), 3, True, ["--trainer.devices=1"], "out", threads=1)
    assert cmd[cmd.index("--threads") + 1] == "1" and cmd[-1] == "--trainer.devices=1" and "--quick" in cmd
    assert "--threads" not in run_command(Path("s.yaml"), 3, False, [], None)


def test_a_damaged_status_file_means_not_done(tmp_path):
    """Binary garbage or a JSON list in status.json (a full disk, a stray write) must not stop the whole sweep."""
    from study.sweep.run import read_status

    (tmp_path / "status.json").write_bytes(b"\xff\xfe\x00garbage")
    assert read_status(tmp_path) is None
    (tmp_path / "status.json").write_text("[1, 2]")
    assert read_status(tmp_path) is None
    (tmp_path / "status.json").write_text('{"state": "finished"}')
    assert read_status(tmp_path) == {"state": "finished"}


def test_options_that_would_be_ignored_are_refused(tmp_path, capsys):
    spec = write_spec(tmp_path, {"seed": [0]}, checkpoint={"enabled": False, "every_n_train_steps": 5})
    with pytest.raises(SweepConfigError, match="every_n_train_steps with enabled: false"):
        build_plan(spec)
    spec = write_spec(tmp_path, {"seed": [0]})
    assert main(["--config", str(spec), "--devices-per-run", "2", "--dry-run"]) == 2
    assert "--devices-per-run pins the GPUs of --parallel runs" in capsys.readouterr().err


def test_the_analysis_step_is_cached_by_its_arguments_and_replaced_when_they_change(tmp_path, monkeypatch):
    """`analyze:` runs `study analyze` once; the same arguments reuse results.json, other arguments replace it."""
    import study.frozen.analysis.command as command
    from study.sweep.frozen_steps import frozen_steps, run_step_here

    def run_analyze(plan):
        return run_step_here(next(step for step in frozen_steps(plan) if step.label == "analyze"))

    calls = []

    def fake_main(argv):
        calls.append(list(argv))
        out = Path(argv[argv.index("--out") + 1])
        assert not out.exists()  # `study analyze` never writes into an existing folder
        out.mkdir(parents=True)
        (out / "results.json").write_text(json.dumps({"source": {"argv": list(argv)}}))
        return 0

    monkeypatch.setattr(command, "main", fake_main)
    (tmp_path / "base.yaml").write_text("model: {model_name_or_path: some/model}\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(f"base: {tmp_path / 'base.yaml'}\nsave_dir: {tmp_path}\ngrid: {{temperature: [1]}}\n"
                    "analyze: {windows: 3, max_length: 16}\n")
    plan = build_plan(spec)
    assert plan.analyze[:2] == ["--model", "some/model"]
    assert run_analyze(plan) and run_analyze(plan)
    assert len(calls) == 1  # the second was cached
    spec.write_text(spec.read_text().replace("windows: 3", "windows: 4"))
    plan = build_plan(spec)
    assert run_analyze(plan) and len(calls) == 2 and "4" in calls[-1]
    assert not (tmp_path / "s" / "analyze-1").exists()
    monkeypatch.setattr(command, "main", lambda argv: 2)
    spec.write_text(spec.read_text().replace("windows: 4", "windows: 5"))
    assert run_analyze(build_plan(spec)) is False  # a failed analysis fails the sweep's exit code, not the report
    from study.sweep.lock import RunLock

    spec.write_text(spec.read_text().replace("windows: 5", "windows: 6"))
    with RunLock(tmp_path / "s", name="analyze.lock"):  # another sweep process runs it: left to that one
        assert run_analyze(build_plan(spec)) is None and len(calls) == 2


def _step(tmp_path, label: str, code: str):
    """A frozen-model step whose subprocess is ``code`` (python), given the result path and the lock folder."""
    import sys

    from study.sweep.frozen_steps import FrozenStep

    class Step(FrozenStep):
        def command(self):
            return [sys.executable, "-c", code, str(self.result), str(self.lock_dir), json.dumps(self.argv)]

    out = tmp_path / label
    return Step(label, f"the {label}", "unused", ["--x", label], out / "result.json", lambda r: r.get("argv"),
                log=out / "log", lock_dir=tmp_path)


STEP_CODE = """import json, pathlib, sys, time
from study.sweep.lock import busy
result, lock_dir, argv = pathlib.Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
time.sleep(0.5)
print("step output")
result.parent.mkdir(parents=True, exist_ok=True)
result.write_text(json.dumps({"argv": argv, "held": busy(lock_dir, argv[1] + ".lock") is not None,
                              "ended": time.time()}))
"""


def test_with_parallel_slots_the_frozen_steps_run_first_beside_the_runs(tmp_path, capsys):
    """`--parallel`: the probe and the analysis (independent of the runs) take the first pool slots as
    subprocesses, under their locks; their output goes to their logs, one line each here; a cached step is not
    rerun and a failed one is named."""
    import argparse

    from study.sweep.pool import SweepProgress, run_pool

    spec = write_spec(tmp_path, {"seed": [0]})
    plan = build_plan(spec)
    args = argparse.Namespace(parallel=2, devices_per_run=1, save_dir=None, threads=1)
    probe, analyze = _step(tmp_path, "probe", STEP_CODE), _step(tmp_path, "analyze", "raise SystemExit(3)")
    started = time.time()
    outcomes = run_pool(plan, [], args, [], SweepProgress(0, 2), [probe, analyze])
    assert outcomes == {"probe": True, "analyze": False}
    result = json.loads(probe.result.read_text())
    assert result["held"] and result["ended"] - started < 5  # its lock was held by the pool while it ran
    assert "step output" in probe.log.read_text()
    out = capsys.readouterr()
    assert "probe: finished in" in out.out and "the analyze failed (see" in out.err
    assert run_pool(plan, [], args, [], SweepProgress(0, 2), [probe]) == {"probe": True}  # cached
    assert "probe: cached" in capsys.readouterr().out



def test_sweep_spec_analyze_section(tmp_path):
    """The main job's `analyze:` section becomes `study analyze` arguments (quick keys over the full ones)."""
    plan = build_plan("configs/sweeps/default.yaml", save_dir=str(tmp_path))
    args = plan.analyze
    assert args[args.index("--out") + 1] == str(tmp_path / "default" / "analyze")
    assert args[args.index("--windows") + 1] == "20" and args[args.index("--text") + 1] == "shakespeare"
    assert args[args.index("--layers") + 1: args.index("--layers") + 3] == ["0", "6"]
    assert plan.as_dict()["analyze"] == args
    quick = build_plan("configs/sweeps/default.yaml", quick=True, save_dir=str(tmp_path)).analyze
    assert quick[quick.index("--max-length") + 1] == "64" and "--layers" not in quick  # quick: every layer
    assert quick[1] == str(tmp_path / "default-quick" / "pretrain" / "hf")
    spec = tmp_path / "bad.yaml"
    (tmp_path / "base.yaml").write_text("model: {}\n")
    for section, message in (("{steps: 3}", r"unknown key\(s\) \['steps'\]"), ("{enabled: true}", "analyze.model")):
        spec.write_text(f"base: {tmp_path / 'base.yaml'}\ngrid: {{temperature: [1]}}\nanalyze: {section}\n")
        with pytest.raises(SweepConfigError, match=message):
            build_plan(spec)
    spec.write_text(f"base: {tmp_path / 'base.yaml'}\ngrid: {{temperature: [1]}}\nanalyze: {{enabled: false}}\n")
    assert build_plan(spec).analyze is None
