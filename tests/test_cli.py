"""`study fit` through LightningCLI with the shipped YAML configs."""

from pathlib import Path

import pytest

from study.attention import current_spec
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
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        *extra,
    ]


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
        ("--data.block_size=512", "block_size=512"),
    ],
)
def test_bad_values_fail_before_training(text_files, tmp_path, override, match, capsys):
    with pytest.raises((SystemExit, ValueError)) as info:
        lightning_main(fit_args(text_files, tmp_path, override))
    message = str(info.value) + capsys.readouterr().err
    assert match in message
    assert not (tmp_path / "logs").exists()  # nothing trained, nothing logged
