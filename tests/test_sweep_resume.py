"""Exact resume: a run interrupted mid-epoch and resumed ends with the weights of an uninterrupted run."""

from __future__ import annotations

import signal

import pytest
import torch

from study import tags
from study.report.read import read_scalars
from study.sweep import main
from tests.test_sweep import status, write_spec

# Subprocesses and whole sweeps: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow

# 12 blocks of batch 4: 3 batches an epoch; last.ckpt every 2 steps, so the run resumes from step 4, inside
# epoch 1 (the resumed epoch must be shuffled as epoch 1 and skip its first batch)
RESUME = {
    "trainer.max_steps": 9,
    "trainer.val_check_interval": 3,  # validation inside the epochs
    "trainer.check_val_every_n_epoch": None,
    "data.max_train_blocks": 12,
}
KILL = {"class_path": "tests.faults.KillAtStep", "init_args": {"step": 5, "signal": "SIGINT"}}


def sweep_dir(tmp_path, name, callbacks):
    folder = tmp_path / name
    folder.mkdir()
    spec = write_spec(
        folder, {"temperature": [0.5]}, RESUME, checkpoint={"every_n_train_steps": 2}, callbacks=callbacks
    )
    return spec, folder / "logs" / "tiny" / "T0.5_kall_softmax_s0"


def weights(run):
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def test_a_run_interrupted_mid_epoch_resumes_exactly(tmp_path, monkeypatch):
    spec, reference = sweep_dir(tmp_path, "uninterrupted", [])
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    spec, run = sweep_dir(tmp_path, "interrupted", [KILL])
    monkeypatch.setenv("STUDY_FAULTS", "1")
    try:
        with pytest.raises(SystemExit):  # Ctrl-C after step 5: Lightning exits 1
            main(["--config", str(spec), "--no-estimate"])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignores SIGINT after one
    monkeypatch.delenv("STUDY_FAULTS")
    assert status(run)["state"] == "failed"
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    st = status(run)
    assert st["state"] == "finished" and st["resumed_from_step"] == 4 and st["global_step"] == 9
    ref, got = weights(reference), weights(run)
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-6, msg=name)
    # and the logged losses: one value per step, the uninterrupted run's values
    got_loss, ref_loss = read_scalars(run)["train/loss"], read_scalars(reference)["train/loss"]
    assert [s for s, _ in got_loss] == [s for s, _ in ref_loss] == list(range(9))
    assert [v for _, v in got_loss] == pytest.approx([v for _, v in ref_loss], abs=1e-6)


