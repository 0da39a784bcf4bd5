"""Transformers integration: parity with stock attention, causality, and per-layer specs on GPT-2 and Llama."""

import copy

import pytest
import torch

from study.attention import AttentionSpec, apply_attention_spec, current_spec, tapping
from study.attention.hf import IMPLEMENTATION, stock_copy


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits


@pytest.fixture
def ids():
    return torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))


def test_stock_spec_matches_stock_eager_logits(tiny_causal_lm, ids):
    stock = stock_copy(tiny_causal_lm, "eager")
    apply_attention_spec(tiny_causal_lm, AttentionSpec())
    assert tiny_causal_lm.config._attn_implementation == IMPLEMENTATION
    assert (logits(tiny_causal_lm, ids) - logits(stock, ids)).abs().max() <= 1e-5
    # The explicit path (forced by an open tap) matches too.
    with tapping(type("Null", (), {"observe": lambda *a: None})()):
        assert (logits(tiny_causal_lm, ids) - logits(stock, ids)).abs().max() <= 1e-5


def test_large_top_k_equals_plain_softmax(tiny_causal_lm, ids):
    stock = stock_copy(tiny_causal_lm, "sdpa")
    apply_attention_spec(tiny_causal_lm, AttentionSpec(top_k=ids.shape[1]))
    assert (logits(tiny_causal_lm, ids) - logits(stock, ids)).abs().max() <= 1e-5


def test_temperature_changes_logits_and_matches_scaled_eager(tiny_causal_lm, ids):
    """T = 0.5 equals stock eager attention with every layer's scaling doubled."""
    stock = stock_copy(tiny_causal_lm, "eager")
    for module in stock.modules():
        if hasattr(module, "scaling"):  # the scale both architectures pass to their attention function
            module.scaling = module.scaling / 0.5
    apply_attention_spec(tiny_causal_lm, AttentionSpec(temperature=0.5))
    out = logits(tiny_causal_lm, ids)
    assert (out - logits(stock, ids)).abs().max() <= 1e-5
    apply_attention_spec(tiny_causal_lm, AttentionSpec())
    assert (out - logits(tiny_causal_lm, ids)).abs().max() > 1e-4  # tiny random models attend almost uniformly


@pytest.mark.parametrize("spec", [AttentionSpec(), AttentionSpec(top_k=2, temperature=0.3), AttentionSpec(temperature=0.01)])
def test_future_tokens_never_change_past_logits(tiny_causal_lm, ids, spec):
    apply_attention_spec(tiny_causal_lm, spec)
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 7) % 64
    torch.testing.assert_close(logits(tiny_causal_lm, ids)[:, :12], logits(tiny_causal_lm, changed)[:, :12], atol=1e-5, rtol=0)


def test_layers_select_which_attention_modules_change(tiny_causal_lm):
    apply_attention_spec(tiny_causal_lm, AttentionSpec(temperature=0.2, layers=[1]))
    specs = current_spec(tiny_causal_lm)
    assert specs[0] == AttentionSpec() and specs[1].temperature == 0.2
    with pytest.raises(ValueError, match=r"layers \[5\]"):
        apply_attention_spec(tiny_causal_lm, AttentionSpec(layers=[5]))


def test_padded_batch_is_finite_at_low_temperature(tiny_causal_lm, ids):
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    for spec in (AttentionSpec(temperature=0.01), AttentionSpec(temperature=0.01, top_k=3)):
        apply_attention_spec(tiny_causal_lm, spec)
        assert logits(tiny_causal_lm, ids, attention_mask=mask).isfinite().all()


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("top_k", [None, 4])
def test_low_temperature_loss_and_gradients_are_finite(tiny_causal_lm, ids, autocast, top_k):
    apply_attention_spec(tiny_causal_lm, AttentionSpec(temperature=0.01, top_k=top_k))
    tiny_causal_lm.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = tiny_causal_lm(input_ids=ids, labels=ids).loss
    loss.backward()
    assert loss.isfinite()
    assert all(p.grad.isfinite().all() for p in tiny_causal_lm.parameters() if p.grad is not None)


def test_models_from_one_config_do_not_leak_the_implementation():
    from transformers import GPT2LMHeadModel

    from tests.conftest import tiny_gpt2_config

    config = tiny_gpt2_config()
    a, b = GPT2LMHeadModel(copy.deepcopy(config)), GPT2LMHeadModel(copy.deepcopy(config))
    apply_attention_spec(a, AttentionSpec())
    assert b.config._attn_implementation != IMPLEMENTATION


def test_model_without_attention_layers_is_rejected():
    """Not a transformers model: the interception takes it, and its first forward pass, with no SDPA call, is
    refused (study.attention.intercept)."""
    model = apply_attention_spec(torch.nn.Linear(2, 2), AttentionSpec())
    with pytest.raises(RuntimeError, match="Linear's forward pass made no torch.nn.functional.scaled_dot_product"):
        model(torch.randn(1, 2))
