"""TensorBoard HParams: one experiment per sweep, one session per run.

TensorBoard's HParams tab shows the hyperparameters an *experiment* declares, swept ones first: it sorts them by
(not ``differs``, name) and checks only the first few. An experiment written by each run knows nothing of the
others, so nothing "differs" and the columns come out in name order (``attention/alpha`` ... with
``attention/temperature`` off screen). So:

- a sweep declares the experiment once, in ``<sweep>/hparams.json``, with every swept setting's discrete domain
  marked ``differs`` and listed first, constants after, and the metrics the runs are compared by
  (`write_experiment`); each of its runs writes that declaration and its session into its own event file
  (`write_session` with ``experiment=<that file>``). The declaration is not an event folder of its own: TensorBoard
  would list such a folder as a run with no data;
- a run on its own (`study fit`) declares a one-run experiment in which the attention spec's axes
  (`STUDY_AXES`) count as differing, so temperature, top-k and normaliser still come first.

Only one experiment may be visible under a TensorBoard logdir (TensorBoard takes the first it finds): open a
sweep's folder (``make tensorboard SWEEP=<sweep>``) to compare its runs.

The metrics are the numbers a run ends with: validation loss and perplexity, the layer-mean attention entropy and
Jacobian on validation, and the last training step's loss and gradient norms (HParams shows each tag's last value).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.plugins.hparams.metadata import (
    EXPERIMENT_TAG,
    PLUGIN_DATA_VERSION,
    PLUGIN_NAME,
    SESSION_END_INFO_TAG,
    SESSION_START_INFO_TAG,
)

from study import tags
from study.atomic import write_text_atomically

STUDY_AXES = tuple(tags.attention_hparam(f) for f in ("temperature", "top_k", "normalizer", "qk_norm", "output_gate"))
"""The hyperparameters a study varies; listed first wherever an experiment is declared."""

HPARAMS_METRICS = {
    tags.VAL_LOSS: "val loss",
    tags.LOG10[tags.VAL_PPL]: "log10 val perplexity",
    tags.GUARD_DIVERGED: "diverged (1: stopped by the guard)",
    tags.val(tags.attention("normalized_entropy")): "val H / log n (layer mean)",
    tags.LOG10[tags.GRAD_Q]: "log10 W_q grad norm (last logged step)",
    tags.LOG10[tags.val(tags.jacobian("mean"))]: "log10 val attention Jacobian (mean)",
    tags.LOG10[tags.GRAD_NORM]: "log10 grad norm (last logged step)",
    tags.val(tags.attention("entropy")): "val entropy (layer mean, nats)",
    tags.LOG10[tags.GRAD_K]: "log10 W_k grad norm (last logged step)",
    tags.TRAIN_LOSS: "train loss (last step)",
    tags.VAL_PPL: "val perplexity",
}
"""The metrics HParams compares runs by (their columns), with the names the columns show; TensorBoard ticks the
first five, so whether the run diverged, one attention and one gradient column are among them. Quantities that span decades across T are
shown as their log10 copies (`tags.LOG10`): HParams' parallel-coordinates axes are linear, and a diverged run's
perplexity of 1e9 put every other run on 0."""

LOG10_COLUMNS = {tags.attention_hparam("temperature"): "log10_T", "learning_rate": "log10_lr"}
"""Settings that span decades, each with a log10 column beside it: HParams' parallel-coordinates axes are linear, and
a learning rate of 0.0003 sat at the same spot as 0.01 (as T = 0.01 beside 0.03)."""


def with_log10_columns(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` ({name: value} or {name: [values]}) with each LOG10_COLUMNS column after its setting, where every
    value of the setting is a positive number."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        out[name] = value
        several = isinstance(value, (list, tuple))
        numbers = list(value) if several else [value]
        if name in LOG10_COLUMNS and numbers and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in numbers
        ):
            logs = [math.log10(float(v)) for v in numbers]
            out[LOG10_COLUMNS[name]] = logs if several else logs[0]
    return out


EXPERIMENT_FILE = "hparams.json"
"""A sweep's experiment declaration: ``<sweep>/hparams.json``, written into every run's events."""

Scalar = bool | int | float | str


def _summary(tag: str, **plugin_data: Any) -> Summary:
    # tensorboard's own `summary.experiment_pb` & co. need TensorFlow; the protos are the same.
    content = plugin_data_pb2.HParamsPluginData(version=PLUGIN_DATA_VERSION, **plugin_data)
    metadata = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content.SerializeToString())
    )
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata)])


def _kind(values: Sequence[Scalar]) -> int:
    if all(isinstance(v, bool) for v in values):
        return api_pb2.DATA_TYPE_BOOL
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        # HParams has no integer type and shows every number as "0.0000": a seed or a top-k reads as what it is
        # only as text ("0", "16"); `hparam_info` still orders such text by its number.
        return api_pb2.DATA_TYPE_STRING
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return api_pb2.DATA_TYPE_FLOAT64
    return api_pb2.DATA_TYPE_STRING


def plain_number(value: float | int) -> str:
    """A number as a person writes it: 0.01, 1, 0.0003, 1e-05 (HParams prints a number to five digits: 0.010000)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _column_kind(name: str, values: Sequence[Scalar]) -> int:
    """How a column is declared: numbers as plain text (`plain_number`, in numeric order), except the log10 columns,
    which give the parallel-coordinates plot its numeric axes (`LOG10_COLUMNS`)."""
    kind = _kind(values)
    if kind == api_pb2.DATA_TYPE_FLOAT64 and name not in LOG10_COLUMNS.values():
        return api_pb2.DATA_TYPE_STRING
    return kind


