"""Checkpoints are read without trusting them: a pickle payload is refused before it can run, on every path that
reads one (`study fit --ckpt_path`, a sweep's resume from <run>/checkpoints/last.ckpt)."""

from __future__ import annotations

import builtins

import torch

from study.checkpoints import checkpoint_problem, checkpoint_step
from study.cli import main
from study.sweep.run import resume_point
from tests.test_cli import fit_args


class Payload:
    """Unpickling this object opens (creates) `marker`: the stand-in for any code a crafted checkpoint runs."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def payload_checkpoint(path, marker):
    torch.save({"global_step": 3, "state_dict": {"w": torch.zeros(2)}, "x": Payload(marker)}, path)
    assert not marker.exists()
    return path


def test_a_plain_checkpoint_loads_and_gives_its_step(tmp_path):
    path = tmp_path / "ok.ckpt"
    torch.save({"global_step": 7, "state_dict": {"w": torch.ones(3)}, "loops": {"a": [1, 2.0, None]}}, path)
    assert checkpoint_problem(path) is None and checkpoint_step(path) == 7


def test_a_payload_checkpoint_is_refused_without_running(tmp_path, capsys):
    marker = tmp_path / "pwned"
    path = payload_checkpoint(tmp_path / "evil.ckpt", marker)
    problem = checkpoint_problem(path)
    assert problem == "UnpicklingError: it holds io.open, which no checkpoint needs (refused before it could run)"
    assert checkpoint_step(path) is None
    assert capsys.readouterr().out == f"cannot read {path}: {problem}\n"
    assert not marker.exists()


def test_study_fit_refuses_a_payload_ckpt_path_in_one_line(text_files, tmp_path, capsys):
    marker = tmp_path / "pwned"
    path = payload_checkpoint(tmp_path / "evil.ckpt", marker)
    assert main([*fit_args(text_files, tmp_path), f"--ckpt_path={path}"]) == 2  # bad input
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("study ")]
    assert lines == [
        f"study fit: --ckpt_path {path} does not load (UnpicklingError: it holds io.open, which no checkpoint needs "
        "(refused before it could run)); it is not a checkpoint to trust: remove it and resume from an earlier "
        "checkpoint of the run (or start over)  (--verbose shows the traceback)"
    ]
    assert not marker.exists() and not (tmp_path / "logs").exists()


def test_a_sweep_does_not_resume_from_a_planted_payload(tmp_path, capsys):
    marker = tmp_path / "pwned"
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    payload_checkpoint(ckpt_dir / "last.ckpt", marker)
    path, step, notes = resume_point(ckpt_dir)
    assert (path, step) == (None, None)
    assert notes == [f"{ckpt_dir / 'last.ckpt'} does not load: renamed last.ckpt.corrupt",
                     "no readable checkpoint: starting over"]
    assert "UnpicklingError: it holds io.open" in capsys.readouterr().out
    assert not marker.exists() and (ckpt_dir / "last.ckpt.corrupt").is_file()
