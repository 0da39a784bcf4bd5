"""GradientNormMonitor: norms against torch before and after clipping, grouping, and the attention Jacobian."""

import math

import lightning as L
import pytest
import torch

from study.attention import AttentionSpec, causal_allowed
from study.callbacks import GradientNormMonitor
from study.callbacks.base import TRAIN
from tests.callback_helpers import LlamaModule, PlainAttention, make_trainer, scalars, token_loader


class GradRecorder(L.Callback):
    """Reference values computed with torch itself, before clipping and after the optimizer step."""

    def __init__(self):
        self.before: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.before.append(torch.nn.utils.get_total_norm(grads).item())


@pytest.mark.parametrize("clip", [None, 0.05, 1e3])
def test_total_norm_before_and_after_clipping(tmp_path, clip):
    from study.model import GPT2Module

    module = GPT2Module(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
    recorder = GradRecorder()
    monitor = GradientNormMonitor(every_n_steps=1, validation=False, per_parameter_every_n_steps=2)
    make_trainer(tmp_path, [monitor, recorder], max_steps=3, gradient_clip_val=clip, limit_val_batches=0).fit(
        module, token_loader(n=6)
    )
    logged = scalars(tmp_path)
    totals = [v for _, v in logged["grad_norm/total"]]
    assert [s for s, _ in logged["grad_norm/total"]] == [0, 1, 2]
    assert totals == pytest.approx(recorder.before, rel=1e-6)
    clipped = [v for _, v in logged["grad_norm/total_clipped"]]
    expected = totals if clip is None else [min(t, clip) for t in totals]
    assert clipped == pytest.approx(expected, rel=1e-5)
    if clip == 0.05:
        assert all(t > clip for t in totals)  # the clip was active
    # Groupings partition the gradients: their squares add up to the total.
    step0 = {tag: values[0][1] for tag, values in logged.items() if values[0][0] == 0}
    blocks = [v for t, v in step0.items() if t.startswith("grad_norm/block_")]
    kinds = [
        step0[f"grad_norm/{k}"]
        for k in ("attn_q", "attn_k", "attn_v", "attn_out", "mlp", "embedding", "norm")
    ]
    assert sorted(t for t in step0 if t.startswith("grad_norm/block_")) == [
        "grad_norm/block_0",
        "grad_norm/block_1",
        "grad_norm/block_none",
    ]
    assert math.sqrt(sum(b * b for b in blocks)) == pytest.approx(totals[0], rel=1e-5)
    assert math.sqrt(sum(k * k for k in kinds)) == pytest.approx(totals[0], rel=1e-5)  # GPT-2 ties the head
    assert step0["grad_norm/nonfinite_count"] == 0
    # Per-parameter detail only every second step.
    detail = logged["grad_norm/param/model.transformer.h.0.attn.c_attn.weight"]
    assert [s for s, _ in detail] == [0, 2]


def test_jacobian_equals_autograd():
    """The logged statistic is the spectral norm of autograd's Jacobian of softmax(l / T) on the sampled rows."""
    torch.manual_seed(0)
    temperature, length = 0.3, 12
    logits = torch.randn(2, 3, length, length) * 2
    allowed = causal_allowed(length, length, torch.device("cpu"))[None, None]
    weights = (logits / temperature).masked_fill(~allowed, -math.inf).softmax(-1)
    monitor = GradientNormMonitor(jacobian_rows=1000)  # more than there are rows: every valid row is taken
    monitor._open(TRAIN)
    monitor.observe(0, weights, allowed, AttentionSpec(temperature=temperature))
    monitor._close()
    monitor.before_reduce(TRAIN)  # the norms of the sampled rows are computed at log time, all layers at once
    sums = monitor._sums[TRAIN][0]

    reference = []
    for b, h, t in [(b, h, t) for b in range(2) for h in range(3) for t in range(1, length)]:
        row = logits[b, h, t, : t + 1]
        jac = torch.autograd.functional.jacobian(lambda x: torch.softmax(x / temperature, -1), row)
        reference.append(torch.linalg.matrix_norm(jac, ord=2).item())
    reference = torch.tensor(reference, dtype=torch.float64)
    assert sums["rows"].item() == len(reference)
    assert sums["jacobian"].item() == pytest.approx(reference.sum().item(), rel=1e-4)
    assert sums["jacobian_max"].item() == pytest.approx(reference.max().item(), rel=1e-4)
    assert sums["above_quarter"].item() == (reference > 1 / (4 * temperature)).sum().item()
    assert reference.max() <= 1 / (2 * temperature) + 1e-6


def test_jacobian_tags_on_llama_and_plain(tmp_path):
    """Jacobian tags beside 1/(4T) and 1/(2T), on a Llama and on a plain `attend` model, train and validation."""
    temperature = 0.5
    for name, module in (
        ("llama", LlamaModule(AttentionSpec(temperature=temperature))),
        ("plain", PlainAttention(AttentionSpec(temperature=temperature))),
    ):
        make_trainer(tmp_path / name, [GradientNormMonitor(every_n_steps=2)], max_steps=2).fit(
            module, token_loader(), token_loader(seed=1)
        )
        logged = scalars(tmp_path / name)
        for prefix, step in (("", 0), ("val/", 2)):
            assert logged[f"{prefix}attention/jacobian/bound_quarter_T"] == [
                (step, pytest.approx(1 / (4 * temperature)))
            ]
            assert logged[f"{prefix}attention/jacobian/bound_half_T"] == [
                (step, pytest.approx(1 / (2 * temperature)))
            ]
            for layer in (0, 1):
                value = logged[f"{prefix}attention/jacobian/layer_{layer}"][0][1]
                assert 0 < value <= 1 / (2 * temperature) + 1e-6
            assert logged[f"{prefix}attention/jacobian/max"][0][1] <= 1 / (2 * temperature) + 1e-6
        assert [s for s, _ in logged["grad_norm/total"]] == [0]  # every_n_steps=2 over steps 0, 1
        assert "val/grad_norm/total" not in logged
        kinds = {t.split("/")[1] for t in logged if t.startswith("grad_norm/")}
        assert {"attn_q", "attn_k", "attn_v", "attn_out"} <= kinds


class NaNGradient(L.LightningModule):
    """One NaN gradient element (bias[0]); everything else finite."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def training_step(self, batch, batch_idx):
        return self.layer(batch["x"]).sum() + float("nan") * self.layer.bias[0]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_nonfinite_gradient_elements_are_counted(tmp_path):
    loader = torch.utils.data.DataLoader([{"x": torch.ones(4)}] * 2, batch_size=2)
    trainer = make_trainer(tmp_path, [GradientNormMonitor(every_n_steps=1, jacobian_rows=0)], max_steps=1,
                           limit_val_batches=0)
    trainer.fit(NaNGradient(), train_dataloaders=loader)
    logged = scalars(tmp_path)
    assert logged["grad_norm/nonfinite_count"] == [(0, 1.0)]
    assert math.isnan(logged["grad_norm/total"][0][1])
