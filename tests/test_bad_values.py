"""Every value checked before work (issue 52, rows N8, N9 and N15): each bad value of the fit config, the monitors,
the sweep's options and its `probe:`/`analyze:` sections, and the bench exits 2 with one line naming the key and the
value, before anything is built; a run that failed before its first step does not block its fixed rerun; the
messages of N15 name the file or the value."""

from __future__ import annotations

import errno
import json
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
import yaml

from study.cli import main as study
from tests.test_sweep import ROOT, write_spec

DEFAULT = ROOT / "configs" / "default.yaml"


@pytest.fixture
def nothing_built(monkeypatch, tmp_path):
    """Records whether LightningCLI started building the model, the data or the trainer (it must not), and runs
    each case in ``tmp_path`` so that anything written is seen."""
    from lightning.pytorch.cli import LightningCLI

    built = []
    monkeypatch.setattr(LightningCLI, "instantiate_classes", lambda self: built.append(True))
    monkeypatch.chdir(tmp_path)
    return built


def refused(capsys, code: int, *named: str) -> str:
    """The one stderr line of a refusal (exit 2) that names each of ``named``."""
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for text in named:
        assert text in err, (text, err)
    return err


def assert_nothing_written(folder: Path) -> None:
    written = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".ckpt", ".json", ".yaml")
               or p.name.startswith("events.out.tfevents")]
    assert not [p for p in written if "logs" in p.parts], written


# ---- `study fit`: the model, data and trainer sections (N8, N9) ------------------------------------------------
FIT_CASES = [
    # (arguments, the key and the value the line must name)
    (["--model.min_lr_ratio=-1"], "model.min_lr_ratio = -1"),
    (["--model.min_lr_ratio=5"], "model.min_lr_ratio = 5"),
    (["--model.warmup_steps=100", "--trainer.max_steps=6", "--trainer.val_check_interval=6"],
     "model.warmup_steps = 100: must be <= trainer.max_steps = 6"),
    (["--model.warmup_steps=-5"], "model.warmup_steps = -5"),
    (["--model.weight_decay=-1"], "model.weight_decay = -1"),
    (["--trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val = -1"),
    (["--trainer.limit_val_batches=0"], "trainer.limit_val_batches = 0"),
    (["--trainer.log_every_n_steps=0"], "trainer.log_every_n_steps = 0"),
    (["--data.max_val_blocks=0"], "data.max_val_blocks = 0"),
    (["--data.vocab_size=1"], "data.vocab_size = 1: must be >= 257"),
    (["--model.attention.top_k=1000000"], "model.attention.top_k = 1000000: must be < data.block_size = 128"),
    (["--trainer.val_check_interval=600"], "trainer.val_check_interval = 600: must be <= trainer.max_steps = 300"),
    (["--data.block_size=0"], "data.block_size = 0"),
    (["--data.block_size=-1"], "data.block_size = -1"),
    (["--data.block_size=100000"], "data.block_size = 100000: must be <= the model's context of 256"),
    (["--data.batch_size=0"], "data.batch_size = 0"),
    (["--data.batch_size=1000000"], "data.batch_size = 1000000: must be <= the at most"),
    (["--model.n_layer=0"], "model.n_layer = 0"),
    (["--model.n_head=3", "--model.n_embd=64"], "model.n_head = 3: must divide model.n_embd = 64"),
    (["--model.n_embd=-64"], "model.n_embd = -64"),
    (["--model.betas=[1.5,0.9]"], "model.betas[0] = 1.5"),
    (["--model.dropout=1.5"], "model.dropout = 1.5"),
    (["--model.z_loss=-1"], "model.z_loss = -1"),
    (["--trainer.max_steps=-5"], "trainer.max_steps = -5"),
    (["--model.attention.layers=[99]"], "model.attention.layers = [99]: layer 99 is not among the model's 4 layers"),
    (["--model.attention.normalizer=softmaxx"], "--model.attention: unknown normalizer 'softmaxx'"),
    (["--model.model_name_or_path=" + str(DEFAULT)], f"model.model_name_or_path = '{DEFAULT}': a file, not a model"),
    (["--model.learning_rate=-1"], "model.learning_rate = -1"),
]


@pytest.mark.parametrize("args, named", FIT_CASES, ids=[" ".join(a) for a, _ in FIT_CASES])
def test_study_fit_refuses_each_bad_value_before_building(nothing_built, tmp_path, capsys, args, named):
    code = study(["fit", "--config", str(DEFAULT), "--trainer.logger.init_args.save_dir=logs", *args])
    refused(capsys, code, "study fit: " + named)
    assert nothing_built == []
    assert not (tmp_path / "logs").exists()


def test_the_learning_rate_is_named_by_its_key_not_by_torch(nothing_built, capsys):
    err = refused(capsys, study(["fit", "--config", str(DEFAULT), "--model.learning_rate=-1"]))
    assert "model.learning_rate = -1.0: must be a finite number >= 0" in err and "Invalid learning rate" not in err


def test_the_good_config_passes_the_preflight(nothing_built, capsys):
    """The same checks pass every shipped fit config (the refusals above are the values', not the checks')."""
    from study.fit import check_fit_args

    for config in sorted((ROOT / "configs").glob("*.yaml")):
        assert check_fit_args(["--config", str(config)]) is None, config


# ---- the monitors' arguments (N8, N9) ---------------------------------------------------------------------------
def config_with(tmp_path: Path, monitor: str, **init_args) -> Path:
    """configs/default.yaml with one monitor's arguments replaced."""
    config = yaml.safe_load(DEFAULT.read_text())
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path / "logs")
    entry = next(c for c in config["trainer"]["callbacks"] if c["class_path"] == f"study.callbacks.{monitor}")
    entry.setdefault("init_args", {}).update(init_args)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


