"""Two CPU processes (ddp_fork): every tag is written once, with the value reduced over both processes.

The test forks, and forking a process whose earlier tests left torch's thread pools running can deadlock both
ranks (seen after the architecture tests). So it runs in a fresh pytest process of its own.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from study.callbacks import (
    AttentionEntropyMonitor,
    AttentionJacobianMonitor,
    GradientNormMonitor,
    SelectionUniformityMonitor,
)
from tests.callback_helpers import PlainAttention, events, make_trainer, scalars

# Subprocesses and whole sweeps: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow


def samples() -> list[dict[str, torch.Tensor]]:
    """DistributedSampler (no shuffle) hands rank 0 samples 0 and 2, rank 1 samples 1 and 3.

    Samples 0 and 2 repeat one token: without positional embeddings every key is the same, attention is exactly
    uniform and rank 0 alone would log normalised entropy 1. Samples 1 and 3 are random tokens.
    """
    g = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.full((16,), 5)},
        {"input_ids": torch.randint(0, 64, (16,), generator=g)},
        {"input_ids": torch.full((16,), 7)},
        {"input_ids": torch.randint(0, 64, (16,), generator=g)},
    ]


def loader(indices) -> DataLoader:
    data = samples()
    return DataLoader([data[i] for i in indices], batch_size=1, shuffle=False)


def reference(tmp_path, indices) -> dict[str, float]:
    """Single-process validation over the given samples, same weights."""
    make_trainer(
        tmp_path, [AttentionEntropyMonitor(), SelectionUniformityMonitor()], limit_val_batches=None
    ).validate(PlainAttention(init_scale=3.0, lr=0.0), loader(indices))
    return {tag: values[0][1] for tag, values in scalars(tmp_path).items()}


def test_two_processes_log_reduced_values_once(tmp_path):
    if os.environ.get("STUDY_DDP_CHILD") != "1":
        root = Path(__file__).resolve().parents[1]
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{test_two_processes_log_reduced_values_once.__name__}",
             "--basetemp", str(tmp_path / "child")],
            env={**os.environ, "STUDY_DDP_CHILD": "1"}, cwd=root, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
        return
    monitors = [
        AttentionEntropyMonitor(every_n_steps=1),
        SelectionUniformityMonitor(every_n_steps=1),
        GradientNormMonitor(every_n_steps=1),
        AttentionJacobianMonitor(every_n_steps=1),
    ]
    # lr = 0: the weights validation sees are the ones step 0 saw, so one reference model serves both.
    trainer = make_trainer(
        tmp_path / "ddp", monitors, max_steps=1, strategy="ddp_fork", devices=2, limit_val_batches=None
    )
    trainer.fit(PlainAttention(init_scale=3.0, lr=0.0), loader([0, 1]), loader([0, 1, 2, 3]))

    acc = events(tmp_path / "ddp")
    logged = scalars(tmp_path / "ddp")
    # every tag once (no series whose step is not a step)
    assert all(len(values) == 1 for values in logged.values()), {t: v for t, v in logged.items() if len(v) != 1}
    assert len(acc.Histograms("attention/normalized_entropy/heads")) == 1
    assert len(acc.Histograms("val/attention/normalized_entropy/heads")) == 1

    everything = reference(tmp_path / "all", [0, 1, 2, 3])
    rank0_alone = reference(tmp_path / "rank0", [0, 2])
    step0 = reference(tmp_path / "step0", [0, 1])  # step 0: rank 0 trains on sample 0, rank 1 on sample 1
    assert rank0_alone["val/attention/normalized_entropy/mean"] == pytest.approx(1.0, abs=1e-6)
    for name in ("normalized_entropy", "entropy", "kl_uniform", "topk_mass_k4"):
        for layer in ("layer_0", "layer_1", "mean"):
            tag = f"attention/{name}/{layer}"
            assert logged[f"val/{tag}"][0][1] == pytest.approx(everything[f"val/{tag}"], rel=1e-6, abs=1e-9)
            assert logged[tag] == [(0, pytest.approx(step0[f"val/{tag}"], rel=1e-6, abs=1e-9))]
    assert logged["val/attention/normalized_entropy/mean"][0][1] < 0.99
    assert logged["val/attention/kl_uniform/mean"][0][1] > 0.01
    assert logged["grad_norm/total"][0][0] == 0 and logged["grad_norm/total"][0][1] > 0
    assert 0 < logged["val/attention/jacobian/mean"][0][1] <= 0.5 + 1e-6