def _text(value: Scalar) -> str:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return plain_number(value) if number and not isinstance(value, int) else str(value)


def hparam_info(name: str, values: Sequence[Scalar], differs: bool) -> api_pb2.HParamInfo:
    """One hyperparameter with its discrete domain (distinct values, sorted); strings for mixed types."""
    # numbers in order, and text that is a number before other text: top-k "4", "8", "16", "all"
    distinct = sorted(set(values), key=_order)
    kind = _column_kind(name, distinct)
    info = api_pb2.HParamInfo(name=name, type=kind, differs=differs)
    for value in distinct:
        if kind == api_pb2.DATA_TYPE_BOOL:
            info.domain_discrete.values.add().bool_value = bool(value)
        elif kind == api_pb2.DATA_TYPE_FLOAT64:
            info.domain_discrete.values.add().number_value = float(value)
        else:
            info.domain_discrete.values.add().string_value = _text(value)
    return info


def _order(value: Scalar) -> tuple:
    """Numbers by value (ints and floats together), then text that is a number by its number, then other text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, int(value), "") if str(value).isdigit() else (2, 0, str(value))


def experiment_summary(
    hparams: Mapping[str, Sequence[Scalar]],
    metrics: Sequence[str] | Mapping[str, str],
    description: str = "",
    differs: Sequence[str] = (),
):
    """The experiment declaration: ``hparams`` maps each name to the values its runs take; ``metrics`` are tags, or
    {tag: the column's name}.

    A hyperparameter with more than one value, or named in ``differs``, is marked as differing and listed first
    (in the order given); the rest follow in name order.
    """
    if not hparams:
        raise ValueError("an HParams experiment needs at least one hyperparameter")
    hparams = with_log10_columns({name: list(values) for name, values in hparams.items()})
    differs = [*differs, *(LOG10_COLUMNS[n] for n in differs if n in LOG10_COLUMNS)]
    # the log10 columns after the settings that differ, so that T, top-k and the normaliser stay the first columns
    varied = sorted((n for n in hparams if len(set(hparams[n])) > 1 or n in differs),
                    key=lambda n: n in LOG10_COLUMNS.values())  # fmt: skip
    constant = sorted(n for n in hparams if n not in varied)
    infos = [hparam_info(n, hparams[n], True) for n in varied] + [hparam_info(n, hparams[n], False) for n in constant]
    names = metrics if isinstance(metrics, Mapping) else {}
    metric_infos = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m), display_name=names.get(m, "")) for m in metrics]
    experiment = api_pb2.Experiment(
        description=description, time_created_secs=time.time(), hparam_infos=infos, metric_infos=metric_infos
    )
    return _summary(EXPERIMENT_TAG, experiment=experiment)


def _writer(logger_or_writer: Any):
    """The event-file writer of a TensorBoardLogger or a torch SummaryWriter."""
    experiment = getattr(logger_or_writer, "experiment", logger_or_writer)
    return experiment._get_file_writer()


def write_session(
    logger: Any,
    params: Mapping[str, Scalar],
    metrics: Sequence[str] | Mapping[str, str],
    experiment: bool | str | Path = True,
    group: str = "",
) -> None:
    """Write a run's HParams session (its values), and an experiment declaration: with ``experiment`` True a
    one-run experiment, with a path the sweep's declaration that `write_experiment` left there (none if the file is
    missing, e.g. a run started alone with ``--run-index`` before any sweep process declared it).

    No metric values are written: the HParams view reads the metrics' own scalar curves. (Lightning's
    `log_hyperparams(params, metrics)` would log the metrics at step 0 and put a made-up point on the curves.)
    ``group`` puts runs that differ only by seed in one HParams group.
    """
    writer = _writer(logger)
    params = with_log10_columns(params)
    # Each value is written with the type its experiment declared (a temperature of 1 among 0.1 and 0.3 is a
    # number, not the text "1"), else HParams would not match the session to its column's domain.
    declared = {name: [value] for name, value in params.items()}
    if experiment is True:
        writer.add_summary(experiment_summary(declared, metrics, differs=[a for a in STUDY_AXES if a in params]))
    elif experiment and Path(experiment).is_file():
        declaration = read_declaration(Path(experiment))
        declared.update(declaration["hparams"])
        writer.add_summary(_experiment_from(declaration))
    start = plugin_data_pb2.SessionStartInfo(group_name=group, start_time_secs=time.time())
    if not group and experiment is not True:
        start.group_name = session_label(params, declared)
    for name, value in params.items():
        kind = _column_kind(name, declared[name] if value in declared.get(name, []) else [value])
        if kind == api_pb2.DATA_TYPE_BOOL:
            start.hparams[name].bool_value = bool(value)
        elif kind == api_pb2.DATA_TYPE_FLOAT64:
            start.hparams[name].number_value = float(value)
        else:
            start.hparams[name].string_value = _text(value)
    writer.add_summary(_summary(SESSION_START_INFO_TAG, session_start_info=start))
    writer.add_summary(
        _summary(SESSION_END_INFO_TAG, session_end_info=plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS))
    )
    writer.flush()


LABEL_PARTS = {tags.attention_hparam("temperature"): "T", tags.attention_hparam("top_k"): "k",
               "learning_rate": "lr", "seed": "s"}
"""Short names of the columns in a run's label (`session_label`); any other column is shown by its value."""


