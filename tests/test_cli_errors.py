"""`study fit` that goes wrong: a non-finite run exits non-zero with its reason; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import torch

from study.cli import main
from tests.test_cli import fit_args


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
