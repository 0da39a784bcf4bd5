"""The from-scratch learning-rate sweeps: configs/sweeps/scratch.yaml (its plan, and its quick section end to end
with the report's learning-rate section) and the GPT-2 124M GPU spec (dry run, and its runs' arguments parse)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from study.sweep import build_plan, main
from tests.test_sweep import ROOT, env

SCRATCH = ROOT / "configs" / "sweeps" / "scratch.yaml"
GPU = ROOT / "configs" / "sweeps" / "scratch-gpt2-124m.yaml"


@pytest.mark.slow
def test_scratch_plan_is_temperature_by_lr_by_three_arms_by_seeds():
    plan = build_plan(SCRATCH)
    assert len(plan.runs) == 3 * 8 * 3 * 3 + 8 * 3  # T x LR x arms x seeds, and the uniform arm at T = 1
    arms = {(r.params["qk_norm"], r.params["temperature_in"], r.params["normalizer"]) for r in plan.runs}
    assert arms == {(False, "softmax", "softmax"), (True, "softmax", "softmax"), (False, "init", "softmax"),
                    (False, "softmax", "uniform")}
    assert {r.params["temperature"] for r in plan.runs if r.params["normalizer"] == "uniform"} == {1.0}
    run = next(r for r in plan.runs if r.params["qk_norm"])
    assert run.name.endswith("_qkn") and run.resolved["model"]["attention"]["qk_norm"] is True
    model = run.resolved["model"]
    assert model["model_name_or_path"] is None and model["independent_weight_decay"] is True
    assert model["betas"] == [0.9, 0.95] and model["adam_epsilon"] == 1e-8 and model["z_loss"] == 1e-4


REPLICATION = ROOT / "configs" / "sweeps" / "scratch-replication.yaml"


@pytest.mark.slow
def test_replication_trains_the_scratch_softmax_runs_on_fresh_seeds():
    """`extends: scratch.yaml`: every replication run is the scratch study's softmax run at the same T and LR with
    another seed, argument for argument (only the seed and the sweep's own folder differ)."""
    replication, scratch = build_plan(REPLICATION), build_plan(SCRATCH)
    assert len(replication.runs) == 2 * 8 * 12 + 8 * 12 and replication.sweep_dir.name == "scratch-replication"
    seeds = {r.params["seed"] for r in replication.runs}
    assert seeds == set(range(10, 22)) and not seeds & {r.params["seed"] for r in scratch.runs}
    assert {r.params["temperature"] for r in replication.runs} == {0.03, 1.0}
    assert {(r.params["qk_norm"], r.params["temperature_in"]) for r in replication.runs} == {(False, "softmax")}
    assert {r.params["normalizer"] for r in replication.runs} == {"softmax", "uniform"}

    def fit_args(run):
        return [a.replace(run.name, "RUN").replace(replication.sweep_dir.name, "SWEEP")
                .replace(scratch.sweep_dir.name, "SWEEP") for a in run.args if not a.startswith("--seed_everything=")]

    def key(run):
        return run.params["temperature"], run.params["learning_rate"], run.params["normalizer"]

    reference = {key(r): fit_args(r) for r in scratch.runs
                 if r.params["seed"] == 0 and not r.params["qk_norm"] and r.params["temperature_in"] == "softmax"}
    for run in replication.runs:
        assert fit_args(run) == reference[key(run)], run.name
        assert f"--seed_everything={run.params['seed']}" in run.args


@pytest.mark.slow
def test_gpu_spec_dry_runs_and_its_runs_parse(capsys):
    assert main(["--config", str(GPU), "--dry-run", "--save-dir", "/tmp/study-scratch-gpu-dry"]) == 0
    assert "252 runs" in capsys.readouterr().out
    plan = build_plan(GPU)
    run = next(r for r in plan.runs if r.params["temperature_in"] == "init")
    result = subprocess.run([sys.executable, "-m", "study.cli", "fit", *run.args, "--trainer.devices=4",
                             "--trainer.strategy=ddp", "--print_config"],
                            env=env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout)
    assert config["model"]["model_name_or_path"] is None and config["model"]["n_layer"] == 12
    assert config["model"]["n_embd"] == 768 and config["model"]["temperature_in"] == "init"
    assert config["data"]["dataset_config"] == "wikitext-103-raw-v1" and str(config["trainer"]["devices"]) == "4"


@pytest.mark.slow
def test_quick_runs_end_to_end_with_the_learning_rate_section(tmp_path):
    assert main(["--config", str(SCRATCH), "--quick", "--save-dir", str(tmp_path), "--no-estimate", "--workers", "2"]) == 0
    report = tmp_path / "scratch-quick" / "report"
    text = (report / "report.md").read_text()
    assert "## Learning-rate curves (from scratch)" in text
    assert "LR sensitivity and the largest stable LR per T" in text
    assert "not logged" not in text  # the spec's monitors give findings 3a (max logit) and 3b (collapse) their data
    assert (report / "lr_curves.png").stat().st_size > 1000
    data = json.loads((report / "report.json").read_text())["lr_curves"]
    assert data["grid"] == [0.001, 0.03, 1.0] and data["temperatures"] == [0.1, 1.0]
    assert {c["arm"] for c in data["curves"]} == {"softmax", "qk_norm", "init_scale", "output_gate", "uniform"}
    assert len(data["curves"]) == 4 * 2 * 2 + 2 and all(c["init_loss"] > 0 for c in data["curves"])
    gated = json.loads(next((tmp_path / "scratch-quick").glob("T1_*_gate/status.json")).read_text())
    assert gated["state"] == "finished" and "--model.attention.output_gate=true" in gated["args"]
    assert all(set(c["final_loss_by_lr"]) == {"0.001", "0.03", "1.0"} for c in data["curves"])
    assert set(data["baselines"]) == {"unigram", "bigram"} and data["baselines"]["bigram"] < data["baselines"]["unigram"]
    assert "n-gram baselines" in text
    assert [f["key"] for f in data["findings"]] == ["1", "2", "3a", "3b", "4a", "4b"]
