"""A small sweep like `make quick` (a grid, an SGD arm, the report), read back from its event files: the first
screen's log10 tags are there, every scalar's x axis is the step, validation logs every tag at one step, the
monitors measure the run's last step, and the report's Text and Images sit in the run "report"."""

from __future__ import annotations

import pytest

from study import tags
from study.report.read import read_scalars
from study.sweep import main
from tests.test_sweep import write_spec

MAX_STEPS = 7  # the gradient monitor measures every 5 steps: 0 and 5, and the last step, 6


@pytest.mark.slow
def test_quick_like_sweep_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = write_spec(
        tmp_path, {"temperature": [0.1, 1.0], "top_k": [None], "seed": [0, 1, 2]},
        overrides={"trainer.max_steps": MAX_STEPS, "trainer.val_check_interval": MAX_STEPS},
        arms=[{"optimizer": ["sgd"], "learning_rate": [0.01], "seed": [1]}], report=True,
    )  # fmt: skip
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    sweep = tmp_path / "logs" / "tiny"
    runs = sorted(p for p in sweep.iterdir() if (p / "status.json").is_file())
    assert len(runs) == 8 and all(r.name.startswith("T") for r in runs)  # names lead with T: TensorBoard groups by it
    for run in runs:
        scalars = read_scalars(run)
        for source in (tags.GRAD_NORM, tags.TRAIN_PPL, tags.VAL_PPL, tags.GRAD_Q):  # the first screen, on log10
            assert tags.LOG10[source] in scalars, (run.name, source)
        for tag, series in scalars.items():
            steps = [step for step, _ in series]
            # the x axis is the optimizer step: within the run, increasing (no series over n or over T)
            assert steps == sorted(set(steps)) and 0 <= steps[0] and steps[-1] <= MAX_STEPS, (run.name, tag, steps)
        validation = {tag: series for tag, series in scalars.items() if tag.startswith(("val/", tags.SUMMARY_VAL_GROUP))}
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
