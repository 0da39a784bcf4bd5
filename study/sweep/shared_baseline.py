"""The step-0 validation of a setting, written into each of its runs that did not measure it, labelled as shared.

A sweep validates the pretrained model before the first update once per attention setting (T, k, normaliser):
`BaselineValidation(seed=0)` in the seed-0 runs, since that model depends on the setting and the validation set only,
not on the seed or the optimizer (a validation pass over a real model costs as much as several training steps). The
other runs of the setting would then start their validation curves at the end, a lone point. So when the runs are
done, the lending run's step-0 validation scalars (every `tags.is_validation` tag it logged at step 0) are copied
into each borrowing run's folder, in an event file of their own (`read.SHARED_BASELINE_SUFFIX`) with a Text entry
(`tags.SHARED_BASELINE`) naming the run they come from. Nothing is recomputed. TensorBoard draws the copies; the
report's reader leaves them out (`read.read_scalars`) and shares the baseline itself, once per setting, so no copy
counts as a measurement.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from study import tags
from study.atomic import create_folder_exclusively, remove_entry
from study.report.read import EVENT_FILES, RESULT_STATES, SHARED_BASELINE_SUFFIX, RunData
from study.report.summary import baseline_setting
from study.report.tensorboard import text_value
from study.sweep.config import Run


def _step0(scalars: dict[str, list[tuple[int, float]]]) -> dict[str, float]:
    """The validation values logged at step 0 when a later value follows (a baseline, not a run that stopped at 0)."""
    return {tag: series[0][1] for tag, series in scalars.items()
            if tags.is_validation(tag) and len(series) >= 2 and series[0][0] == 0}  # fmt: skip


def note(lender: str, copied: list[str]) -> str:
    """The Text entry of a borrowing run: where its step-0 validation comes from and why it is not measured."""
    return (f"The step-0 validation of this run ({len(copied)} tags, {tags.VAL_LOSS} among them) is **shared**: copied "
            f"from run `{lender}`, not measured here. Before the first update the model is the pretrained one under "
            f"the same attention setting, validated on the same batches, so the value is the same in every run of "
            f"the setting; the report counts it once per setting.")


SHARED_FILE = "events.out.tfevents.0000000000" + SHARED_BASELINE_SUFFIX
"""The copy's file name: it sorts before the run's own files (theirs carry the time they were written). TensorBoard
reads a run's files in name order and keeps each series' points in the order read: after the run's own file, the
step-0 point would come after the run's last step, and a loader that takes a lower step for a restart (TensorBoard
does, for files without a file version) would drop the run's later points."""


WRITING = "shared_baseline"  # the copy is written in a new folder beside it (`atomic.create_folder_exclusively`)


def _write(run_dir: Path, lender: str, values: dict[str, float]) -> None:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    # not the run's folder: a kill leaves no half copy that a reader takes for the run's; a new folder of an
    # unpredictable name, so that no link planted in the run's folder is followed
    aside = create_folder_exclusively(run_dir, WRITING)
    writer = EventFileWriter(str(aside))
    now = time.time()
    scalars = [Summary.Value(tag=tag, simple_value=value) for tag, value in sorted(values.items())]
    writer.add_event(Event(wall_time=now, step=0, summary=Summary(value=scalars)))
    text = text_value(tags.SHARED_BASELINE, note(lender, sorted(values)))
    writer.add_event(Event(wall_time=now, step=0, summary=Summary(value=[text])))
    writer.close()
    (written,) = aside.glob(EVENT_FILES)
    os.replace(written, run_dir / SHARED_FILE)
    aside.rmdir()


def share_step0_validation(runs: list[Run], states: dict[str, str],
                           scalars: dict[str, dict[str, list[tuple[int, float]]]]) -> dict[str, str]:  # fmt: skip
    """Copy each setting's step-0 validation into its runs that lack it (see the module docstring), replacing earlier
    copies; ``states`` and the measured ``scalars`` (`read.read_scalars`) by run name. Returns {borrowing run:
    lending run}. Runs that did not end with a result neither lend nor borrow; the lender of a setting is its first
    run in plan order that measured the baseline."""
    done: list[tuple[Run, RunData]] = []
    for run in runs:
        for old in run.dir.glob(EVENT_FILES + SHARED_BASELINE_SUFFIX):
            old.unlink()  # an earlier copy
        for left in run.dir.glob(f".{WRITING}.*.tmp"):  # one a kill left half written; a link is removed, not followed
            remove_entry(left)
        if states.get(run.name) in RESULT_STATES and run.name in scalars:
            done.append((run, RunData(run.name, run.dir, run.params, {"state": states[run.name]}, run.resolved)))
    lenders: dict[tuple, str] = {}
    for run, data in done:
        if (key := baseline_setting(data)) is not None and tags.VAL_LOSS in _step0(scalars[run.name]):
            lenders.setdefault(key, run.name)
    shared: dict[str, str] = {}
    for run, data in done:
        key = baseline_setting(data)
        lender = lenders.get(key) if key is not None else None
        if lender is None or lender == run.name:
            continue
        at_step0 = {tag for tag, series in scalars[run.name].items() if series and series[0][0] == 0}
        missing = {tag: value for tag, value in _step0(scalars[lender]).items() if tag not in at_step0}
        if missing:
            _write(run.dir, lender, missing)
            shared[run.name] = lender
    return shared


__all__ = ["SHARED_FILE", "note", "share_step0_validation"]