MONITORS = ("AttentionEntropyMonitor", "SelectionUniformityMonitor", "GradientNormMonitor",
            "AttentionJacobianMonitor", "AttentionMapMonitor", "NormalizerParameterMonitor")
MONITOR_CASES = [
    *[(monitor, {"every_n_steps": every}, f"trainer.callbacks.{monitor}: every_n_steps must be an integer >= 1, "
                                          f"got {every}") for monitor in MONITORS for every in (0, -1)],
    ("AttentionJacobianMonitor", {"rows": 1000000},
     "trainer.callbacks.AttentionJacobianMonitor.rows = 1000000: must be <= the 4096 attention rows of one call"),
    ("SelectionUniformityMonitor", {"selection_ks": [1000]},
     "trainer.callbacks.SelectionUniformityMonitor.selection_ks = [1000]: each k must be <= data.block_size = 128"),
    ("AttentionMapMonitor", {"layers": [99]},
     "trainer.callbacks.AttentionMapMonitor.layers = [99]: layer 99 is not among the model's 4 layers"),
    ("AttentionMapMonitor", {"heads": [7]}, "trainer.callbacks.AttentionMapMonitor.heads = [7]: the model has heads 0..3"),
    ("AttentionEntropyMonitor", {"layers": [-9]}, "trainer.callbacks.AttentionEntropyMonitor.layers = [-9]"),
]


@pytest.mark.parametrize("monitor, init_args, named", MONITOR_CASES,
                         ids=[f"{m}-{a}" for m, a, _ in MONITOR_CASES])
def test_study_fit_refuses_each_bad_monitor_argument_before_building(nothing_built, tmp_path, capsys, monitor,
                                                                     init_args, named):
    code = study(["fit", "--config", str(config_with(tmp_path, monitor, **init_args))])
    refused(capsys, code, named)
    assert nothing_built == []
    assert not (tmp_path / "logs").exists()


