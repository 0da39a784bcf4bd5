"""Monitors under the other normalisers: sparse maps, rows that do not sum to 1, learnable parameters."""

import math

import pytest
import torch

from study.attention import AttentionSpec
from study.callbacks import (
    AttentionEntropyMonitor,
    GradientNormMonitor,
    NormalizerParameterMonitor,
    SelectionUniformityMonitor,
    normalizer_parameters,
)
from study.model import CausalLMModule
from tests.callback_helpers import events, make_trainer, scalars, token_loader

TINY = dict(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64, learning_rate=0.05, warmup_steps=1)


@pytest.mark.parametrize("spec", [AttentionSpec(normalizer="ssmax"), AttentionSpec(normalizer="entmax", learnable=True)])
def test_learnable_normalizer_parameters_train_and_are_logged(tmp_path, spec):
    module = CausalLMModule(spec, **TINY)
    before = {k: v.detach().clone() for k, v in normalizer_parameters(module).items()}
    assert len(before) == 2  # one per layer
    trainer = make_trainer(tmp_path, [NormalizerParameterMonitor(every_n_steps=1)], max_steps=3, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=token_loader(n=6))
    logged = scalars(tmp_path)
    name = "ssmax_s" if spec.normalizer == "ssmax" else "entmax_alpha"
    for layer in (0, 1):
        tag = f"normalizer/{name}/layer_{layer}"
        series = logged[tag]
        assert [step for step, _ in series] == [0, 1, 2]
        current = normalizer_parameters(module)[f"{name}/layer_{layer}"]
        assert series[-1][1] == pytest.approx(current.mean().item(), rel=1e-6)
        assert not torch.equal(current, before[f"{name}/layer_{layer}"])  # it trained
    assert any("normalizer/" in tag for tag in events(tmp_path).Tags()["histograms"])


def test_sparsemax_rows_are_sparse_and_have_no_softmax_jacobian(tmp_path):
    module = CausalLMModule(AttentionSpec(normalizer="sparsemax", temperature=0.05), **TINY)
    monitors = [AttentionEntropyMonitor(every_n_steps=1), SelectionUniformityMonitor(every_n_steps=1),
                GradientNormMonitor(every_n_steps=1)]
    make_trainer(tmp_path, monitors, max_steps=1, limit_val_batches=0).fit(module, train_dataloaders=token_loader())
    logged = {tag: values[0][1] for tag, values in scalars(tmp_path).items()}
    # 16 tokens: the mean visible count is 8.5; sparsemax at T = 0.05 keeps far fewer keys.
    assert 1 <= logged["attention/nonzero/mean"] < 8.5
    assert math.isfinite(logged["attention/entropy/mean"]) and logged["attention/entropy/mean"] >= 0
    assert not any(tag.startswith("attention/jacobian") for tag in logged)
    assert "grad_norm/total" in logged


def test_self_adjust_statistics_describe_the_normalised_magnitudes(tmp_path):
    module = CausalLMModule(AttentionSpec(normalizer="self_adjust"), **TINY)
    make_trainer(tmp_path, [AttentionEntropyMonitor(every_n_steps=1), SelectionUniformityMonitor(every_n_steps=1)],
                 max_steps=1, limit_val_batches=0).fit(module, train_dataloaders=token_loader())
    logged = {tag: values[0][1] for tag, values in scalars(tmp_path).items()}
    assert 0 <= logged["attention/normalized_entropy/mean"] <= 1
    assert 0 <= logged["attention/kl_uniform/mean"]
    assert 0 < logged["attention/topk_mass_k1/mean"] <= 1
