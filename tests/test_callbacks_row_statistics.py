"""The monitors on the fused path read row statistics (no map): the same logged values as from the weights, a
logged step trains exactly as an unlogged one, and a tap that needs weights sends every monitor back to them."""

import math

import pytest
import torch

from study.attention import AttentionSpec, tapping
from study.callbacks import (
    AttentionEntropyMonitor,
    AttentionLogitMonitor,
    AttentionSinkMonitor,
    EntropyCollapseAlert,
    SelectionUniformityMonitor,
)
from tests.callback_helpers import LlamaModule, PlainAttention, make_trainer, scalars, token_loader


class WeightsTap:
    """A tap that reads weights (as the Jacobian monitor and the maps do): every open tap then gets weights."""

    fused_output = True
    row_blocks = True

    def __init__(self) -> None:
        self.calls = 0

    def observe(self, layer, weights, allowed, spec) -> None:
        self.calls += 1


def monitors():
    return [AttentionEntropyMonitor(every_n_steps=1, per_head=True),
            SelectionUniformityMonitor(every_n_steps=1, selection_ks=(1, 2, 4), per_head=True),
            AttentionSinkMonitor(every_n_steps=1, per_head=True), AttentionLogitMonitor(every_n_steps=1, per_head=True),
            EntropyCollapseAlert(every_n_steps=1)]


def logged_values(tmp_path, module_factory, weights: bool, max_steps: int = 2) -> dict[str, list[float]]:
    callbacks = monitors()
    counted: list[str] = []
    for monitor in callbacks:
        observe, observe_rows = monitor.observe, monitor.observe_rows
        monitor.observe = lambda *a, observe=observe: (counted.append("weights"), observe(*a))
        monitor.observe_rows = lambda *a, observe_rows=observe_rows: (counted.append("rows"), observe_rows(*a))
    tap = WeightsTap()
    trainer = make_trainer(tmp_path, callbacks, max_steps=max_steps)
    if weights:
        with tapping(tap):
            trainer.fit(module_factory(), token_loader(), token_loader(seed=1))
        assert tap.calls > 0
    else:
        trainer.fit(module_factory(), token_loader(), token_loader(seed=1))
    assert set(counted) == {"weights" if weights else "rows"}
    return {tag: [value for _, value in values] for tag, values in scalars(tmp_path).items()}


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_row_statistics_log_what_the_weights_give_on_llama(tmp_path, temperature):
    """A transformers Llama with grouped-query attention, two steps and a validation, every softmax monitor."""
    def factory():
        return LlamaModule(AttentionSpec(temperature=temperature))

    rows = logged_values(tmp_path / "rows", factory, weights=False)
    weights = logged_values(tmp_path / "weights", factory, weights=True)
    assert rows.keys() == weights.keys()
    monitored = [tag for tag in rows if tag.startswith(("attention/", "val/attention/"))]
    assert len(monitored) > 50
    for tag in monitored:
        for got, want in zip(rows[tag], weights[tag]):
            if math.isnan(want):
                assert math.isnan(got), tag
            else:
                assert got == pytest.approx(want, rel=1e-5, abs=1e-6), tag


def test_row_statistics_log_what_the_weights_give_on_plain_attention(tmp_path):
    def factory():
        return PlainAttention(AttentionSpec(temperature=0.5))

    rows = logged_values(tmp_path / "rows", factory, weights=False, max_steps=1)
    weights = logged_values(tmp_path / "weights", factory, weights=True, max_steps=1)
    monitored = [tag for tag in rows if "attention/" in tag]
    assert len(monitored) > 30 and rows.keys() == weights.keys()
    for tag in monitored:
        for got, want in zip(rows[tag], weights[tag]):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6) or (math.isnan(got) and math.isnan(want)), tag


def test_top_k_spec_keeps_the_weights():
    """Top-k is not the fused kernel's function: the monitors get the explicit weights."""
    module = PlainAttention(AttentionSpec(temperature=0.5, top_k=2))
    monitor = AttentionEntropyMonitor(every_n_steps=1)
    kinds: list[str] = []
    monitor.observe = lambda *a: kinds.append("weights")
    monitor.observe_rows = lambda *a: kinds.append("rows")
    with tapping(monitor):
        module(torch.randint(0, 64, (2, 8)))
    assert kinds and set(kinds) == {"weights"}


def test_logged_step_trains_like_an_unlogged_one():
    """The output and the gradients of a call with row-statistics taps open are the untapped fused call's, bit for
    bit: the statistics are computed beside the kernel's output."""
    torch.manual_seed(0)
    module = PlainAttention(AttentionSpec(temperature=0.3))
    ids = torch.randint(0, 64, (2, 10))

    def loss_and_grads(*taps):
        module.zero_grad()
        with tapping(*taps):
            loss = module(ids).float().square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in module.parameters() if p.grad is not None]

    plain_loss, plain_grads = loss_and_grads()
    monitor = AttentionSinkMonitor(every_n_steps=1)
    monitor._phase = "train"
    tapped_loss, tapped_grads = loss_and_grads(monitor)
    assert monitor._sums["train"]  # it measured
    assert torch.equal(plain_loss, tapped_loss)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, tapped_grads))