# ---- `study sweep`: every run, its options, its probe: and analyze: sections (N8, N9) -------------------------
SWEEP_CASES = [
    # (overrides, extra spec keys, command-line options, the key and the value the line must name)
    ({"model.attention.normalizer": "softmaxx"}, {}, [], "--model.attention: unknown normalizer 'softmaxx'"),
    ({"trainer.callbacks.AttentionEntropyMonitor.every_n_steps": 0}, {}, [],
     "trainer.callbacks.AttentionEntropyMonitor: every_n_steps must be an integer >= 1, got 0"),
    ({"trainer.callbacks.AttentionJacobianMonitor.rows": 1000000}, {}, [],
     "trainer.callbacks.AttentionJacobianMonitor.rows = 1000000"),
    ({"trainer.callbacks.SelectionUniformityMonitor.selection_ks": [1000]}, {}, [],
     "trainer.callbacks.SelectionUniformityMonitor.selection_ks = [1000]"),
    ({"trainer.callbacks.AttentionMapMonitor.layers": [99]}, {}, [], "trainer.callbacks.AttentionMapMonitor.layers = [99]"),
    ({"model.min_lr_ratio": -1}, {}, [], "model.min_lr_ratio = -1"),
    ({"model.warmup_steps": 100}, {}, [], "model.warmup_steps = 100: must be <= trainer.max_steps = 6"),
    ({"data.vocab_size": 1}, {}, [], "data.vocab_size = 1"),
    ({"model.model_name_or_path": str(DEFAULT)}, {}, [], f"model.model_name_or_path = '{DEFAULT}'"),
    ({}, {}, ["--parallel", "1000"], "--parallel = 1000: must be an integer in [1, "),
    ({}, {}, ["--threads", "100000"], "--threads = 100000: must be an integer in [1, "),
    ({}, {}, ["--threads", "0"], "--threads = 0"),
    ({}, {}, ["--workers", "1000"], "--workers = 1000: must be an integer in [1, "),
    ({}, {"probe": {"model": "gpt2", "jacobian_rows": 0}}, [], "`probe:` --jacobian-rows must be >= 1, got 0"),
    ({}, {"probe": {"model": "gpt2", "temperatures": [0.1, 1.0], "fp64_windows": 30, "windows": 4}}, [],
     "`probe:` --fp64-windows 30 exceeds --windows 4"),
    ({}, {"analyze": {"model": "gpt2", "windows": 0}}, [], "`analyze:` --windows must be >= 1, got 0"),
    ({}, {"analyze": {"model": "gpt2", "lengths": [64], "ns": [1000]}}, [], "`analyze:` N=1000 exceeds L=64"),
    ({}, {"analyze": {"model": "gpt2", "mc_samples": -1}}, [], "`analyze:` --mc-samples must be >= 0, got -1"),
]


@pytest.mark.parametrize("overrides, extra, argv, named", SWEEP_CASES, ids=[n for *_, n in SWEEP_CASES])
def test_study_sweep_refuses_each_bad_value_before_the_first_run(tmp_path, capsys, overrides, extra, argv, named):
    from study.sweep import main

    spec = write_spec(tmp_path, {"temperature": [0.1, 1.0]}, overrides, **extra)
    refused(capsys, main(["--config", str(spec), "--no-estimate", *argv]), named)
    assert not (tmp_path / "logs").exists()  # no plan.json, no run folder


def test_every_run_of_the_plan_is_checked_not_only_the_first(tmp_path, capsys):
    """A value that only one run of the grid gets wrong (the uniform normaliser at T != 1) is refused, naming that
    run, before any run starts."""
    from study.sweep import main

    spec = write_spec(tmp_path, {"temperature": [1.0, 0.1], "normalizer": ["softmax", "uniform"]})
    err = refused(capsys, main(["--config", str(spec), "--no-estimate"]), "uniform")
    assert err.startswith("study sweep: run T0.1_kall_uniform_s0: `study fit` refuses its arguments: --model.attention: "
                          "temperature=0.1 has no effect with normalizer 'uniform'")
    assert not (tmp_path / "logs").exists()


