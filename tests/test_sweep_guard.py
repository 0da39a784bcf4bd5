"""NonFiniteGuard: stop with a clear message and a good checkpoint, or skip the step and count it."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from study.callbacks.nonfinite import NonFiniteGuard
from study.report.read import read_scalars
from study.sweep import main
from tests.faults import NaNLossAtStep
from tests.test_sweep import write_spec


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=g)
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
        )

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1)


def fit(tmp_path, action):
    guard = NonFiniteGuard(action=action)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    trainer = L.Trainer(
        max_steps=6,
        logger=TensorBoardLogger(tmp_path, name="", version="run"),
        log_every_n_steps=1,
        callbacks=[guard, ckpt, NaNLossAtStep(step=3, always=True)],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Tiny()
    trainer.fit(model)
    return trainer, guard, model


def test_guard_stop_keeps_last_good_checkpoint(tmp_path):
    with pytest.warns(UserWarning, match="training stopped, non-finite loss"):
        trainer, guard, model = fit(tmp_path, "stop")
    # the bad step is counted by Lightning but not applied: the weights are those after step 3
    assert trainer.global_step == 4
    assert guard.diverged["step"] == 3 and "non-finite loss (nan)" in guard.diverged["reason"]
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert state["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any("NonFiniteGuard" in k for k in state["callbacks"])
    # One "diverged" value, 1, at the step of the event: the HParams column (its last value).
    assert read_scalars(tmp_path / "run")["guard/diverged"] == [(3, 1.0)]


def test_guard_skip_counts_and_logs(tmp_path):
    trainer, guard, model = fit(tmp_path, "skip")
    assert trainer.global_step == 6 and guard.diverged is None
    assert guard.skipped_steps == 3  # steps 3, 4, 5 had a NaN loss
    assert all(torch.isfinite(p).all() for p in model.parameters())
    skipped = read_scalars(tmp_path / "run")["guard/skipped_steps"]
    assert [v for _, v in skipped] == [1.0, 2.0, 3.0]
    assert read_scalars(tmp_path / "run")["guard/diverged"] == [(6, 0.0)]  # skipped steps are not a divergence


def test_diverged_run_in_a_sweep(tmp_path):
    spec = write_spec(
        tmp_path,
        {"temperature": [0.01]},
        callbacks=[
            {"class_path": "tests.faults.NaNLossAtStep", "init_args": {"step": 3, "always": True}}
        ],
    )
    assert main(["--config", str(spec), "--no-estimate"]) == 0  # diverged is a final state, not a failure
    run = tmp_path / "logs" / "tiny" / "T0.01_kall_softmax_s0"
    st = json.loads((run / "status.json").read_text())
    assert st["state"] == "diverged" and "non-finite loss" in st["reason"] and st["global_step"] == 4
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert len(read_scalars(run)["train/loss"]) == 4


def test_guard_sees_a_non_finite_loss_in_any_micro_batch_of_an_accumulation_window():
    """With gradient accumulation, a NaN loss in the first micro-batch stops the run even when the last one is
    finite and gradients are not checked."""
    from types import SimpleNamespace

    import torch

    from study.callbacks import NonFiniteGuard

    layer = torch.nn.Linear(2, 2)
    for p in layer.parameters():
        p.grad = torch.ones_like(p)
    trainer = SimpleNamespace(world_size=1, global_step=3, should_stop=False)
    module = SimpleNamespace(parameters=layer.parameters, log=lambda *a, **k: None)
    guard = NonFiniteGuard(action="stop", check_grads=False)
    guard.on_before_backward(trainer, module, torch.tensor(float("nan")))
    guard.on_before_backward(trainer, module, torch.tensor(1.0))
    guard.on_before_optimizer_step(trainer, module, None)
    assert trainer.should_stop and "non-finite loss" in guard.diverged["reason"]
    # the next window starts clean
    trainer.should_stop, guard.diverged = False, None
    for p in layer.parameters():
        p.grad = torch.ones_like(p)
    guard.on_before_backward(trainer, module, torch.tensor(1.0))
    guard.on_before_optimizer_step(trainer, module, None)
    assert not trainer.should_stop and guard.diverged is None
