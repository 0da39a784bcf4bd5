"""Encoders (bidirectional, padding masks) and vision transformers under `apply_attention_spec`, with every monitor.

Closed form: with zeroed queries every score is 0, so each row is uniform over the keys it can see and its
entropy is log n, n = the number of unpadded keys of its sequence (padded query rows see the same keys).
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertModel, ViTConfig, ViTModel

from study.attention import AttentionSpec, apply_attention_spec, attention_modules, tapping
from study.callbacks import (
    AttentionEntropyMonitor,
    AttentionJacobianMonitor,
    AttentionMapMonitor,
    GradientNormMonitor,
    NormalizerParameterMonitor,
    SelectionUniformityMonitor,
)
from tests.callback_helpers import make_trainer, scalars

LENGTH, PAD = 8, 3  # the second sequence of each batch ends in PAD padding tokens


def _zero_queries(model: torch.nn.Module, zero: bool) -> torch.nn.Module:
    if zero:
        for module in attention_modules(model):
            query = getattr(module, "query", None) or module.q_proj  # BERT: query; ViT (5.24): q_proj
            torch.nn.init.zeros_(query.weight)
            torch.nn.init.zeros_(query.bias)
    return model


def bert(spec: AttentionSpec, zero_queries: bool = True) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)
    return _zero_queries(apply_attention_spec(BertModel(config, add_pooling_layer=False), spec), zero_queries)


def vit(spec: AttentionSpec, zero_queries: bool = True) -> ViTModel:
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64)
    return _zero_queries(apply_attention_spec(ViTModel(config, add_pooling_layer=False), spec), zero_queries)


class Encoder(L.LightningModule):
    """Trains an encoder on a toy loss (mean squared output) so the monitors see real training steps."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        return self.model(**batch).last_hidden_state.pow(2).mean()

    def validation_step(self, batch, batch_idx):
        return self.model(**batch).last_hidden_state.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def text_batches(n: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(n):
        mask = torch.ones(LENGTH, dtype=torch.long)
        if i % 2:
            mask[-PAD:] = 0
        samples.append({"input_ids": torch.randint(1, 64, (LENGTH,), generator=g), "attention_mask": mask})
    return DataLoader(samples, batch_size=2)


def image_batches(n: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader([{"pixel_values": torch.randn(3, 16, 16, generator=g)} for _ in range(n)], batch_size=2)


def monitors() -> list:
    return [
        AttentionEntropyMonitor(every_n_steps=1),
        SelectionUniformityMonitor(every_n_steps=1, selection_ks=(1, 4)),
        GradientNormMonitor(every_n_steps=1),
        AttentionJacobianMonitor(every_n_steps=1),
        AttentionMapMonitor(every_n_steps=1),
        NormalizerParameterMonitor(every_n_steps=1),
    ]


@pytest.mark.parametrize(
    "build, loader, spec, expected",
    [
        # Half the rows see LENGTH keys, half LENGTH - PAD (the padded sequence's rows, padded queries included).
        (bert, text_batches, AttentionSpec(normalizer="ssmax"), (math.log(LENGTH) + math.log(LENGTH - PAD)) / 2),
        # 16 patches of 4 x 4 and the CLS token: 17 keys for every row.
        (vit, image_batches, AttentionSpec(temperature=0.5), math.log(17)),
    ],
    ids=["bert-ssmax", "vit-softmax"],
)
def test_every_monitor_runs_and_entropy_is_log_n_on_uniform_attention(tmp_path, build, loader, spec, expected):
    module = Encoder(build(spec))
    trainer = make_trainer(tmp_path, monitors(), max_steps=2)
    trainer.fit(module, loader(), loader())
    logged = scalars(tmp_path)
    for layer in range(2):
        for tag in (f"attention/entropy/layer_{layer}", f"val/attention/entropy/layer_{layer}"):
            assert logged[tag][0][1] == pytest.approx(expected, abs=1e-5), tag
    assert "attention/topk_mass_k4/mean" in logged and "grad_norm/attn_q" in logged
    if spec.normalizer == "ssmax":
        assert "normalizer/ssmax_s/layer_1" in logged
    else:  # (1/T)(diag(a) - a a^T) for uniform a over n keys has spectral norm 1 / (n T)
        assert logged["attention/jacobian/layer_1"][0][1] == pytest.approx(1 / (17 * spec.temperature), rel=1e-4)


def test_uniform_rows_closed_form_with_a_tap_on_padded_bert():
    """The tap hands each row its visible keys: the padded sequence's rows see LENGTH - PAD keys."""
    seen = {}

    class Keep:
        def observe(self, layer, weights, allowed, spec):
            seen[layer] = (weights, allowed.expand_as(weights))

    model = bert(AttentionSpec(temperature=0.3)).eval()
    batch = next(iter(text_batches(2)))
    with torch.no_grad(), tapping(Keep()):
        model(**batch)
    assert sorted(seen) == [0, 1]  # BERT layers numbered in module order
    weights, allowed = seen[0]
    n = allowed.sum(-1)
    assert n[0].unique().tolist() == [LENGTH] and n[1].unique().tolist() == [LENGTH - PAD]
    torch.testing.assert_close(weights, allowed / n[..., None])


def test_vit_has_no_layer_idx_and_is_numbered_in_module_order():
    model = vit(AttentionSpec(temperature=0.5, layers=(1,)), zero_queries=False)
    modules = attention_modules(model)
    assert [getattr(m, "layer_idx", None) for m in modules] == [None, None]
    assert [m.study_layer for m in modules] == [0, 1]
    assert [m.study_spec.temperature for m in modules] == [1.0, 0.5]
