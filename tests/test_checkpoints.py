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


# ---- damaged bytes (issue 32, items 1, 2, 8) ------------------------------------------------------------------
def _checkpoint(path, step, size=200_000):
    torch.save({"global_step": step, "state_dict": {"w": torch.randn(size, generator=torch.Generator().manual_seed(0))}},
               path)
    return path


def _zero(path, offset, length):
    data = bytearray(path.read_bytes())
    data[offset:offset + length] = bytes(length)
    path.write_bytes(bytes(data))


def _record_offset(path, name_part):
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if name_part in i.filename)
        return info.header_offset, info.file_size


def test_zeroed_bytes_inside_a_tensor_are_found_before_use(tmp_path):
    """64 KB zeroed inside a tensor's storage, zip headers intact: torch loads it without an error (it never checks
    the records' CRC-32), so only a check of every record finds it."""
    path = _checkpoint(tmp_path / "last.ckpt", 5)
    offset, size = _record_offset(path, "data/0")
    _zero(path, offset + 200, 64 << 10)
    assert torch.load(path, weights_only=True)["global_step"] == 5  # what made item 1 possible
    problem = checkpoint_problem(path)
    assert problem is not None and "fails its CRC-32 check" in problem and "data/0" in problem
    assert checkpoint_step(path) is None


def test_zeroed_zip_header_is_found(tmp_path):
    path = _checkpoint(tmp_path / "last.ckpt", 5)
    offset, _ = _record_offset(path, "data/0")
    _zero(path, offset, 256)  # the record's local header
    assert checkpoint_problem(path) is not None


def test_a_damaged_last_checkpoint_is_renamed_and_the_previous_good_one_used(tmp_path, capsys):
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    _checkpoint(ckpt_dir / "epoch=0-step=2.ckpt", 2)
    last = _checkpoint(ckpt_dir / "last.ckpt", 4)
    offset, _ = _record_offset(last, "data/0")
    _zero(last, offset + 200, 64 << 10)
    path, step, notes = resume_point(ckpt_dir)
    assert (path, step) == (ckpt_dir / "epoch=0-step=2.ckpt", 2)
    assert notes == [f"{last} does not load: renamed last.ckpt.corrupt", "resuming from epoch=0-step=2.ckpt (step 2)"]
    assert (ckpt_dir / "last.ckpt.corrupt").is_file() and not last.exists()
    assert "fails its CRC-32 check" in capsys.readouterr().out


def test_every_trainer_load_is_verified_and_weights_only_whatever_the_environment(tmp_path, monkeypatch):
    """`study fit --ckpt_path last` names no file, so the up-front check cannot see it: the trainer's checkpoint I/O
    checks whatever Lightning resolves, with weights_only=True even under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1."""
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from study.errors import ConfigError
    from study.fit import VerifiedCheckpointIO

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    io = VerifiedCheckpointIO(TorchCheckpointIO())
    marker = tmp_path / "pwned"
    evil = payload_checkpoint(tmp_path / "last.ckpt", marker)
    try:
        io.load_checkpoint(evil)
    except ConfigError as err:
        assert "UnpicklingError: it holds io.open" in str(err)
    else:
        raise AssertionError("a payload checkpoint loaded")
    assert not marker.exists()
    # saved atomically beside the target, and read back
    good = tmp_path / "ok.ckpt"
    io.save_checkpoint({"global_step": 3, "state_dict": {"w": torch.ones(2)}}, good)
    assert io.load_checkpoint(good)["global_step"] == 3 and sorted(p.name for p in tmp_path.iterdir()) == [
        "last.ckpt", "ok.ckpt"]


def test_study_fit_installs_the_verified_checkpoint_io(text_files, tmp_path):
    from study.fit import VerifiedCheckpointIO, lightning_main

    cli = lightning_main(fit_args(text_files, tmp_path)[1:], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, VerifiedCheckpointIO)
