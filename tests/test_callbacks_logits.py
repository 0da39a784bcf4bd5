"""AttentionLogitMonitor and the taps' logits: closed forms and brute-force references, read back from event files."""

import math

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from study import tags
from study.attention import AttentionSpec, attend, blockwise_settings, tapping
from study.attention import tap as tap_module
from study.callbacks import AttentionLogitMonitor
from tests.callback_helpers import LlamaModule, make_trainer, scalars, token_loader

L_SEQ, D = 12, 8
PEAK = 6.0  # the planted q and k: q_5 = k_3 = PEAK e_0 in every head, so the largest raw logit is PEAK^2 / sqrt(D)


class FixedQK(L.LightningModule):
    """Two attention layers whose queries and keys are parameters, so every logit is known: layer 1's are layer 0's
    times 2. Query 5 and key 3 (visible to it) carry a planted peak far above the random entries."""

    def __init__(self, spec: AttentionSpec, heads: int = 4, kv_heads: int = 2, length: int = L_SEQ) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, heads, length, D, generator=g) * 0.5
        k = torch.randn(1, kv_heads, length, D, generator=g) * 0.5
        q[:, :, 5], k[:, :, 3] = 0.0, 0.0
        q[:, :, 5, 0], k[:, :, 3, 0] = PEAK, PEAK
        self.q, self.k = nn.Parameter(q), nn.Parameter(k)
        self.v = nn.Parameter(torch.randn(1, kv_heads, length, D, generator=g))
        self.spec = spec

    def forward(self) -> torch.Tensor:
        out0 = attend(self.q, self.k, self.v, self.spec, layer=0)
        out1 = attend(2 * self.q, self.k, self.v, self.spec, layer=1)
        return (out0.square().mean() + out1.square().mean())

    def training_step(self, batch, batch_idx):
        return self()

    def validation_step(self, batch, batch_idx):
        return self()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)  # the weights validation sees are step 0's

    def reference(self) -> dict[int, dict[str, np.ndarray]]:
        """Per layer, in float64: raw logits (H, L, L) and the causal mask."""
        q = self.q.detach().double()[0]
        k = self.k.detach().double()[0].repeat_interleave(q.shape[0] // self.k.shape[1], dim=0)
        visible = np.tril(np.ones((q.shape[1], q.shape[1]), dtype=bool))
        return {layer: {"raw": (scale * q @ k.transpose(-1, -2)).numpy() * D**-0.5, "visible": visible}
                for layer, scale in ((0, 1.0), (1, 2.0))}


class CountingLogitMonitor(AttentionLogitMonitor):
    calls = 0  # calls whose logits it was handed (the explicit path)
    row_calls = 0  # calls whose row statistics it was handed (the fused path: no map)

    def observe_logits(self, layer, logits):
        self.calls += 1
        super().observe_logits(layer, logits)

    def observe_rows(self, layer, rows, spec):
        self.row_calls += 1
        super().observe_rows(layer, rows, spec)


def batches(n: int = 1) -> DataLoader:
    return DataLoader([{"x": torch.zeros(1)}] * n, batch_size=1)


def fit(tmp_path, module, monitor, **kwargs) -> dict:
    make_trainer(tmp_path, [monitor], max_steps=1, limit_val_batches=1, **kwargs).fit(module, batches(), batches())
    return {tag: values[0][1] for tag, values in scalars(tmp_path).items()}


@pytest.mark.parametrize(
    "spec, blockwise",
    [
        (AttentionSpec(), False),  # stock softmax: the fused path, row statistics on the tapped steps
        (AttentionSpec(temperature=0.1), False),
        (AttentionSpec(temperature=0.1, top_k=2), False),  # top-k: the explicit path and its logits
        (AttentionSpec(temperature=0.3, top_k=5), True),  # blockwise: the logits a block of rows at a time
    ],
    ids=["stock", "T0.1", "T0.1-top2", "T0.3-top5-blockwise"],
)
def test_closed_form_maximum_and_brute_force_moments(tmp_path, spec, blockwise):
    module = FixedQK(spec)
    monitor = CountingLogitMonitor(every_n_steps=1, per_head=True)
    if blockwise:
        with blockwise_settings(min_scores=0, block_scores=4 * L_SEQ * 3):  # 3 rows a block: 4 blocks
            logged = fit(tmp_path, module, monitor)
    else:
        logged = fit(tmp_path, module, monitor)
    # one training step and one validation batch, two layers; blockwise: 4 blocks of rows each
    if spec.top_k is None:
        assert (monitor.row_calls, monitor.calls) == (2 * 2, 0)
    else:
        assert (monitor.row_calls, monitor.calls) == (0, 2 * 2 * (4 if blockwise else 1))
    T = spec.temperature
    for prefix in ("", "val/"):
        for layer, ref in module.reference().items():
            peak = (1.0 if layer == 0 else 2.0) * PEAK**2 * D**-0.5
            raw = ref["raw"][:, ref["visible"]]  # (H, visible pairs)
            assert raw.max() == pytest.approx(peak)  # the planted peak is the maximum
            assert logged[prefix + tags.attention("max_logit_raw", layer)] == pytest.approx(peak, rel=1e-6)
            assert logged[prefix + tags.attention("max_logit", layer)] == pytest.approx(peak / T, rel=1e-6)
            for h in range(4):
                assert logged[prefix + tags.attention("max_logit_raw", layer, h)] == pytest.approx(raw[h].max(), rel=1e-6)
            scaled = raw / T
            assert logged[prefix + tags.attention("logit_mean", layer)] == pytest.approx(scaled.mean(), rel=1e-5, abs=1e-6)
            assert logged[prefix + tags.attention("logit_std", layer)] == pytest.approx(scaled.std(), rel=1e-5)
            assert logged[prefix + tags.attention("logit_std", layer, 1)] == pytest.approx(scaled[1].std(), rel=1e-5)
        assert logged[prefix + tags.MAX_LOGIT] == pytest.approx(2 * PEAK**2 * D**-0.5 / T, rel=1e-6)
        assert logged[prefix + tags.MAX_LOGIT] == pytest.approx(logged[prefix + tags.MAX_LOGIT_RAW] / T, rel=1e-6)
        assert logged[prefix + tags.attention_spread("max_logit", "min")] == pytest.approx(PEAK**2 * D**-0.5 / T, rel=1e-6)
    # the run-level copy that leads TensorBoard's pages
    assert logged["Summary/max_attention_logit"] == logged[tags.MAX_LOGIT]


def test_masked_positions_are_excluded(tmp_path):
    """A peak above the diagonal (query 3, key 5: masked by causality) must not be the maximum."""
    module = FixedQK(AttentionSpec(temperature=0.5))
    with torch.no_grad():
        module.q[:, :, 5], module.k[:, :, 3], module.q[:, :, 3], module.k[:, :, 5] = 0.0, 0.0, 0.0, 0.0
        module.q[:, :, 3, 0], module.k[:, :, 5, 0] = PEAK, PEAK
    logged = fit(tmp_path, module, AttentionLogitMonitor(every_n_steps=1, validation=False))
    ref = module.reference()[0]
    assert ref["raw"].max() == pytest.approx(PEAK**2 * D**-0.5)  # the masked peak exists ...
    visible_max = ref["raw"][:, ref["visible"]].max()
    assert visible_max < PEAK**2 * D**-0.5 / 2  # ... and is far above every visible logit
    assert logged[tags.attention("max_logit_raw", 0)] == pytest.approx(visible_max, rel=1e-6)


def test_tiny_llama_gqa_against_the_captured_queries_and_keys(tmp_path):
    """GQA and rotary positions (tiny Llama, 2 query heads sharing 1 key head): the monitor's maxima and moments equal
    a float64 brute force over the queries and keys the attention call received (after rotary, keys shared out)."""

    class Capture:
        def __init__(self):
            self.inputs = {}

        def observe_inputs(self, layer, inputs):
            self.inputs[layer] = inputs

        def observe(self, layer, weights, allowed, spec):
            pass

    spec = AttentionSpec(temperature=0.25, top_k=4)
    module = LlamaModule(spec)
    ids = next(iter(token_loader(n=2, length=16)))["input_ids"]
    capture = Capture()
    with torch.no_grad(), tapping(capture):
        module.model(input_ids=ids)
    monitor = AttentionLogitMonitor(every_n_steps=1, per_head=True)
    single = DataLoader([{"input_ids": row} for row in ids], batch_size=2)
    make_trainer(tmp_path, [monitor], max_steps=1, limit_val_batches=1).validate(module, single)
    logged = {tag: values[0][1] for tag, values in scalars(tmp_path).items()}
    assert capture.inputs, "no attention call captured"
    for layer, inputs in capture.inputs.items():
        q, k = inputs.query.double(), inputs.key.double()
        raw = (q @ k.transpose(-1, -2)) * inputs.scaling
        visible = torch.ones(16, 16).tril().bool()
        raw = raw[..., visible]  # (B, H, visible pairs)
        assert logged[f"val/{tags.attention('max_logit_raw', layer)}"] == pytest.approx(raw.max().item(), rel=1e-5)
        assert logged[f"val/{tags.attention('max_logit', layer)}"] == pytest.approx(raw.max().item() / 0.25, rel=1e-5)
        for h in range(q.shape[1]):
            assert logged[f"val/{tags.attention('max_logit', layer, h)}"] == pytest.approx(raw[:, h].max().item() / 0.25, rel=1e-5)
        assert logged[f"val/{tags.attention('logit_mean', layer)}"] == pytest.approx((raw / 0.25).mean().item(), rel=1e-5, abs=1e-5)
        assert logged[f"val/{tags.attention('logit_std', layer)}"] == pytest.approx((raw / 0.25).std(unbiased=False).item(), rel=1e-5)


def test_only_a_tap_that_asks_gets_logits(monkeypatch):
    """Taps without ``observe_logits`` cost nothing more: no logits are built, no raw scores kept."""
    built = []
    real = tap_module.AttentionLogits
    monkeypatch.setattr(tap_module, "AttentionLogits", lambda *a: built.append(1) or real(*a))

    class Weights:
        def __init__(self):
            self.calls = 0

        def observe(self, layer, weights, allowed, spec):
            self.calls += 1

    class Logits(Weights):
        def observe_logits(self, layer, logits):
            self.maxima = logits.scaled.amax()

    q = torch.randn(1, 2, 6, 4)
    plain = Weights()
    with tapping(plain):
        attend(q, q, q, AttentionSpec(temperature=0.5))
    assert plain.calls == 1 and not built
    asking = Logits()
    with tapping(asking):
        attend(q, q, q, AttentionSpec(temperature=0.5))
    assert built == [1] and asking.calls == 1
    scaled = (q @ q.transpose(-1, -2)) * 4**-0.5 / 0.5
    assert asking.maxima.item() == pytest.approx(scaled.masked_fill(~torch.ones(6, 6).tril().bool(), -math.inf).max().item())


def test_layer_filter(tmp_path):
    """``layers`` keeps the named layers only ("mid" and negative indices resolved against the taps' layer count)."""
    logged = fit(tmp_path, FixedQK(AttentionSpec()), AttentionLogitMonitor(every_n_steps=1, layers=[-1]))
    layer_tags = {t for t in logged if "/layer_" in t and "layer_m" not in t}
    assert layer_tags and all("/layer_1" in t for t in layer_tags), layer_tags
    assert logged[tags.MAX_LOGIT] == pytest.approx(2 * PEAK**2 * D**-0.5, rel=1e-6)
    assert logged[tags.attention_spread("max_logit", "min")] == logged[tags.MAX_LOGIT]  # one layer logged


def test_bad_layer_choices_are_refused():
    for bad in ("mid", [], [1.5], [True], ["middle"]):
        with pytest.raises(ValueError, match="layers"):
            AttentionLogitMonitor(layers=bad)
    monitor = AttentionLogitMonitor(layers=[0, 5])
    monitor._largest_layer_seen = 1
    with pytest.raises(ValueError, match="layer 5 is not among the model's 2 attention layers"):
        monitor.resolve_layer_choice()
