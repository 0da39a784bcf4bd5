"""`study fit` through LightningCLI with the shipped YAML configs."""

from pathlib import Path

import pytest

from study.attention import attention_modules, current_spec
from study.fit import lightning_main

ROOT = Path(__file__).resolve().parents[1]


def fit_args(text_files, tmp_path, *extra):
    train, val = text_files
    return [
        "fit",
        "--config", str(ROOT / "configs" / "default.yaml"),
        "--data.source=files",
        f"--data.train_files=[{train}]",
        f"--data.val_files=[{val}]",
        "--data.vocab_size=300",
        "--data.block_size=32",
        f"--data.cache_dir={tmp_path / 'cache'}",
        "--model.n_layer=2",
        "--model.n_embd=32",
        "--trainer.max_steps=2",
        "--model.warmup_steps=1",  # the config's 30 is longer than these runs
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        *extra,
    ]


@pytest.mark.slow
def test_fit_from_the_default_config_changes_the_temperature_the_model_uses(text_files, tmp_path):
    cli = lightning_main(fit_args(text_files, tmp_path, "--model.attention.temperature=0.5", "--model.attention.top_k=4"))
    specs = current_spec(cli.model.model)
    assert len(specs) == 2 and {s.temperature for s in specs.values()} == {0.5}
    assert {s.top_k for s in specs.values()} == {4}
    # The model embeds exactly the tokenizer's vocabulary (a linked argument).
    assert cli.model.model.config.vocab_size == len(cli.datamodule.tokenizer)
    assert cli.trainer.global_step == 2
    run = tmp_path / "logs" / "default" / "version_0"
    assert list(run.glob("events.out.tfevents.*")) and (run / "config.yaml").exists()
    assert (run / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow
def test_a_second_run_gets_a_new_version_and_nothing_is_overwritten(text_files, tmp_path):
    lightning_main(fit_args(text_files, tmp_path))
    lightning_main(fit_args(text_files, tmp_path))
    versions = sorted(p.name for p in (tmp_path / "logs" / "default").iterdir())
    assert versions == ["version_0", "version_1"]


@pytest.mark.parametrize(
    "override, match",
    [
        ("--model.attention.temperature=0", "temperature"),
        ("--model.attention.top_k=0", "top_k"),
        ("--model.attention.normalizer=softermax", "softermax"),
        ("--data.block_size=512", "data.block_size = 512"),
    ],
)
def test_bad_values_fail_before_training(text_files, tmp_path, override, match, capsys):
    with pytest.raises((SystemExit, ValueError)) as info:
        lightning_main(fit_args(text_files, tmp_path, override))
    message = str(info.value) + capsys.readouterr().err
    assert match in message
    assert not (tmp_path / "logs").exists()  # nothing trained, nothing logged


def test_a_users_normaliser_takes_its_option_from_a_yaml_config(text_files, tmp_path):
    """A normaliser named by import path (no registering code runs first) gets its own option from YAML, and a
    misspelt option is refused before anything is built."""
    config = tmp_path / "capped.yaml"
    config.write_text("model:\n  attention:\n    normalizer: tests.test_normalizers:CappedSoftmax\n"
                      "    temperature: 0.5\n    options: {cap: 0.5}\n")
    cli = lightning_main(fit_args(text_files, tmp_path, "--config", str(config))[1:], run=False)
    specs = current_spec(cli.model.model)
    assert {s.options["cap"] for s in specs.values()} == {0.5} and {s.temperature for s in specs.values()} == {0.5}
    assert {m.study_normalizer.cap for m in attention_modules(cli.model.model)} == {0.5}
    with pytest.raises((SystemExit, ValueError)) as info:
        lightning_main(fit_args(text_files, tmp_path, "--config", str(config), "--model.attention.options={kap: 1}")[1:],
                       run=False)
    assert "kap=1 has no effect with normalizer 'tests.test_normalizers:CappedSoftmax'" in str(info.value)


@pytest.mark.slow
def test_study_fit_ends_with_its_log_folder_and_final_metrics(text_files, tmp_path, capsys):
    """One line naming where the logs are and what the run ended with, read back from the trainer's own metrics;
    Lightning's meaningless console columns are gone (no v_num in the progress bar, no FLOPs column)."""
    from study.cli import main
    from study.fit import StudyModelSummary, StudyRichProgressBar, StudyTQDMProgressBar, quiet_console

    args = [a for a in fit_args(text_files, tmp_path) if a != "--trainer.enable_progress_bar=false"]
    assert main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    run = tmp_path / "logs" / "default" / "version_0"
    assert last.startswith(f"study fit: logs in {run}; val/loss ") and last.endswith("(step 2)"), last
    val_loss = float(last.split("val/loss ")[1].split(",")[0])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = EventAccumulator(str(run)).Reload().Scalars("val/loss")[-1].value
    assert val_loss == pytest.approx(logged, rel=1e-3)

    import lightning as L

    trainer = L.Trainer(logger=False, enable_checkpointing=False)
    quiet_console(trainer)
    kinds = {type(cb) for cb in trainer.callbacks}
    assert StudyModelSummary in kinds and kinds & {StudyRichProgressBar, StudyTQDMProgressBar}


def test_closest_option_reads_both_parser_messages():
    from study.fit import closest_option

    assert closest_option("--model.attention: Option 'temprature' is not accepted") == "model.attention.temperature"
    assert closest_option("unrecognized arguments: --data.batch_sise=3") == "data.batch_size"
    assert closest_option("unrecognized arguments: --trainer.zzzzzz=3") is None
    assert closest_option("--model.attention: temperature must be finite and > 0") is None


def test_configs_log_apart_from_the_sweeps():
    """`study fit --config configs/<c>.yaml` logs under logs/fit/<c>/, never into a sweep's logs/<sweep>/ folder."""
    import yaml

    for config in sorted((ROOT / "configs").glob("*.yaml")):
        logger = yaml.safe_load(config.read_text())["trainer"]["logger"]["init_args"]
        assert logger["save_dir"] == "logs/fit" and logger["name"] == config.stem, config.name


def test_a_verb_that_returns_destroys_the_process_group_it_left_open(tmp_path, monkeypatch):
    """Lightning leaves the default process group open after `fit`; left to interpreter finalisation, Gloo's threads
    can abort the process after its work is done (issue 32: a torchrun job marked failed). `study.cli.main` closes
    it when a verb returns."""
    import torch.distributed as dist

    from study import cli

    class Verb:
        @staticmethod
        def main(argv):
            dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
            return 0

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: Verb)
    try:
        assert cli.main(["report", "x"]) == 0
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
