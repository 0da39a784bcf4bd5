"""The grid's axes are declared once (`study.sweep.axes`): names, options, checks and HParams come from that table."""

from __future__ import annotations

import pytest

from study import tags
from study.attention import AttentionSpec
from study.hparams import STUDY_AXES
from study.report.build import other_axes
from study.report.read import RunData
from study.report.summary import summarize
from study.sweep import axes
from study.sweep.axes import AXES, Axis, exact, grid_keys, run_name
from study.sweep.config import SweepConfigError, build_plan
from tests.test_sweep import write_spec


def test_run_names_are_unchanged_for_the_four_paper_axes():
    params = {"temperature": 0.1, "top_k": None, "normalizer": "softmax", "seed": 2, "learning_rate": 1e-3}
    assert run_name(params) == "T0.1_kall_softmax_s2"  # learning_rate named only when the grid varies it
    assert run_name({**params, "top_k": 4}, swept={"learning_rate"}) == "T0.1_k4_softmax_s2_lr0.001"
    assert exact(1.0) == "1" and exact(0.1234561) == "0.1234561" and exact(3e-05) == "3e-05"


def test_every_axis_labels_distinct_values_distinctly():
    samples = {"temperature": [0.1, 0.10000001, 1], "top_k": [None, 1, 16], "normalizer": ["softmax", "ssmax"],
               "seed": [0, 10], "learning_rate": [1e-3, 1.0001e-3], "optimizer": ["adamw", "sgd"],
               "qk_norm": [False, True], "temperature_in": ["softmax", "init"], "output_gate": [False, True]}
    assert set(samples) == set(grid_keys())  # a new axis needs a sample here
    for axis in AXES:
        labels = [axis.label(v) for v in samples[axis.key]]
        assert len(set(labels)) == len(labels), axis.key


def test_a_swept_learning_rate_reaches_options_names_and_hparams(tmp_path):
    plan = build_plan(write_spec(tmp_path, {"learning_rate": [1e-3, 3e-3], "temperature": [0.5]}))
    assert [r.name for r in plan.runs] == ["T0.5_kall_softmax_s0_lr0.001", "T0.5_kall_softmax_s0_lr0.003"]
    assert "--model.learning_rate=0.003" in plan.runs[1].args
    assert plan.runs[1].resolved["model"]["learning_rate"] == 0.003
    domains = plan.hparams_domains()
    assert domains["learning_rate"] == [1e-3, 3e-3] and domains["attention/temperature"] == [0.5, 0.5]
    assert domains["attention/top_k"] == ["all", "all"]  # labelled as the module writes it


def test_the_qk_norm_arm_and_the_init_scale_control_reach_options_and_names(tmp_path):
    plan = build_plan(write_spec(tmp_path, {"temperature": [0.1], "qk_norm": [True]}))
    assert [r.name for r in plan.runs] == ["T0.1_kall_softmax_s0_qkn"]
    assert plan.runs[0].resolved["model"]["attention"]["qk_norm"] is True
    plan = build_plan(write_spec(tmp_path, {"temperature": [0.1], "temperature_in": ["init"]}))
    assert [r.name for r in plan.runs] == ["T0.1_kall_softmax_s0_Tininit"]
    assert plan.runs[0].resolved["model"]["temperature_in"] == "init"
    assert plan.hparams_domains()["temperature_in"] == ["init"]


def test_an_axis_left_out_takes_the_value_the_runs_get(tmp_path):
    """Without a grid entry, an axis's recorded value is the override's, else the base config's (never a guess)."""
    plan = build_plan(write_spec(tmp_path, {"seed": [0]}, {"model.learning_rate": 0.002}))
    assert plan.runs[0].params["learning_rate"] == 0.002
    assert plan.runs[0].params["temperature"] == 1.0 and plan.runs[0].params["top_k"] is None


@pytest.mark.parametrize(
    ("grid", "message"),
    [({"learning_rate": [0]}, "grid `learning_rate` value 0 is invalid"),
     ({"learning_rate": [float("nan")]}, "finite number > 0"),
     ({"seed": [-1]}, "non-negative integer")],
)
def test_axis_checks_run_before_any_run(tmp_path, grid, message):
    with pytest.raises(SweepConfigError, match=message):
        build_plan(write_spec(tmp_path, grid))


def test_an_override_of_a_swept_axis_is_refused(tmp_path):
    with pytest.raises(SweepConfigError, match=r"\['model.learning_rate'\], which the grid varies"):
        build_plan(write_spec(tmp_path, {"learning_rate": [1e-3]}, {"model.learning_rate": 0.1}))


def test_study_fit_alone_puts_the_attention_axes_of_the_table_first():
    """`study fit` alone (no sweep) marks `hparams.STUDY_AXES` as differing: the table's attention axes, in order."""
    assert STUDY_AXES == tuple(a.hparam for a in AXES if a.option.startswith("model.attention."))


def _check_alpha(value):
    AttentionSpec(normalizer="entmax", alpha=value)  # alpha is read by entmax only


ALPHA = Axis("alpha", "model.attention.alpha", tags.attention_hparam("alpha"), lambda v: f"a{exact(v)}", _check_alpha,
             default=1.5, always_named=False)


