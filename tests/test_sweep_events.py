"""A small sweep like `make quick` (a pretraining run, a grid of seeds, an SGD arm, the report), read back from its
event files as TensorBoard reads them: the first page holds at most six cards and no linear copy of its log10 ones,
every seed draws a step-0 validation point (the seed-0 run's, shared), the mean over seeds per T leads Custom
Scalars, every scalar's x axis is the step, validation logs every tag at one step, the monitors measure the run's
last step, and the report's Text and Images sit in the run "report"."""

from __future__ import annotations

import json
import re

import pytest

from study import tags
from study.report.read import SHARED_BASELINE_SUFFIX, read_scalars
from study.sweep import main
from study.sweep.seed_means import CATEGORY
from tests.tensorboard_reads import as_tensorboard_reads, merged_layout
from tests.test_sweep import write_spec

MAX_STEPS = 7  # the gradient monitor measures every 5 steps: 0 and 5, and the last step, 6


@pytest.mark.slow
def test_quick_like_sweep_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = write_spec(
        tmp_path, {"temperature": [0.1, 1.0], "top_k": [None], "seed": [0, 1, 2]},
        overrides={"trainer.max_steps": MAX_STEPS, "trainer.val_check_interval": MAX_STEPS,
                   "trainer.callbacks.BaselineValidation.seed": 0},  # the step-0 validation in seed 0 alone, as the demo
        arms=[{"optimizer": ["sgd"], "learning_rate": [0.01], "seed": [1]}], report=True,
        pretrain={"overrides": {"trainer.max_steps": 2, "trainer.val_check_interval": 2, "model.warmup_steps": 1}},
    )  # fmt: skip
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    sweep = tmp_path / "logs" / "tiny"
    runs = [sweep / run["name"] for run in json.loads((sweep / "plan.json").read_text())["runs"]]
    assert len(runs) == 8 and all(r.name.startswith("T") for r in runs)  # names lead with T: TensorBoard groups by it
    for run in runs:
        drawn = as_tensorboard_reads(run)
        # the first page: at most six cards, the question's quantities, no linear copy of a log10 card
        first = {tag for tag in drawn if tag.split("/", 1)[0] == tags.SUMMARY_GROUP}
        question = {tags.LOG10_GRAD_QK, tags.LOG10[tags.VAL_PPL], tags.LEADING[tags.attention("normalized_entropy")],
                    tags.LEADING[tags.TRAIN_LOSS]}  # and the largest logit, in runs with AttentionLogitMonitor (the demo)
        assert len(first) <= tags.FIRST_PAGE_CARDS and question <= first <= set(tags.FIRST_PAGE), (run.name, first)
        assert not first & {tags.LEADING[tags.VAL_PPL], tags.LEADING[tags.GRAD_Q], tags.LEADING[tags.GRAD_K]}
        # every seed (and the SGD arm) draws a step-0 validation point, and its own final one after it
        for tag in (tags.VAL_LOSS, tags.LOG10[tags.VAL_PPL]):
            assert [step for step, _ in drawn[tag]] == [0, MAX_STEPS], (run.name, tag, drawn[tag])
        measured_here = run.name.endswith("_s0")
        assert any(run.glob("*" + SHARED_BASELINE_SUFFIX)) != measured_here, run.name
        scalars = read_scalars(run)
        # the report reads what the run measured: a borrowed step-0 point is not one
        assert [step for step, _ in scalars[tags.VAL_LOSS]] == ([0, MAX_STEPS] if measured_here else [MAX_STEPS])
        if not measured_here:
            lender = sweep / re.sub(r"_s\d+(_.*)?$", "_s0", run.name)  # seed 0 of its T (the main arm's setting)
            assert drawn[tags.VAL_LOSS][0] == as_tensorboard_reads(lender)[tags.VAL_LOSS][0]
        for source in (tags.GRAD_NORM, tags.TRAIN_PPL, tags.VAL_PPL, tags.GRAD_Q):  # the first screen, on log10
            assert tags.LOG10[source] in scalars, (run.name, source)
        for tag, series in scalars.items():
            steps = [step for step, _ in series]
            # the x axis is the optimizer step: within the run, increasing (no series over n or over T)
            assert steps == sorted(set(steps)) and 0 <= steps[0] and steps[-1] <= MAX_STEPS, (run.name, tag, steps)
        validation = {tag: series for tag, series in scalars.items() if tags.is_validation(tag)}
        last = {tag: series[-1][0] for tag, series in validation.items()}
        assert set(last.values()) == {MAX_STEPS}, (run.name, sorted(set(last.values())))  # one step per validation
        assert [step for step, _ in scalars[tags.GRAD_NORM]] == [0, 5, MAX_STEPS - 1]  # the last step is measured
    report = sweep / tags.REPORT_RUN
    acc = EventAccumulator(str(report), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    assert {tags.REPORT_SUMMARY, tags.REPORT_SCORECARD} <= set(acc.Tags()["tensors"])
    assert tags.report_figure("00_sensitivity_vs_T") in acc.Tags()["images"] and not acc.Tags()["scalars"]
    assert (report / "arms.png").is_file()  # the SGD arm drawn on its own
    text = (report / "report.md").read_text()
    assert text.index("## In plain words") < text.index("## Scorecard")
    # Custom Scalars: the mean over the 3 seeds per T leads the layout TensorBoard merges from every run
    assert sorted(p.name for p in (sweep / tags.SEED_MEAN_RUN).iterdir()) == ["T0.1", "T1"]
    layout = merged_layout(sweep)
    assert layout["category"][0]["title"] == CATEGORY and layout["category"][1]["title"] == "run summary"
    titles = [chart["title"] for category in layout["category"] for chart in category["chart"]]
    assert any("clipping" in title for title in titles)  # configs/default.yaml clips (the demo's smollm2.yaml does not)
    assert not any("collapse" in title for title in titles)  # a count that stays 0 is not drawn
    means = as_tensorboard_reads(sweep / tags.seed_mean_run("T0.1"))
    assert [step for step, _ in means[tags.seed_mean(tags.LOG10[tags.VAL_PPL], "mean")]] == [0, MAX_STEPS]

