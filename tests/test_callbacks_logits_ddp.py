"""Two CPU processes (ddp_fork) whose ranks see different maxima: the logit maxima are reduced with a MAX, the
moments and the sink statistics with a SUM, and every tag is written once.

Runs in a fresh pytest process of its own, as tests/test_callbacks_ddp.py does (forking after other tests' thread
pools can deadlock both ranks).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from study import tags
from study.callbacks import AttentionLogitMonitor, AttentionSinkMonitor
from tests.callback_helpers import PlainAttention, make_trainer, scalars
from tests.test_callbacks_ddp import loader

pytestmark = pytest.mark.slow


def reference(tmp_path, indices) -> dict[str, float]:
    """Single-process validation over the given samples, same weights."""
    make_trainer(
        tmp_path, [AttentionLogitMonitor(per_head=True), AttentionSinkMonitor()], limit_val_batches=None
    ).validate(PlainAttention(init_scale=3.0, lr=0.0), loader(indices))
    return {tag: values[0][1] for tag, values in scalars(tmp_path).items()}


def test_two_processes_reduce_maxima_with_max(tmp_path):
    if os.environ.get("STUDY_DDP_CHILD") != "1":
        root = Path(__file__).resolve().parents[1]
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"{__file__}::{test_two_processes_reduce_maxima_with_max.__name__}", "--basetemp", str(tmp_path / "child")],
            env={**os.environ, "STUDY_DDP_CHILD": "1"}, cwd=root, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
        return
    monitors = [AttentionLogitMonitor(every_n_steps=1, per_head=True), AttentionSinkMonitor(every_n_steps=1)]
    trainer = make_trainer(tmp_path / "ddp", monitors, max_steps=1, strategy="ddp_fork", devices=2, limit_val_batches=None)
    trainer.fit(PlainAttention(init_scale=3.0, lr=0.0), loader([0, 1]), loader([0, 1, 2, 3]))
    logged = scalars(tmp_path / "ddp")
    assert all(len(values) == 1 for values in logged.values()), {t: v for t, v in logged.items() if len(v) != 1}

    everything = reference(tmp_path / "all", [0, 1, 2, 3])
    rank0 = reference(tmp_path / "rank0", [0, 2])  # the repeated-token samples
    rank1 = reference(tmp_path / "rank1", [1, 3])
    step0 = reference(tmp_path / "step0", [0, 1])
    for layer in (0, 1):
        for name in ("max_logit", "max_logit_raw"):
            tag = tags.attention(name, layer)
            # the ranks' maxima differ, and the logged one is the larger, as over all samples in one process
            assert rank0[f"val/{tag}"] != pytest.approx(rank1[f"val/{tag}"], rel=1e-3)
            assert logged[f"val/{tag}"][0][1] == pytest.approx(max(rank0[f"val/{tag}"], rank1[f"val/{tag}"]), rel=1e-6)
            assert logged[f"val/{tag}"][0][1] == pytest.approx(everything[f"val/{tag}"], rel=1e-6)
            assert logged[tag] == [(0, pytest.approx(step0[f"val/{tag}"], rel=1e-6))]
            for h in (0, 1):
                head = tags.attention(name, layer, h)
                assert logged[f"val/{head}"][0][1] == pytest.approx(everything[f"val/{head}"], rel=1e-6)
        for name in ("logit_mean", "logit_std", "first_key_weight", "sink_rate"):
            tag = f"val/{tags.attention(name, layer)}"
            assert logged[tag][0][1] == pytest.approx(everything[tag], rel=1e-6, abs=1e-9)
