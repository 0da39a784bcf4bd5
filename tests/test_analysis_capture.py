"""The capture reproduces the model's own (eager) attention weights, for GPT-2 and a GQA + RoPE Llama."""

import copy
import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from study.frozen.analysis.capture import capture_attention


def _gpt2_config():
    return GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)


def _llama_config():
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _eager_weights(model_cls, config, state, ids):
    eager_cfg = copy.deepcopy(config)
    eager_cfg._attn_implementation = "eager"
    eager = model_cls(eager_cfg).eval()
    eager.load_state_dict(state)
    with torch.no_grad():
        out = eager(input_ids=ids, output_attentions=True)
    return out.attentions, out.logits


@pytest.mark.parametrize("model_cls,make_config", [(GPT2LMHeadModel, _gpt2_config), (LlamaForCausalLM, _llama_config)])
def test_capture_matches_eager_attention(model_cls, make_config):
    torch.manual_seed(0)
    config = make_config()
    model = model_cls(copy.deepcopy(config)).eval()
    ids = torch.randint(0, 64, (2, 20))
    previous = model.config._attn_implementation
    cap = capture_attention(model, ids, hidden_states=True)
    assert model.config._attn_implementation == previous  # restored
    attentions, eager_logits = _eager_weights(model_cls, config, model.state_dict(), ids)
    assert cap.n_layers == len(attentions) == 2
    assert cap.n_heads == 4  # GQA: 2 key/value heads expanded to 4 query heads
    for layer, ref in enumerate(attentions):
        got = cap.weights(layer)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # The capture does not change the model's output, and the model stays causal.
    with torch.no_grad():
        stock = model(input_ids=ids).logits
    torch.testing.assert_close(stock, eager_logits, atol=1e-5, rtol=1e-5)
    assert len(cap.hidden_states) == 3
    assert cap.vectors(0, "hidden").shape == (2, 1, 20, 32)


def test_prefix_capture_equals_slice():
    """Causal models: the capture of a prefix equals the slice of the full capture (protocol.py relies on it)."""
    torch.manual_seed(1)
    model = LlamaForCausalLM(_llama_config()).eval()
    ids = torch.randint(0, 64, (1, 24))
    full = capture_attention(model, ids)
    prefix = capture_attention(model, ids[:, :10])
    torch.testing.assert_close(full.logits(1, 10), prefix.logits(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full.vectors(1, length=10), prefix.vectors(1), atol=1e-5, rtol=1e-5)


def test_capture_rejects_bad_input():
    model = GPT2LMHeadModel(_gpt2_config())
    with pytest.raises(ValueError, match="65"):
        capture_attention(model, torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        capture_attention(model, torch.zeros(1, 0, dtype=torch.long))


def test_capture_keeps_only_the_chosen_layers():
    torch.manual_seed(2)
    model = LlamaForCausalLM(_llama_config()).eval()
    ids = torch.randint(0, 64, (2, 16))
    full = capture_attention(model, ids)
    lean = capture_attention(model, ids, layers=[1])
    assert lean.n_layers == 2 and lean.kept_layers == [1] and lean.queries[0] is None and lean.n_heads == 4
    torch.testing.assert_close(lean.weights(1), full.weights(1), atol=0, rtol=0)
    with pytest.raises(ValueError, match="layer 0 was not kept"):
        lean.weights(0)
    with pytest.raises(ValueError, match="layer 0 was not kept"):
        lean.vectors(0)
    with pytest.raises(ValueError, match=r"layers \[5\] not in the model"):
        capture_attention(model, ids, layers=[5])
    first = capture_attention(model, ids, layers=[0])  # the forward pass stops after layer 0's inputs
    assert first.n_layers == 2 and first.kept_layers == [0] and math.isnan(first.scalings[1])
    torch.testing.assert_close(first.weights(0), full.weights(0), atol=0, rtol=0)


def test_capture_under_blockwise_attention_equals_the_dense_one():
    """At long L the model's attention runs in blocks of query rows while the capture records its inputs (they
    come with the first block): the same q, k, v and weights as on the dense path."""
    from study.attention import blockwise_settings

    torch.manual_seed(4)
    model = LlamaForCausalLM(_llama_config()).eval()
    ids = torch.randint(0, 64, (1, 40))
    dense = capture_attention(model, ids)
    with blockwise_settings(min_scores=0, block_scores=4 * 40 * 7):  # 7 query rows a block
        blocks = capture_attention(model, ids)
    for layer in range(2):
        torch.testing.assert_close(blocks.queries[layer], dense.queries[layer], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(blocks.values[layer], dense.values[layer], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(blocks.weights(layer), dense.weights(layer), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("spec", [None, "sparsemax", "top_k"])
def test_weights_in_row_blocks_equal_one_piece(monkeypatch, spec):
    """Above WEIGHTS_IN_ONE_PIECE scores a layer's weights are normalised a block of rows at a time."""
    from study.attention import AttentionSpec, apply_attention_spec
    from study.frozen.analysis import capture as capture_module

    torch.manual_seed(5)
    model = GPT2LMHeadModel(_gpt2_config()).eval()
    if spec is not None:
        model = apply_attention_spec(model, AttentionSpec(normalizer="sparsemax") if spec == "sparsemax"
                                     else AttentionSpec(normalizer="softmax", top_k=3))
    cap = capture_attention(model, torch.randint(0, 64, (2, 24)))
    whole = cap.weights(1)
    monkeypatch.setattr(capture_module, "WEIGHTS_IN_ONE_PIECE", 0)
    monkeypatch.setattr(capture_module, "WEIGHTS_BLOCK", 2 * 4 * 24 * 5)  # 5 rows a block
    torch.testing.assert_close(cap.weights(1), whole, atol=0, rtol=0)
    torch.testing.assert_close(cap.weights(1, temperature=0.5), cap.normalize(1, cap.logits(1) / 0.5),
                               atol=1e-6, rtol=1e-5)
