"""configs/sweeps/wortsman.yaml, the pre-registered Wortsman-scale design (docs/findings.md), and its parts
(configs/sweeps/wortsman/part-NN.yaml): the design as registered, the parts its runs exactly and disjointly, and the
same plan on a GPU (`--trainer.accelerator=gpu`: only that argument added; dry run, no training)."""

from __future__ import annotations

import pytest

from study.sweep import build_plan, main
from tests.test_sweep import ROOT

DESIGN = ROOT / "configs" / "sweeps" / "wortsman.yaml"
PARTS = sorted((ROOT / "configs" / "sweeps" / "wortsman").glob("part-*.yaml"))
LRS = [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0]


def arm(run) -> str:
    p = run.params
    if p["normalizer"] == "uniform":
        return "uniform"
    return "qk_norm" if p["qk_norm"] else "output_gate" if p["output_gate"] else "softmax"


def fit_args(run, plan):
    """A run's `study fit` arguments with its own folder names out (what any two plans of one run share)."""
    return [a.replace(plan.sweep_dir.name, "SWEEP") for a in run.args]


@pytest.mark.slow
def test_design_is_the_registered_grid_and_its_parts_run_it_exactly():
    design = build_plan(DESIGN)
    seeds = sorted({r.params["seed"] for r in design.runs})
    assert seeds == list(range(100, 116))
    assert len(design.runs) == len(seeds) * (3 * len(LRS) * 3 + len(LRS))  # 3 arms x T x LR, uniform at T = 1
    for name in ("softmax", "qk_norm", "output_gate"):
        runs = [r for r in design.runs if arm(r) == name]
        assert {r.params["temperature"] for r in runs} == {0.03, 0.1, 1.0}
        assert sorted({r.params["learning_rate"] for r in runs}) == LRS
    assert {r.params["temperature"] for r in design.runs if arm(r) == "uniform"} == {1.0}
    model, trainer = design.runs[0].resolved["model"], design.runs[0].resolved["trainer"]
    assert (model["n_layer"], model["n_head"], model["n_embd"]) == (2, 4, 128)
    assert trainer["max_steps"] == 1000 and model["warmup_steps"] == 100  # at least 1,000 steps, 10% warm-up
    assert design.runs[0].resolved["data"]["vocab_size"] == 512
    callbacks = {c["class_path"].rsplit(".", 1)[-1]: c.get("init_args", {}) for c in trainer["callbacks"]}
    assert {"NgramBaseline", "AttentionLogitMonitor", "EntropyCollapseAlert"} <= set(callbacks)
    assert callbacks["AttentionLogitMonitor"]["every_n_steps"] == 10  # findings 3 and 4 read these every 10 steps
    assert callbacks["EntropyCollapseAlert"]["action"] == "warn"

    # the parts: one seed each, every seed once, each run argument for argument the design's
    reference = {r.name: fit_args(r, design) for r in design.runs}
    covered = []
    assert len(PARTS) == len(seeds)
    for path in PARTS:
        part = build_plan(path)
        assert part.sweep_dir.name == f"wortsman-{path.stem}" and len(part.runs) == 90
        covered += sorted({r.params["seed"] for r in part.runs})
        for run in part.runs:
            assert fit_args(run, part) == reference[run.name], run.name
    assert sorted(covered) == seeds  # disjoint and complete: the pooled page refuses a seed in two parts


@pytest.mark.slow
def test_a_part_plans_unchanged_on_a_gpu(capsys, tmp_path):
    """`--trainer.accelerator=gpu` adds that one argument to every run and changes nothing else: the same runs, names,
    settings and order (nothing is trained: this machine has no GPU)."""
    cpu = build_plan(PARTS[0], save_dir=str(tmp_path))
    gpu = build_plan(PARTS[0], passthrough=["--trainer.accelerator=gpu"], save_dir=str(tmp_path))
    assert [r.name for r in gpu.runs] == [r.name for r in cpu.runs] and len(gpu.runs) == 90
    for c, g in zip(cpu.runs, gpu.runs):
        assert g.params == c.params and g.args == [*c.args, "--trainer.accelerator=gpu"]
        assert g.resolved["trainer"]["accelerator"] == "gpu" and c.resolved["trainer"]["accelerator"] == "auto"
        without = {**g.resolved, "trainer": {**g.resolved["trainer"], "accelerator": "auto"}}
        assert without == c.resolved
    # several runs per GPU: the worker processes take the GPU runs as they take CPU ones
    argv = ["--config", str(PARTS[0]), "--dry-run", "--workers", "2", "--trainer.accelerator=gpu",
            "--save-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "90 runs; nothing written" in out and out.count("--trainer.accelerator=gpu") == 90
    assert not list(tmp_path.iterdir())