def test_an_axis_is_one_entry_of_the_table(tmp_path, monkeypatch):
    """Adding `alpha` (entmax) in this test only: the grid accepts it, runs get its option, their names its part,
    the sweep's HParams experiment its column, duplicates merge, bad values are refused, the report flags it."""
    monkeypatch.setattr(axes, "AXES", (*AXES, ALPHA))
    spec = write_spec(tmp_path, {"alpha": [1.5, 2, 2.0], "temperature": [0.5]}, {"model.attention.normalizer": "entmax"})
    plan = build_plan(spec)
    assert [r.name for r in plan.runs] == ["T0.5_kall_entmax_s0_a1.5", "T0.5_kall_entmax_s0_a2"]
    assert plan.notes == ["grid `alpha` lists 2 and 2.0, the same setting: merged into one run"]
    assert "--model.attention.alpha=2" in plan.runs[1].args
    assert plan.runs[1].resolved["model"]["attention"]["alpha"] == 2
    assert plan.runs[0].params == {"temperature": 0.5, "top_k": None, "normalizer": "entmax", "seed": 0,
                                   "learning_rate": plan.runs[0].params["learning_rate"], "optimizer": "adamw",
                                   "qk_norm": False, "temperature_in": "softmax", "output_gate": False, "alpha": 1.5}
    assert plan.hparams_domains()[tags.attention_hparam("alpha")] == [1.5, 2]
    assert plan.as_dict()["grid_keys"][-1] == "alpha"
    with pytest.raises(SweepConfigError, match="grid `alpha` value 'x' is invalid"):
        build_plan(write_spec(tmp_path, {"alpha": ["x"]}))
    with pytest.raises(SweepConfigError, match=r"\['model.attention.alpha'\], which the grid varies"):
        build_plan(write_spec(tmp_path, {"alpha": [2]}, {"model.attention.alpha": 2}))
    # Left out of the grid, the axis takes the runs' value and stays out of their names: existing folders keep theirs.
    plain = build_plan(write_spec(tmp_path, {"temperature": [0.5]}))
    assert plain.runs[0].name == "T0.5_kall_softmax_s0" and plain.runs[0].params["alpha"] == 1.5
    # The report's one place for axes: findings pool over alpha's values, and say so.
    runs = [summarize(RunData(r.name, r.dir, r.params, {}, r.resolved)) for r in plan.runs]
    assert other_axes(runs) == ["alpha"]


def test_extra_arguments_are_recorded_and_may_not_override_the_grid(tmp_path):
    """`study sweep ... --model.x=v` reaches every run: the plan records it (params, resolved config), and an extra
    argument that would silently replace a grid value (or the sweep's logger) is refused."""
    spec = write_spec(tmp_path, {"temperature": [0.1, 1.0]})
    plan = build_plan(spec, passthrough=["--trainer.gradient_clip_val=0.37", "--seed_everything=7"])
    assert plan.runs[0].resolved["trainer"]["gradient_clip_val"] == 0.37
    assert [r.params["seed"] for r in plan.runs] == [7, 7] and plan.runs[0].name == "T0.1_kall_softmax_s7"
    for extra in (["--model.attention.temperature=0.5"], ["--trainer.logger=false"]):
        with pytest.raises(SweepConfigError, match="which the sweep sets per run"):
            build_plan(spec, passthrough=extra)


def test_arms_add_runs_beside_the_main_grid_named_by_what_they_change(tmp_path):
    """An SGD learning-rate arm at two temperatures beside the main grid: the main runs keep their names and
    settings, the arm's runs carry their optimizer and learning rate in name, options and HParams."""
    arms = [{"optimizer": ["sgd"], "learning_rate": [0.01, 1.0], "temperature": [0.1, 1.0]}]
    plan = build_plan(write_spec(tmp_path, {"temperature": [0.1, 0.5, 1.0]}, arms=arms))
    names = [r.name for r in plan.runs]
    assert names[:3] == ["T0.1_kall_softmax_s0", "T0.5_kall_softmax_s0", "T1_kall_softmax_s0"]
    assert names[3:] == ["T0.1_kall_softmax_s0_lr0.01_sgd", "T0.1_kall_softmax_s0_lr1_sgd",
                         "T1_kall_softmax_s0_lr0.01_sgd", "T1_kall_softmax_s0_lr1_sgd"]  # fmt: skip
    sgd = plan.runs[4]
    assert {"--model.optimizer=sgd", "--model.learning_rate=1.0", "--model.attention.temperature=0.1"} <= set(sgd.args)
    assert not any(a.startswith("--model.optimizer") for a in plan.runs[0].args)
    assert plan.runs[0].params["optimizer"] == "adamw" and sgd.params["optimizer"] == "sgd"
    assert plan.hparams_domains()["optimizer"] == ["adamw"] * 3 + ["sgd"] * 4
    # an arm's value replaces an override for its runs only
    plan = build_plan(write_spec(tmp_path, {"temperature": [1.0]}, {"model.learning_rate": 0.002}, arms=arms[:1]))
    assert [r.params["learning_rate"] for r in plan.runs] == [0.002, 0.01, 1.0, 0.01, 1.0]
    assert "--model.learning_rate=1.0" in plan.runs[2].args


@pytest.mark.parametrize(
    ("arms", "message"),
    [([{"optimizer": ["adam"]}], "grid `optimizer` value 'adam' is invalid: optimizer must be one of"),
     ({"optimizer": ["sgd"]}, "`arms` must be a list of grids"),
     ([{"momentum": [0.9]}], "unknown key")],
)
def test_bad_arms_are_refused_before_any_run(tmp_path, arms, message):
    with pytest.raises(SweepConfigError, match=message):
        build_plan(write_spec(tmp_path, {"temperature": [1.0]}, arms=arms))