def test_an_interrupted_pretraining_resumes_under_its_prefix(tmp_path, monkeypatch):
    """The pretraining run logs under Lightning's logger prefix (`pretrain-train/loss`); resumed, its writer's
    `purge_step` drops the interrupted attempt's later steps under that prefix too, and the fine-tuning runs still
    log their own steps from 0."""
    pretrain = {"overrides": {"trainer.max_steps": 6, "trainer.val_check_interval": 6, "trainer.log_every_n_steps": 1,
                              "model.warmup_steps": 1}}
    spec = write_spec(tmp_path, {"seed": [0]}, {"trainer.max_steps": 2, "trainer.val_check_interval": 2},
                      checkpoint={"every_n_train_steps": 2}, callbacks=[KILL], pretrain=pretrain)
    base = tmp_path / "logs" / "tiny" / "pretrain"
    monkeypatch.setenv("STUDY_FAULTS", "1")
    try:
        with pytest.raises(SystemExit):
            main(["--config", str(spec), "--no-estimate"])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.delenv("STUDY_FAULTS")
    assert status(base)["state"] == "failed"
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    assert status(base)["resumed_from_step"] == 4
    scalars = read_scalars(base)
    assert [s for s, _ in scalars[tags.pretrain(tags.TRAIN_LOSS)]] == list(range(6))
    assert not any(tag.startswith(("train/", "val/", "attention/")) for tag in scalars)
    run = read_scalars(tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0")
    assert [s for s, _ in run[tags.TRAIN_LOSS]] == [0, 1]


def test_a_run_killed_after_its_final_checkpoint_starts_over(tmp_path):
    """Killed between its final checkpoint and its end (Lightning logs a step after its checkpoint; validation and
    status come later still): resuming would train and log nothing, so the run starts over and ends complete."""
    spec = write_spec(tmp_path, {"temperature": [0.5]}, {**RESUME, "trainer.max_steps": 8},
                      checkpoint={"every_n_train_steps": 2})
    run = tmp_path / "logs" / "tiny" / "T0.5_kall_softmax_s0"
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    reference = weights(run)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8
    # The kill's window: the final checkpoint is on disk, the event tail and the status are not.
    state = status(run)
    (run / "status.json").write_text(__import__("json").dumps({**state, "state": "running"}))
    for events in run.glob("events.out.tfevents.*"):
        events.unlink()
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    after = status(run)
    assert after["state"] == "finished" and any("starting over" in n for n in after.get("notes", [])), after
    scalars = read_scalars(run)
    assert [s for s, _ in scalars[tags.TRAIN_LOSS]] == list(range(8)) and tags.VAL_PPL in scalars
    for key, value in reference.items():
        torch.testing.assert_close(weights(run)[key], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kill, every, resumed_from",
    [
        ({"class_path": "tests.faults.KillAtStep", "init_args": {"step": 6}}, 6, 6),  # SIGKILL at step 6's start
        # the checkpoint of step 4 is written before the validation that follows step 3, which a resumed attempt
        # does not run again: its logs (the monitors' at step 4) are kept, the purge starts at step 5
        ({"class_path": "tests.faults.KillAtStep", "init_args": {"step": 6}}, 4, 4),
        # killed inside that validation: its logs are lost, and a resumed attempt would never write them: the run
        # starts over
        ({"class_path": "tests.faults.KillAtValidation", "init_args": {"step": 4}}, 4, None),
    ],
    ids=["next-step", "after-validation", "in-validation"],
)
def test_killed_right_after_a_mid_run_checkpoint_every_scalar_matches_the_uninterrupted_run(
    tmp_path, kill, every, resumed_from
):
    """SIGKILL right after a mid-run checkpoint: no logged step may be lost (step 8 of 12 was gone for good), and
    the Jacobian monitor's sampled rows must continue as in the uninterrupted run (its sampler was reseeded on
    resume). Every scalar tag is compared, step by step."""
    from tests.test_sweep_faults import sweep

    overrides = {"trainer.max_steps": 12, "trainer.val_check_interval": 4, "trainer.check_val_every_n_epoch": None,
                 "data.max_train_blocks": 48}  # fmt: skip

    def spec_in(name, callbacks):
        folder = tmp_path / name
        folder.mkdir()
        spec = write_spec(folder, {"temperature": [0.5]}, overrides, checkpoint={"every_n_train_steps": every},
                          callbacks=callbacks)
        return spec, folder / "logs" / "tiny" / "T0.5_kall_softmax_s0"

    spec, reference = spec_in("uninterrupted", [])
    assert sweep(spec, faults=False).returncode == 0
    spec, run = spec_in("killed", [kill])
    killed = sweep(spec, faults=True)
    assert killed.returncode == -9 and status(run)["state"] == "running"
    resumed = sweep(spec, faults=False)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    st = status(run)
    assert st["state"] == "finished" and st["resumed_from_step"] == resumed_from, st
    ref, got = read_scalars(reference), read_scalars(run)
    assert sorted(got) == sorted(ref)
    assert [s for s, _ in got[tags.TRAIN_LOSS]] == list(range(12))
    assert any(tag.startswith("train/grad_norm") or "jacobian" in tag for tag in ref)
    for tag in ref:
        assert [s for s, _ in got[tag]] == [s for s, _ in ref[tag]], tag
        for (step, value), (_, expected) in zip(got[tag], ref[tag]):
            assert value == pytest.approx(expected, rel=1e-5, abs=1e-7), (tag, step)
