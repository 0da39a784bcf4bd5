"""The training step's memory bound (`study.memory`): below what a tiny model's step measures, within a stated
factor of it, and a run that cannot fit refused before its trainer is built (issue 52, N14)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from study import memory
from study.cli import main
from tests.test_cli import fit_args

# The measured step may exceed the bound by at most this factor: the bound leaves out the activations it does not
# name, the backward pass's temporaries and the allocator's slack.
FACTOR = 4


def _current_rss() -> int:
    from pathlib import Path

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def bound_and_measured_step(top_k: int | None) -> tuple[dict, int]:
    """In a fresh process: a tiny GPT-2's bound, and its resident memory's growth over two AdamW steps (from the
    built model to the peak: the gradients, the optimiser state, the logits and the kept activations)."""
    import torch

    from study.attention import AttentionSpec
    from study.fit import step_shape
    from study.model import CausalLMModule
    from study.resident import max_rss_bytes

    batch, length, vocab = 8, 256, 8192
    module = CausalLMModule(AttentionSpec(top_k=top_k), n_layer=2, n_head=4, n_embd=64, n_positions=length,
                            vocab_size=vocab, block_size=length)  # fmt: skip
    data = SimpleNamespace(hparams=SimpleNamespace(batch_size=batch, block_size=length))
    parts = memory.step_lower_bound(step_shape(module, data, "32-true"))
    ids = torch.randint(vocab, (batch, length), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(module.parameters())
    before = _current_rss()
    for _ in range(2):
        module.model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return parts, max_rss_bytes() - before


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [None, 4])  # the fused path, and the explicit one that keeps its scores
def test_the_bound_is_below_a_measured_step_and_within_a_factor_of_it(top_k):
    from study.resident import in_fresh_process

    (parts, grown), _ = in_fresh_process(bound_and_measured_step, top_k, threads=1)
    step = sum(v for k, v in parts.items() if k != "weights")  # the weights were resident before the measurement
    assert (parts["attention scores"] > 0) == (top_k is not None)
    assert step <= grown <= FACTOR * step, (parts, grown)


def test_the_bound_adds_its_parts_by_closed_form():
    shape = memory.StepShape(parameters=1000, trainable=600, optimizer_states=2, batch=2, length=8, vocab=50,
                             layers=3, width=16, mlp_width=64, weight_bytes=4, activation_bytes=2,
                             scores=2 * 4 * 8 * 8, explicit_layers=3)  # fmt: skip
    assert memory.step_lower_bound(shape) == {
        "weights": 4000, "gradients": 2400, "optimiser state": 4800, "logits": 16 * 50 * 6,
        "kept activations": (3 * (4 * 16 + 2 * 64) + 16) * 16 * 2, "attention scores": 3 * 512 * 4}  # fmt: skip
    checkpointed = memory.StepShape(**{**shape.__dict__, "checkpointing": True})
    assert memory.step_lower_bound(checkpointed)["kept activations"] == (3 * 16 + 16) * 16 * 2


def test_the_limit_is_the_smallest_the_machine_sets(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:    8000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("3000000000\n")
    (cgroup / "memory.current").write_text("1000000000\n")
    assert memory._meminfo_available(meminfo) == 8000000 * 1024
    assert memory._cgroup_left(cgroup) == 2 * 10**9
    (cgroup / "memory.max").write_text("max\n")
    assert memory._cgroup_left(cgroup) is None
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 5 * 2**30)
    monkeypatch.setattr(memory, "_cgroup_left", lambda: 2 * 2**30)
    monkeypatch.setattr(memory, "_address_space_left", lambda: None)
    assert memory.host_limit() == (2 * 2**30, "the cgroup's memory limit less its usage")
    parts = {"weights": 2**30, "logits": 2 * 2**30}
    assert memory.refusal(parts, memory.host_limit()) == (
        "a training step needs at least 3.00 GiB (logits 2.00 GiB, weights 1.00 GiB) and the cgroup's memory "
        "limit less its usage is 2.00 GiB: lower data.block_size or data.batch_size, or turn on "
        "model.gradient_checkpointing")  # fmt: skip
    assert memory.refusal(parts, (3 * 2**30, "MemAvailable")) is None and memory.refusal(parts, None) is None


@pytest.mark.slow
def test_a_run_that_cannot_fit_is_refused_before_its_trainer_is_built(text_files, tmp_path, monkeypatch, capsys):
    """Planted: a machine offering 64 MiB. Before: the run was built and grew until one allocation failed."""
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr(memory, "host_limit", lambda: (64 * 2**20, "MemAvailable"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(LightningCLI, "instantiate_trainer", lambda *a, **k: pytest.fail("the trainer was built"))
    argv = fit_args(text_files, tmp_path, "--data.block_size=2048", "--model.n_positions=2048", "--data.batch_size=8")
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("study ")]
    assert len(lines) == 1 and lines[0].startswith("study fit: a training step needs at least ")
    assert "and MemAvailable is 0.06 GiB: lower data.block_size" in lines[0]
    assert not (tmp_path / "logs").exists()


def test_block_size_16384_on_the_small_model_is_refused_under_a_10_gb_limit():
    """The issue's case: configs/default.yaml's model (4 x 128, corpus BPE of 8192) at block_size 16384, batch 8,
    which grew to 7.7 GB and died on a 2 GB allocation under a 10 GB limit."""
    from study.fit import step_shape
    from study.model import CausalLMModule

    module = CausalLMModule(n_layer=4, n_head=4, n_embd=128, n_positions=16384, vocab_size=8192, block_size=16384)
    data = SimpleNamespace(hparams=SimpleNamespace(batch_size=8, block_size=16384))
    parts = memory.step_lower_bound(step_shape(module, data, "32-true"))
    assert parts["logits"] == 8 * 16384 * 8192 * (4 + 4)
    refused = memory.refusal(parts, (10**10, "the cgroup's memory limit less its usage"))
    assert refused is not None and refused.startswith("a training step needs at least 11.12 GiB (logits 8.00 GiB")
    assert memory.refusal(parts, (16 * 2**30, "MemAvailable")) is None  # a machine with room runs it