# ---- `study bench` (N8, N15) -------------------------------------------------------------------------------------
BENCH_CASES = [
    (["--rounds", "0"], "--rounds = 0: must be an integer >= 1"),
    (["--rounds", "-1"], "--rounds = -1: must be an integer >= 1"),
    (["--chunk", "0"], "--chunk = 0: must be an integer >= 1"),
    (["--top-k", "0"], "--top-k = 0: must be an integer >= 1"),
    (["--top-k", "4,x"], "--top-k = '4,x': must be comma-separated integers"),
    (["--models", "nope"], "--models = 'nope': 'nope' is not a model shape; choose from"),
]


@pytest.mark.parametrize("argv, named", BENCH_CASES, ids=[" ".join(a) for a, _ in BENCH_CASES])
def test_study_bench_refuses_each_bad_value_before_timing(tmp_path, capsys, argv, named):
    out = tmp_path / "bench"
    refused(capsys, study(["bench", "--quick", "--device", "cpu", "--out", str(out), *argv]), "study bench: " + named)
    assert not out.exists()


# ---- a run that failed before its first step does not block the fixed rerun (N9) ---------------------------------
def plant_failed_run(tmp_path: Path, overrides: dict, step_files: bool) -> object:
    """A run folder made by a spec with other settings whose run failed before training (as a bad value refused
    inside the run left it), with a checkpoint when ``step_files``."""
    from study.sweep import run as sweep_run
    from study.sweep.config import build_plan

    old = build_plan(write_spec(tmp_path, {"temperature": [1.0]}, overrides)).runs[0]
    old.dir.mkdir(parents=True)
    sweep_run.write_settings(old)
    sweep_run.write_status(old.dir, {"name": old.name, "fingerprint": old.fingerprint, "depends": old.depends,
                                     "state": "failed", "reason": "ValueError: every_n_steps must be an integer >= 1"})
    if step_files:
        (old.dir / "checkpoints").mkdir()
        torch.save({"global_step": 2}, old.dir / "checkpoints" / "last.ckpt")
    return old


def test_a_run_that_failed_before_its_first_step_is_replaced_by_the_fixed_rerun(tmp_path, capsys):
    from study.sweep.command import _check_stale, _replace_unstarted
    from study.sweep.config import build_plan

    old = plant_failed_run(tmp_path, {"model.learning_rate": 0.05}, step_files=False)
    plan = build_plan(write_spec(tmp_path, {"temperature": [1.0]}, {"model.learning_rate": 0.001}))
    assert [run.name for run in _check_stale(plan)] == [old.name]  # not refused "made with other settings"
    _replace_unstarted(_check_stale(plan))
    assert not old.dir.exists()
    err = capsys.readouterr().err.strip()
    assert err == (f"study sweep: {old.dir} failed before its first step under other settings: replaced by this "
                   "sweep's run")


def test_a_run_with_a_checkpoint_under_other_settings_is_still_refused(tmp_path):
    from study.sweep.command import _check_stale
    from study.sweep.config import SweepConfigError, build_plan

    old = plant_failed_run(tmp_path, {"model.learning_rate": 0.05}, step_files=True)
    plan = build_plan(write_spec(tmp_path, {"temperature": [1.0]}, {"model.learning_rate": 0.001}))
    with pytest.raises(SweepConfigError, match="was made with other settings"):
        _check_stale(plan)
    assert (old.dir / "checkpoints" / "last.ckpt").is_file()


