"""GradientNormMonitor: norms against torch before and after clipping, per block, kind, and block and kind."""

import math

import lightning as L
import pytest
import torch

from study.callbacks import GradientNormMonitor
from tests.callback_helpers import make_trainer, scalars, token_loader


class GradRecorder(L.Callback):
    """Reference values computed with torch itself, before clipping and after the optimizer step."""

    def __init__(self):
        self.before: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.before.append(torch.nn.utils.get_total_norm(grads).item())


@pytest.mark.parametrize("clip", [None, 0.05, 1e3])
def test_total_norm_before_and_after_clipping(tmp_path, clip):
    from study.model import CausalLMModule

    module = CausalLMModule(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
    recorder = GradRecorder()
    monitor = GradientNormMonitor(every_n_steps=1, per_parameter_every_n_steps=2)
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


def test_block_kind_norms_match_torch_per_layer(tmp_path):
    """by="block_kind": each layer's W_q, W_k, W_v, W_o and MLP gradient norms, against torch on the same step."""
    from study.model import CausalLMModule

    class Grads(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.grads = {n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None}

    module = CausalLMModule(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
    recorder = Grads()
    monitor = GradientNormMonitor(every_n_steps=1, by=("block_kind",))
    make_trainer(tmp_path, [monitor, recorder], max_steps=1, limit_val_batches=0).fit(module, token_loader(n=2))
    logged = scalars(tmp_path)
    for block in (0, 1):
        c_attn = recorder.grads[f"model.transformer.h.{block}.attn.c_attn.weight"]
        bias = recorder.grads[f"model.transformer.h.{block}.attn.c_attn.bias"]
        q = torch.cat([c_attn[:, :32].flatten(), bias[:32]])  # Conv1D: [q | k | v] along the output columns
        v = torch.cat([c_attn[:, 64:].flatten(), bias[64:]])
        mlp = torch.cat([recorder.grads[f"model.transformer.h.{block}.mlp.{m}.{leaf}"].flatten()
                         for m in ("c_fc", "c_proj") for leaf in ("weight", "bias")])  # fmt: skip
        for kind, reference in (("attn_q", q), ("attn_v", v), ("mlp", mlp)):
            assert logged[f"grad_norm/block_{block}/{kind}"][0][1] == pytest.approx(reference.norm().item(), rel=1e-5)
    assert "grad_norm/block_0" not in logged and "grad_norm/attn_q" not in logged  # only the grouping asked for


def test_bad_grouping_is_refused_before_training():
    with pytest.raises(ValueError, match="blocks"):
        GradientNormMonitor(by=("blocks",))


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
    trainer = make_trainer(tmp_path, [GradientNormMonitor(every_n_steps=1)], max_steps=1,
                           limit_val_batches=0)
    trainer.fit(NaNGradient(), train_dataloaders=loader)
    logged = scalars(tmp_path)
    assert logged["grad_norm/nonfinite_count"] == [(0, 1.0)]
    assert math.isnan(logged["grad_norm/total"][0][1])


def test_monitors_measure_the_last_step_too():
    """Every n steps from 0, and the run's last step: 0, 5, 10 and 13 of a 14-step run (13 was never measured)."""
    from types import SimpleNamespace

    from study.callbacks.base import due, last_step

    last = last_step(SimpleNamespace(max_steps=14))
    assert [s for s in range(14) if due(s, 5, last)] == [0, 5, 10, 13]
    assert last_step(SimpleNamespace(max_steps=-1)) is None and [s for s in range(7) if due(s, 5, None)] == [0, 5]
