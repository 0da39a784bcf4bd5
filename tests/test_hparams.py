"""HParams declarations: swept settings first, discrete domains, sessions without fake metric points."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata

from study.hparams import experiment_summary, write_experiment, write_session


def _experiment(summary) -> api_pb2.Experiment:
    (value,) = summary.value
    assert value.tag == metadata.EXPERIMENT_TAG
    return metadata.parse_experiment_plugin_data(value.metadata.plugin_data.content)


def test_swept_settings_first_with_their_domains():
    hparams = {
        "attention/alpha": [1.5, 1.5],
        "attention/temperature": [0.1, 1.0, 0.1],
        "attention/top_k": [0, 8],
        "attention/normalizer": ["softmax"],
        "learnable": [False],
    }
    experiment = _experiment(experiment_summary(hparams, ["val/loss", "val/ppl"]))
    names = [info.name for info in experiment.hparam_infos]
    # T's log10 column (a numeric axis on which 0.01 and 0.03 are apart) after the settings that differ
    assert names == ["attention/temperature", "attention/top_k", "log10_T", "attention/alpha", "attention/normalizer",
                     "learnable"]
    assert [info.differs for info in experiment.hparam_infos] == [True, True, True, False, False, False]
    assert [v.number_value for v in experiment.hparam_infos[2].domain_discrete.values] == [-1.0, 0.0]
    temperature = experiment.hparam_infos[0]  # plain text in numeric order; log10_T is the numeric axis
    assert temperature.type == api_pb2.DATA_TYPE_STRING
    assert [v.string_value for v in temperature.domain_discrete.values] == ["0.1", "1"]
    assert experiment.hparam_infos[4].domain_discrete.values[0].string_value == "softmax"
    assert experiment.hparam_infos[5].type == api_pb2.DATA_TYPE_BOOL
    assert [m.name.tag for m in experiment.metric_infos] == ["val/loss", "val/ppl"]
    with pytest.raises(ValueError, match="at least one"):
        experiment_summary({}, ["val/loss"])


def test_written_experiment_and_session(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    declared = write_experiment(tmp_path, {"attention/temperature": [0.1, 1.0], "lr": [3e-4]}, ["val/loss"])
    write_experiment(tmp_path, {"attention/temperature": [0.3, 1.0], "attention/top_k": ["all", "16", "4"],
                                "lr": [3e-4]}, {"val/loss": "val loss"})  # replaces
    assert declared == tmp_path / "hparams.json" and list(tmp_path.iterdir()) == [declared]  # no events folder

    # A sweep's run writes the sweep's declaration and its session into its own events: no extra run.
    swept = tmp_path / "swept"
    writer = SummaryWriter(str(swept))
    write_session(writer, {"attention/temperature": 0.3, "attention/top_k": "4", "lr": 3e-4}, {"val/loss": "val loss"},
                  experiment=declared)
    writer.close()
    content = EventAccumulator(str(swept)).Reload().PluginTagToContent(metadata.PLUGIN_NAME)
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    assert [v.string_value for v in experiment.hparam_infos[0].domain_discrete.values] == ["0.3", "1"]
    top_k = experiment.hparam_infos[1]
    assert top_k.name == "attention/top_k" and [v.string_value for v in top_k.domain_discrete.values] == ["4", "16", "all"]
    assert [(m.name.tag, m.display_name) for m in experiment.metric_infos] == [("val/loss", "val loss")]

    run = tmp_path / "run"
    writer = SummaryWriter(str(run))
    params = {"attention/alpha": 1.5, "attention/temperature": 0.1, "attention/top_k": 0, "lr": 3e-4}
    write_session(writer, params, ["val/loss"], experiment=True, group="T0.1")
    writer.close()
    acc = EventAccumulator(str(run)).Reload()
    tags = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    assert set(tags) == {metadata.EXPERIMENT_TAG, metadata.SESSION_START_INFO_TAG, metadata.SESSION_END_INFO_TAG}
    # A run alone lists the study's axes first, the rest by name.
    names = [i.name for i in metadata.parse_experiment_plugin_data(tags[metadata.EXPERIMENT_TAG]).hparam_infos]
    assert names == ["attention/temperature", "attention/top_k", "log10_T", "attention/alpha", "lr"]
    start = metadata.parse_session_start_info_plugin_data(tags[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["attention/temperature"].string_value == "0.1" and start.group_name == "T0.1"
    assert start.hparams["log10_T"].number_value == -1.0
    assert acc.Tags()["scalars"] == []  # no made-up metric points


def test_numbers_are_shown_plain_and_sessions_follow_the_declared_type(tmp_path):
    """HParams shows every number to five digits ("0.010000"): a seed, a top-k, a temperature or a learning rate
    is declared as plain text ("0", "16", "0.1", "0.0003"), in numeric order, and the log10 columns stay numbers (the
    parallel-coordinates axes); a session writes each value as its column declares it (a temperature of 1 among 0.1
    is "1"), else HParams cannot place it in the column."""
    from torch.utils.tensorboard import SummaryWriter

    hparams = {"attention/temperature": [0.1, 1], "seed": [10, 2, 0], "attention/top_k": [16, 4], "lr": [3e-4]}
    experiment = _experiment(experiment_summary(hparams, ["val/loss"]))
    infos = {i.name: i for i in experiment.hparam_infos}
    assert infos["seed"].type == api_pb2.DATA_TYPE_STRING
    assert [v.string_value for v in infos["seed"].domain_discrete.values] == ["0", "2", "10"]
    assert [v.string_value for v in infos["attention/top_k"].domain_discrete.values] == ["4", "16"]
    assert infos["attention/temperature"].type == api_pb2.DATA_TYPE_STRING and infos["lr"].type == api_pb2.DATA_TYPE_STRING
    assert [v.string_value for v in infos["attention/temperature"].domain_discrete.values] == ["0.1", "1"]
    assert infos["log10_T"].type == api_pb2.DATA_TYPE_FLOAT64  # the numeric axis

    declared = write_experiment(tmp_path, hparams, ["val/loss"])
    writer = SummaryWriter(str(tmp_path / "run"))
    write_session(writer, {"attention/temperature": 1, "seed": 2, "attention/top_k": 16, "lr": 3e-4}, ["val/loss"],
                  experiment=declared)  # fmt: skip
    writer.close()
    content = EventAccumulator(str(tmp_path / "run")).Reload().PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["attention/temperature"].string_value == "1"
    assert start.hparams["seed"].string_value == "2" and start.hparams["attention/top_k"].string_value == "16"
    assert start.hparams["lr"].string_value == "0.0003" and start.hparams["log10_T"].number_value == 0.0


def test_a_damaged_declaration_is_refused_naming_the_file(tmp_path):
    """The sweep's hparams.json is read back before each run's session: damage is a clear error, not a KeyError."""
    import pytest

    from study.hparams import read_declaration

    bad = tmp_path / "hparams.json"
    for text in ('{"hparams": {', '{"hparams": {}}', "[1, 2]"):
        bad.write_text(text)
        with pytest.raises(ValueError, match="hparams.json"):
            read_declaration(bad)
    bad.write_text('{"hparams": {"T": [1.0]}, "metrics": {"val/loss": "val loss"}}')
    assert read_declaration(bad)["hparams"] == {"T": [1.0]}


def test_settings_that_span_decades_get_a_log10_column():
    from study.hparams import with_log10_columns

    row = with_log10_columns({"attention/temperature": 0.01, "learning_rate": 1, "seed": 3})
    assert list(row) == ["attention/temperature", "log10_T", "learning_rate", "log10_lr", "seed"]
    assert row["log10_T"] == pytest.approx(-2.0) and row["log10_lr"] == 0.0
    domains = with_log10_columns({"learning_rate": [0.0003, 0.01], "attention/temperature": [0.1, "x"]})
    assert domains["log10_lr"] == pytest.approx([-3.5229, -2.0], abs=1e-4)
    assert "log10_T" not in domains  # not every value a positive number: no column
    # a swept learning rate's log10 column is declared, with the values the sessions write
    experiment = _experiment(experiment_summary({"learning_rate": [0.0003, 0.01]}, ["val/loss"]))
    info = {i.name: i for i in experiment.hparam_infos}["log10_lr"]
    assert info.differs and [v.number_value for v in info.domain_discrete.values] == with_log10_columns(
        {"learning_rate": [0.0003, 0.01]})["log10_lr"]


def test_a_sweeps_runs_are_named_by_what_sets_them_apart():
    """The HParams table's trial column is narrow: a sweep's run is named by the settings its runs differ in, T first
    and the seed last, the others only where they leave the main arm (the plan's first run)."""
    from study.hparams import plain_number, session_label

    declared = {"attention/temperature": [0.01, 1, 0.01, 1, 0.01, 1], "attention/top_k": ["all"] * 4 + ["8", "8"],
                "optimizer": ["adamw"] * 2 + ["sgd"] * 2 + ["adamw"] * 2, "learning_rate": [3e-4, 3e-4, 1.0, 0.01,
                3e-4, 3e-4], "seed": [0, 0, 1, 1, 0, 0], "attention/normalizer": ["softmax"] * 6}  # fmt: skip
    run = {name: values[0] for name, values in declared.items()}
    assert session_label(run, declared) == "T0.01 s0"
    assert session_label({**run, "attention/top_k": "8"}, declared) == "T0.01 k8 s0"
    assert session_label({**run, "attention/temperature": 1, "optimizer": "sgd", "learning_rate": 1.0, "seed": 1},
                         declared) == "T1 sgd lr1 s1"
    assert [plain_number(v) for v in (0.01, 1.0, 3e-4, 1e-05, 2)] == ["0.01", "1", "0.0003", "1e-05", "2"]
