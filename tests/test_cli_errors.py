"""`study fit` that goes wrong: a non-finite run exits non-zero with its reason; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from study.cli import main
from study.data import TextDataModule, text_problem
from study.errors import ConfigError
from study.frozen.text import read_text
from tests.test_cli import fit_args


@pytest.mark.slow
def test_a_run_that_goes_non_finite_stops_exits_1_and_keeps_finite_checkpoints(text_files, tmp_path, capsys):
    args = fit_args(
        text_files,
        tmp_path,
        "--model.learning_rate=1e6",
        "--model.warmup_steps=0",
        "--trainer.max_steps=20",
        "--trainer.val_check_interval=1",
        "--trainer.limit_val_batches=1",
        "--trainer.logger.init_args.version=lr1e6",
    )
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "study fit: stopped, non-finite" in err
    checkpoints = sorted((tmp_path / "logs" / "default" / "lr1e6" / "checkpoints").glob("*.ckpt"))
    assert {p.name for p in checkpoints} >= {"last.ckpt"} and len(checkpoints) >= 2  # last and best
    for path in checkpoints:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        assert ckpt["global_step"] < 20  # stopped early
        for name, tensor in ckpt["state_dict"].items():
            assert torch.isfinite(tensor).all(), (Path(path).name, name)


def error_lines(capsys) -> list[str]:
    """stderr lines written by `study` itself (Lightning's and warnings' own lines aside)."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("study ")]


def test_a_yaml_syntax_error_is_one_line_with_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_steps: 3\n  devices: [1, 2\nmodel: {}\n")
    assert main(["fit", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and f"study fit: {bad}:4:6: YAML syntax error" in err and "Traceback" not in err
    )
    assert main(["sweep", "--config", str(bad)]) == 2
    assert f"{bad}:4:6: YAML syntax error" in capsys.readouterr().err


def test_a_bad_value_or_option_is_one_line_naming_it(text_files, tmp_path, capsys):
    assert main(fit_args(text_files, tmp_path, "--model.attention.temperature=0")) == 2  # bad input
    assert error_lines(capsys) == [
        "study fit: --model.attention: temperature must be finite and > 0, got 0.0  (--verbose shows the traceback)"
    ]
    assert main(fit_args(text_files, tmp_path, "--trainer.max_stepz=3")) == 2
    assert error_lines(capsys) == [
        "study fit: unrecognized arguments: --trainer.max_stepz=3; did you mean --trainer.max_steps?  "
        "(--verbose shows the traceback)"
    ]
    assert main(fit_args(text_files, tmp_path, "--model.attention.temprature=0.1")) == 2
    assert error_lines(capsys) == [
        "study fit: --model.attention: Option 'temprature' is not accepted; did you mean "
        "--model.attention.temperature?  (--verbose shows the traceback)"
    ]
    assert main(fit_args(text_files, tmp_path, "--trainer.max_steps=abc")) == 2
    assert (
        "study fit: --trainer.max_steps: Expected a <class 'int'>. Got value: abc" in error_lines(capsys)[0]
    )
    with pytest.raises(ValueError, match="temperature must be finite"):
        main([*fit_args(text_files, tmp_path, "--model.attention.temperature=0"), "--verbose"])


def test_empty_and_binary_data_files_are_refused_by_name(text_files, tmp_path):
    train, _ = text_files
    empty, binary = tmp_path / "empty.txt", tmp_path / "model.bin"
    empty.write_text("\n  \n")
    binary.write_bytes(torch.arange(256, dtype=torch.uint8).numpy().tobytes() * 4)
    with pytest.raises(ValueError, match=f"data file {empty} is empty"):
        TextDataModule(source="files", train_files=[train], val_files=[str(empty)])
    with pytest.raises(ValueError, match=f"data file {binary} is not text"):
        TextDataModule(source="files", train_files=[str(binary)], val_files=[train])
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    assert "is not UTF-8 text (byte 3" in text_problem(latin)
    assert text_problem(train) is None


def test_study_analyze_refuses_a_binary_text(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="is not text"):
        read_text(str(binary), 100)


def test_a_damaged_checkpoint_to_resume_from_is_named(text_files, tmp_path, capsys):
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(b"PK\x03\x04 cut short")
    assert main([*fit_args(text_files, tmp_path), f"--ckpt_path={bad}"]) == 2  # bad input
    (line,) = error_lines(capsys)
    assert line.startswith(f"study fit: --ckpt_path {bad} does not load (RuntimeError: PytorchStreamReader")
    assert "remove it" in line and not (tmp_path / "logs").exists()


def test_verbose_reaches_the_sweep_and_is_taken_from_the_others(monkeypatch):
    """`study sweep --verbose` shows every run's output live, so the flag must reach the sweep; verbs without
    their own --verbose get their arguments without it (it then only shows tracebacks)."""
    import study.report
    import study.sweep

    seen = {}
    monkeypatch.setattr(study.sweep, "main", lambda argv: seen.setdefault("sweep", argv) and 0)
    monkeypatch.setattr(study.report, "main", lambda argv: seen.setdefault("report", argv) and 0)
    main(["sweep", "--config", "x.yaml", "--verbose"])
    main(["report", "logs/x", "--verbose"])
    assert seen == {"sweep": ["--config", "x.yaml", "--verbose"], "report": ["logs/x"]}


def test_data_shorter_than_one_batch_is_an_error_not_a_finished_run(text_files, tmp_path, capsys):
    train, val = text_files
    short = tmp_path / "short.txt"
    short.write_text(Path(train).read_text()[:400])
    # 400 bytes give at most 12 blocks of 32 tokens, so the preflight lets 12 through (64 it refuses up front:
    # tests/test_bad_values.py); the tokenizer packs them into fewer
    args = fit_args([str(short), val], tmp_path, "--data.batch_size=12")
    assert main(args) == 1
    (line,) = error_lines(capsys)
    assert line.startswith("study fit: the training data gives no batch: ") and "fewer than batch_size=12" in line


def test_a_fit_that_trains_no_step_exits_1(text_files, tmp_path, capsys):
    assert main(fit_args(text_files, tmp_path, "--trainer.max_epochs=0")) == 1
    (line,) = error_lines(capsys)
    assert line.startswith("study fit: trained no step (max_steps=2, limit_train_batches=1.0)")


def test_a_missing_model_is_one_clear_line_and_bad_input(text_files, tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert main(fit_args(text_files, tmp_path, f"--model.model_name_or_path={missing}")) == 2
    (line,) = error_lines(capsys)
    assert line.startswith(f"study fit: model '{missing}' not found: no such folder or file, and not a hub name")
    assert "Repo id" not in line and not (tmp_path / "logs").exists()


@pytest.mark.parametrize("folder", ["empty", "not a sweep", "the package"])
def test_study_report_refuses_a_folder_that_is_not_a_sweep_before_writing(tmp_path, folder, capsys):
    path = {"empty": tmp_path / "empty", "not a sweep": tmp_path / "other", "the package": tmp_path / "pkg"}[folder]
    path.mkdir()
    if folder != "empty":
        (path / "sub").mkdir()
        (path / "notes.txt").write_text("x")
    before = sorted(path.rglob("*"))
    assert main(["report", str(path)]) == 2
    assert sorted(path.rglob("*")) == before  # no report/ written into it
    assert capsys.readouterr().err.startswith(f"study report: {path} is not a sweep folder")
