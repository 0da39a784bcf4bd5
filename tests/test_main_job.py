"""The main job's spec (configs/sweeps/default.yaml on SmolLM2-135M): what the report's rules need, and that its
`study fit` arguments parse. Nothing here loads the 135 M model (`--print_config` exits before the model is built).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from study.sweep import SweepConfigError, build_plan
from tests.test_sweep import env

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "configs" / "sweeps" / "default.yaml"


def _print_config(args: list[str]) -> dict:
    result = subprocess.run([sys.executable, "-m", "study.cli", "fit", *args, "--print_config"], env=env(), cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout)


@pytest.mark.slow
def test_main_job_grid_gives_the_report_what_it_needs():
    plan = build_plan(MAIN)
    arm = [r for r in plan.runs if r.params["optimizer"] == "sgd"]
    plan.runs = [r for r in plan.runs if r not in arm]
    selection = [r for r in plan.runs if r.params["top_k"] is not None]  # the top-k arm: described, not pooled
    plan.runs = [r for r in plan.runs if r not in selection]
    temperatures = sorted({r.params["temperature"] for r in plan.runs})
    seeds = {r.params["seed"] for r in plan.runs}
    assert 1 in temperatures and temperatures[0] <= 0.03  # stock, and where the instability claim bites
    # the gradient slopes are fitted on the float64 step-0 gradients, so every level counts: the last layer is
    # judged in the paper's regime, which needs 3 levels at T <= 0.1, and the depth rows need levels above it too
    assert len([t for t in temperatures if t <= 0.1]) >= 3 and len([t for t in temperatures if t > 0.1]) >= 2
    assert "seed: null" in (ROOT / "configs" / "smollm2.yaml").read_text().split("Fp64GradientCheck")[1][:200]
    # the training slopes' replicates (docs/findings.md#power): 4 seeds decide them at 5 levels
    assert len(seeds) >= 4
    top_ks = {r.params["top_k"] for r in selection}
    assert top_ks and 1 not in top_ks  # top-1 is identical across T by construction
    # the top-8 arm is described beside the main arm (figures, per-T table), not fitted: the grid's two ends show it
    picked = sorted({r.params["temperature"] for r in selection})
    assert set(picked) <= set(temperatures) and {picked[0], picked[-1]} == {temperatures[0], 1}
    assert plan.pretrain is None and len(plan.runs) == len(temperatures) * len(seeds)
    # the instability arm: SGD at the lowest T and T = 1, at 2 learning rates, for the learning-rate bracket
    assert {(r.params["temperature"], r.params["learning_rate"]) for r in arm} == {
        (t, lr) for t in (temperatures[0], 1) for lr in {r.params["learning_rate"] for r in arm}}
    assert len({r.params["learning_rate"] for r in arm}) >= 2 and all(r.params["top_k"] is None for r in arm)
    config = _print_config(arm[0].args)
    assert config["model"]["optimizer"] == "sgd" and config["model"]["learning_rate"] == arm[0].params["learning_rate"]
    baseline = next(cb for cb in config["trainer"]["callbacks"] if cb["class_path"].endswith("BaselineValidation"))
    assert baseline["init_args"]["seed"] in {r.params["seed"] for r in plan.runs} - {arm[0].params["seed"]}


@pytest.mark.slow
def test_main_job_runs_fine_tune_smollm2_unclipped_without_checkpoints():
    plan = build_plan(MAIN)
    run = next(r for r in plan.runs if r.params["top_k"] == 8 and r.params["temperature"] == 0.01)
    config = _print_config(run.args)
    assert config["model"]["model_name_or_path"] == "smollm2-135m"
    assert config["data"]["tokenizer"] == "auto" and config["data"]["max_val_blocks"] is not None
    trainer = config["trainer"]
    assert trainer["gradient_clip_val"] is None
    assert trainer["val_check_interval"] == trainer["max_steps"]  # validation at the end
    assert trainer["enable_checkpointing"] is False
    names = [cb["class_path"].rsplit(".", 1)[-1] for cb in trainer["callbacks"]]
    assert "ModelCheckpoint" not in names and "NonFiniteGuard" in names
    # Every monitor of configs/default.yaml is on, and logs at step 0 and every few steps.
    default = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    monitors = {cb["class_path"].rsplit(".", 1)[-1] for cb in default["trainer"]["callbacks"]
                if cb["class_path"].startswith("study.callbacks")}
    assert monitors <= set(names)
    # the stability literature's signals, added by the sweep (max logit, sinks, the collapse alert)
    assert {"AttentionLogitMonitor", "AttentionSinkMonitor", "EntropyCollapseAlert"} <= set(names)
    for cb in trainer["callbacks"]:
        every = (cb.get("init_args") or {}).get("every_n_steps")
        if not cb["class_path"].startswith("study.callbacks") or every is None:
            continue
        if cb["class_path"].endswith("AttentionMapMonitor"):
            # the maps are drawn before and after training only (each drawing step costs 6 maps and 6 pairs)
            assert every == trainer["max_steps"], cb
        else:
            assert every <= trainer["max_steps"] // 2, cb
    selection = next(cb for cb in trainer["callbacks"] if cb["class_path"].endswith("SelectionUniformityMonitor"))
    assert 8 in selection["init_args"]["selection_ks"]  # selection uniformity at the grid's fixed k


@pytest.mark.slow
def test_quick_is_the_small_gpt2_pipeline():
    quick = build_plan(MAIN, quick=True)
    assert quick.pretrain is not None and len(quick.runs) == 18 + 4 and quick.sweep_dir.name == "default-quick"  # 3 T x 2 k x 3 seeds, SGD arm
    pretrain = _print_config(quick.pretrain.args)
    assert pretrain["model"]["model_name_or_path"] is None and pretrain["model"]["n_layer"] == 2
    assert pretrain["model"]["trainable"] == "all"  # a model from scratch trains everything
    assert all("--model.trainable=all" in r.args and "--model.n_layer=2" in r.args for r in quick.runs)
    assert all(f"--model.model_name_or_path={quick.pretrain.dir / 'hf'}" in r.args for r in quick.runs)
    maps = next(cb for cb in pretrain["trainer"]["callbacks"] if cb["class_path"].endswith("AttentionMapMonitor"))
    assert maps["init_args"]["layers"] == [0, 1]  # the callback override reaches `study fit`


def _layer_indices(node, path=""):
    """Every (dotted path, index) of a `layers` list anywhere in a resolved config (callbacks' init_args included)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "layers" and isinstance(value, list):
                yield from ((f"{path}{key}", index) for index in value)
            else:
                yield from _layer_indices(value, f"{path}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            name = value.get("class_path", str(i)).rsplit(".", 1)[-1] if isinstance(value, dict) else str(i)
            yield from _layer_indices(value, f"{path}{name}.")


@pytest.mark.parametrize("spec", sorted(p.name for p in (ROOT / "configs" / "sweeps").glob("*.yaml")
                                        if "quick" in yaml.safe_load(p.read_text())))
def test_quick_layer_indices_exist_in_the_quick_model(spec):
    """Every layer index of every quick run (pretraining included) names a layer of the model that run trains: the
    quick pipeline shrinks the model, so each layer-indexed option of the base config must shrink with it."""
    quick = build_plan(ROOT / "configs" / "sweeps" / spec, quick=True)
    runs = [quick.pretrain, *quick.runs] if quick.pretrain else quick.runs
    found = 0
    for run in runs:
        model = run.resolved["model"]
        if quick.pretrain and run is not quick.pretrain:
            assert model["model_name_or_path"] == str(quick.pretrain.dir / "hf")
            n_layer = quick.pretrain.resolved["model"]["n_layer"]
            assert model.get("n_layer", n_layer) == n_layer  # the timing probe builds the same model
        else:
            assert model.get("model_name_or_path") is None, "a quick run on a hub model: count its layers here"
            n_layer = model["n_layer"]
        for where, index in _layer_indices(run.resolved):
            found += 1
            assert 0 <= index < n_layer, f"{run.name}: {where} = {index}, but the model has {n_layer} layers"
    if spec == "default.yaml":
        assert found >= 2 * len(runs)  # the map monitor's layers were seen in every run


def test_callback_override_names_a_base_callback_and_its_argument(tmp_path):
    def spec(key):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump({"base": str(ROOT / "configs" / "smollm2.yaml"), "grid": {"seed": [0]},
                                        "overrides": {key: [0]}}))
        return path

    plan = build_plan(spec("trainer.callbacks.AttentionMapMonitor.layers"))
    maps = [cb for cb in plan.runs[0].resolved["trainer"]["callbacks"] if cb["class_path"].endswith("MapMonitor")]
    assert maps[0]["init_args"] == {"every_n_steps": 10, "layers": [0], "heads": [0, 1]}
    assert not any("trainer.callbacks.AttentionMapMonitor" in arg for arg in plan.runs[0].args)
    with pytest.raises(SweepConfigError, match="no callback 'AttentionMapMonitr'.*did you mean 'AttentionMapMonitor'"):
        build_plan(spec("trainer.callbacks.AttentionMapMonitr.layers"))
    with pytest.raises(SweepConfigError, match="takes no argument 'layer'.*did you mean 'layers'"):
        build_plan(spec("trainer.callbacks.AttentionMapMonitor.layer"))
    with pytest.raises(SweepConfigError, match="<ClassName>.<init_arg>"):
        build_plan(spec("trainer.callbacks.AttentionMapMonitor"))


def test_fuller_smollm2_sweep_parses():
    """10 seeds per temperature for the training findings; every learning-rate cell of the instability design
    replicated (3 seeds), at the lowest T and at T = 1."""
    plan = build_plan(ROOT / "configs" / "sweeps" / "smollm2-full.yaml")
    grid = [r for r in plan.runs if r.params["optimizer"] == "adamw" and r.params["learning_rate"] == 3e-4]
    assert len(grid) == 30 and len({r.params["seed"] for r in grid}) == 10
    cells: dict = {}
    for r in plan.runs:
        if r not in grid:
            key = (r.params["optimizer"], r.params["temperature"], r.params["learning_rate"])
            cells.setdefault(key, set()).add(r.params["seed"])
    assert {t for _, t, _ in cells} == {0.01, 1} and all(len(seeds) == 3 for seeds in cells.values())
    assert len([k for k in cells if k[0] == "sgd"]) == 2 * 5 and len(plan.runs) == 30 + 30 + 6
    assert all("--trainer.max_steps=24" in r.args for r in plan.runs)


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_the_probe_section_passes_the_probes_own_checks(quick):
    """The `probe:` section (and its quick override, merged key by key) gives `study probe` arguments it accepts:
    a quick grid that drops a T the full section's fp64 or Hessian list names failed the quick pipeline's probe."""
    from study.frozen.probe.command import build_parser, check_numbers

    plan = build_plan(MAIN, quick=quick)
    check_numbers(build_parser().parse_args(plan.probe))


def test_fp64_t_grid_sweep_parses():
    """The main job's runs on a T grid between 0.1 and 1, where the whole-network and last-layer slopes keep at
    least 3 levels the step-0 fp64 check validates (the base config's Fp64GradientCheck, once per setting)."""
    plan = build_plan(ROOT / "configs" / "sweeps" / "smollm2-tgrid.yaml")
    main = build_plan(MAIN)
    assert {r.params["temperature"] for r in plan.runs} == {0.1, 0.2, 0.3, 0.5, 1} and len(plan.runs) == 20
    assert all(r.params["top_k"] is None for r in plan.runs) and len({r.params["seed"] for r in plan.runs}) == 4
    steps = {a for r in main.runs for a in r.args if a.startswith("--trainer.max_steps=")}
    assert all(steps <= set(r.args) for r in plan.runs) and len(steps) == 1  # the main job's 12 steps
    assert "Fp64GradientCheck" in (ROOT / "configs" / "smollm2.yaml").read_text()


def test_long_training_sweep_parses():
    """The 200-step design the gap and drift rows need: the main settings, 3 seeds, the fixed held-out batch."""
    plan = build_plan(ROOT / "configs" / "sweeps" / "smollm2-long.yaml")
    assert {r.params["temperature"] for r in plan.runs} == {0.01, 0.1, 1} and len(plan.runs) == 9
    assert all(r.params["top_k"] is None for r in plan.runs) and len({r.params["seed"] for r in plan.runs}) >= 3
    assert all("--trainer.max_steps=200" in r.args for r in plan.runs)