# ---- N15: messages that name the file or the value ---------------------------------------------------------------
def test_ckpt_path_missing_or_a_folder_is_named(nothing_built, tmp_path, capsys):
    missing = tmp_path / "nope.ckpt"
    err = refused(capsys, study(["fit", "--config", str(DEFAULT), f"--ckpt_path={missing}"]))
    assert err.startswith(f"study fit: --ckpt_path {missing}: no such file") and "damaged" not in err
    err = refused(capsys, study(["fit", "--config", str(DEFAULT), "--ckpt_path", str(tmp_path)]))
    assert err.startswith(f"study fit: --ckpt_path {tmp_path} is a folder, not a checkpoint file")
    assert nothing_built == []


class Planted:
    """An object no checkpoint holds: unpickling it by torch's full unpickler would call its class."""


def pickled_files(tmp_path: Path) -> dict[str, Path]:
    bare = tmp_path / "model.pkl"
    bare.write_bytes(pickle.dumps({"weights": [1.0, 2.0]}))
    saved = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(2)}, saved)
    code = tmp_path / "model.ckpt"
    torch.save({"state_dict": {}, "planted": Planted()}, code)
    return {"bare": bare, "saved": saved, "code": code}


@pytest.mark.parametrize("kind", ["bare", "saved", "code"])
def test_a_pickled_model_file_is_refused_as_a_pickle_in_fit(nothing_built, tmp_path, capsys, kind):
    path = pickled_files(tmp_path)[kind]
    err = refused(capsys, study(["fit", "--config", str(DEFAULT), f"--model.model_name_or_path={path}"]),
                  f"model.model_name_or_path = '{path}': a pickle file (torch.save), refused: pickles are never loaded")
    assert "weights_only" not in err and nothing_built == []


@pytest.mark.parametrize("verb", ["probe", "analyze"])
@pytest.mark.parametrize("kind", ["bare", "saved", "code"])
def test_a_pickled_model_file_is_refused_in_probe_and_analyze(tmp_path, capsys, verb, kind):
    path = pickled_files(tmp_path)[kind]
    code = study([verb, "--model", str(path), "--text", "shakespeare", "--out", str(tmp_path / "out")])
    err = refused(capsys, code, str(path))
    assert "weights_only=False" not in err
    assert ("pickle file: refused, pickles are never loaded" in err) if kind != "code" else (
        "is not a checkpoint to load" in err and "Planted" in err and "never unpickled beyond data" in err)
    assert not (tmp_path / "out").exists()


def test_a_killed_run_process_is_named_by_its_signal_not_its_last_log_line(tmp_path):
    from study.sweep.config import build_plan
    from study.sweep.pool import finish_subprocess, launch_subprocess

    run = build_plan(write_spec(tmp_path, {"temperature": [1.0]})).runs[0]
    proc = launch_subprocess([sys.executable, "-c", "import os, signal; print('Seed set to 0', flush=True); "
                              "os.kill(os.getpid(), signal.SIGKILL)"], run)
    proc.wait()
    status = finish_subprocess(proc, run)
    assert status["state"] == "failed" and status["reason"] == "run process killed by SIGKILL"
    assert json.loads((run.dir / "status.json").read_text())["reason"] == "run process killed by SIGKILL"


def test_a_full_disk_at_the_plan_write_names_plan_json_and_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    from study import atomic

    real = os.fdopen

    class Full:
        def __init__(self, fd):
            self.file = real(fd, "wb")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    class FullDisk:  # the `os` that study.atomic sees: every file it writes meets a full disk
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def fdopen(fd, mode="r"):
            return Full(fd)

    monkeypatch.setattr(atomic, "os", FullDisk())
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    code = study(["sweep", "--config", str(spec), "--no-estimate"])
    err = capsys.readouterr().err.strip()
    sweep = tmp_path / "logs" / "tiny"
    assert code == 1 and len(err.splitlines()) == 1, err
    assert f"No space left on device: '{sweep / 'plan.json'}'" in err
    # no 0-byte .plan.json.<...> left beside it; the spec's lock (`study.sweep.spec_identity`) is the sweep's own
    assert sorted(p.name for p in sweep.iterdir() if not p.name.startswith("spec.")) == []