def session_label(params: Mapping[str, Scalar], declared: Mapping[str, Sequence[Scalar]]) -> str:
    """A run's name in the HParams table, short enough for its column: the settings in which the sweep's runs
    differ, T first and the seed last, each other one only where it is not the sweep's first run's value (the main
    arm's): ``T0.01 s0``, ``T0.01 k8 s0``, ``T1 sgd lr1 s1``. ``declared``: each column's values over the sweep's
    runs in plan order (`write_experiment`)."""
    temperature, seed = tags.attention_hparam("temperature"), "seed"
    varied = [name for name in declared if name in params and name not in LOG10_COLUMNS.values()
              and len({_text(v) for v in declared[name]}) > 1]  # fmt: skip
    order = [n for n in (temperature,) if n in varied] + [n for n in varied if n not in (temperature, seed)]
    parts = []
    for name in order + [n for n in (seed,) if n in varied]:
        value = params[name]
        if name in (temperature, seed) or _text(value) != _text(declared[name][0]):
            short = LABEL_PARTS.get(name)
            parts.append(f"{short}{_text(value)}" if short else _text(value))
    return " ".join(parts)


def write_experiment(
    sweep_dir: Path,
    hparams: Mapping[str, Sequence[Scalar]],
    metrics: Sequence[str] | Mapping[str, str],
    description: str = "",
) -> Path:
    """Declare a sweep's experiment in ``<sweep_dir>/hparams.json`` (replacing an earlier declaration, atomically:
    several sweep workers may declare at once); returns the file. Its runs copy it into their events."""
    path = Path(sweep_dir) / EXPERIMENT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    declaration = {
        "hparams": {name: list(values) for name, values in hparams.items()},
        "metrics": dict(metrics) if isinstance(metrics, Mapping) else {m: "" for m in metrics},
        "description": description,
    }
    write_text_atomically(path, json.dumps(declaration, indent=1))
    return path


def read_declaration(path: Path) -> dict[str, Any]:
    """The experiment declaration `write_experiment` wrote to ``path``, checked before use: a file that is not
    JSON or lacks its `hparams` and `metrics` tables is refused naming the file, never half-read."""
    try:
        declaration = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable HParams declaration ({err}); delete it and rerun the sweep") from None
    if not (isinstance(declaration, dict) and isinstance(declaration.get("hparams"), dict)
            and isinstance(declaration.get("metrics"), dict)):
        raise ValueError(f"{path}: an HParams declaration needs `hparams` and `metrics` tables; delete it and rerun")
    return declaration


def _experiment_from(declaration: dict[str, Any]) -> Summary:
    return experiment_summary(declaration["hparams"], declaration["metrics"], declaration.get("description", ""))


__all__ = [
    "EXPERIMENT_FILE",
    "EXPERIMENT_TAG",
    "HPARAMS_METRICS",
    "LOG10_COLUMNS",
    "STUDY_AXES",
    "experiment_summary",
    "hparam_info",
    "plain_number",
    "read_declaration",
    "session_label",
    "write_experiment",
    "with_log10_columns",
    "write_session",
]
