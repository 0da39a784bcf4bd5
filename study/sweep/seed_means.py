"""The main arm's mean over seeds at each temperature, as TensorBoard runs of their own: one line per T, with a band.

TensorBoard draws one line per run and cannot average runs, so a sweep of 4 seeds x 5 temperatures draws 20 lines
per chart. When the runs are done, the first page's quantities (`tags.FIRST_PAGE`) of the main arm's runs (the
setting `study.sweep.view.main_arm` names: the other arms are not averaged into it) are averaged over seeds at each
step and written into ``<sweep>/Mean_over_seeds/T<T>/`` (`tags.seed_mean_run`): the mean, and the 95% t-interval
over seeds as its band where at least `stats.MIN_REPLICATES` seeds measured the step, the range of the values
otherwise (a step-0 validation is measured once per setting and shared: its band is that one value). A step's
non-finite values (a diverged step) are left out of its mean. Each mean run declares a Custom Scalars category of
margin charts over these tags; the folder's capital sorts it before the runs (``T...``), and TensorBoard merges
layouts in run order, so that category comes first. A temperature with fewer than two finished seeds gets none.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from study import tags
from study.atomic import build_folder_whole, remove_entry
from study.report.read import RESULT_STATES
from study.report.stats import MIN_REPLICATES, TooFew, mean_interval
from study.report.tensorboard import text_value
from study.sweep import axes
from study.sweep.config import Run
from study.sweep.view import main_arm

CATEGORY = "by T: mean over seeds, band = 95% interval over seeds (main arm; the runs below)"
CHARTS = {
    tags.LOG10_GRAD_QK: "log10 gradient norm of W_q and W_k (whole network)",
    tags.LOG10[tags.VAL_PPL]: "log10 validation perplexity",
    tags.LEADING[tags.attention("normalized_entropy")]: "H / log n (layer mean)",
    tags.LEADING[tags.TRAIN_LOSS]: "training loss",
    tags.LEADING[tags.MAX_LOGIT]: "largest attention logit q.k / (T sqrt d)",
}
"""The first page's cards, each a margin chart of the mean runs, with its title."""


def step_mean(values: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high) of one step's values over seeds: the t-interval with enough seeds, else the range; None
    when no value is finite."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    if len(finite) >= MIN_REPLICATES:
        try:
            interval = mean_interval(finite, "seeds")
            return interval.estimate, interval.lo, interval.hi
        except TooFew:  # pragma: no cover - len(finite) >= MIN_REPLICATES
            pass
    return sum(finite) / len(finite), min(finite), max(finite)


def mean_series(per_run: list[dict[str, list[tuple[int, float]]]], tag: str) -> list[tuple[int, tuple[float, ...]]]:
    """[(step, (mean, low, high))] of ``tag`` over the runs' series, at every step any run logged it."""
    by_step: dict[int, list[float]] = {}
    for scalars in per_run:
        for step, value in scalars.get(tag) or []:
            by_step.setdefault(step, []).append(value)
    return [(step, band) for step in sorted(by_step) if (band := step_mean(by_step[step])) is not None]


def _layout_value():
    from tensorboard.compat.proto import types_pb2
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    margin = layout_pb2.MarginChartContent.Series
    charts = [layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[margin(
        value=tags.seed_mean(tag, "mean"), lower=tags.seed_mean(tag, "low"), upper=tags.seed_mean(tag, "high"))]))
        for tag, title in CHARTS.items()]  # fmt: skip
    layout = layout_pb2.Layout(category=[layout_pb2.Category(title=CATEGORY, chart=charts)])
    tensor = TensorProto(dtype=types_pb2.DT_STRING, string_val=[layout.SerializeToString()],
                         tensor_shape=TensorShapeProto())  # fmt: skip
    plugin = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME))
    return Summary.Value(tag=metadata.CONFIG_SUMMARY_TAG, tensor=tensor, metadata=plugin)


def about(temperature: float, names: list[str]) -> str:
    """The Text entry of a mean run: the runs it averages and what its band is."""
    return (f"The mean over {len(names)} seeds of the main arm at T = {temperature:g} ({', '.join(names)}), at each "
            f"step; the band is the 95% t-interval over seeds where {MIN_REPLICATES} or more measured the step, the "
            f"range of the values otherwise (the step-0 validation is measured once per setting and shared). "
            f"Non-finite values are left out of a step's mean.")


def write_seed_means(sweep_dir: Path, runs: list[Run], states: dict[str, str],
                     scalars: dict[str, dict[str, list[tuple[int, float]]]]) -> list[Path]:  # fmt: skip
    """Write the mean runs of ``runs`` (their ``states`` and measured ``scalars`` by name) under ``sweep_dir``,
    replacing earlier ones; returns their folders."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    main = main_arm((run.name, run.params) for run in runs)
    by_t: dict[float, list[Run]] = {}
    for run in runs:
        if run.name in main and states.get(run.name) in RESULT_STATES and run.name in scalars:
            by_t.setdefault(float(run.params["temperature"]), []).append(run)
    by_t = {t: members for t, members in sorted(by_t.items()) if len(members) >= 2}
    labels = {t: axes.axis("temperature").label(t) for t in by_t}

    def write(out: Path) -> None:
        for temperature, members in by_t.items():
            writer = EventFileWriter(str(out / labels[temperature]))
            now = time.time()
            text = text_value(tags.SEED_MEAN_TEXT, about(temperature, [run.name for run in members]))
            writer.add_event(Event(wall_time=now, step=0, summary=Summary(value=[_layout_value(), text])))
            points: dict[int, list] = {}
            for tag in CHARTS:
                for step, band in mean_series([scalars[run.name] for run in members], tag):
                    points.setdefault(step, []).extend(
                        Summary.Value(tag=tags.seed_mean(tag, part), simple_value=value)
                        for part, value in zip(tags.SEED_MEAN_PARTS, band))
            for step in sorted(points):
                writer.add_event(Event(wall_time=now, step=step, summary=Summary(value=points[step])))
            writer.close()

    final = Path(sweep_dir) / tags.SEED_MEAN_RUN
    if not by_t:  # no mean to draw: no empty folder for TensorBoard to list, and no stale means left beside the runs
        remove_entry(final)
        return []
    # built beside and swapped in whole, the earlier mean runs (or a link planted there, not followed) replaced
    build_folder_whole(final, write)
    return [Path(sweep_dir) / tags.seed_mean_run(labels[t]) for t in by_t]


__all__ = ["CATEGORY", "CHARTS", "about", "mean_series", "step_mean", "write_seed_means"]
