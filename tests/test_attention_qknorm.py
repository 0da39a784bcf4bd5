"""QK-norm (`AttentionSpec(qk_norm=True)`): parity with references and with Qwen3's own QK-norm, gradients against
finite differences and the closed form, the logit bound g^2 sqrt(d) / T, and what a model that already
normalises q and k gets."""

import copy
import math

import pytest
import torch

from study.attention import AttentionSpec, QKNorm, apply_attention_spec, attend, blockwise_settings, tapping
from study.attention.hf import stock_copy
from study.attention.qknorm import EPS, rms_normalize
from study.model import CausalLMModule
from tests.conftest import tiny_gpt2_config, tiny_llama_config


class _NullTap:
    def observe(self, *args, **kwargs) -> None:
        return None


def _qkv(batch=2, heads=4, kv_heads=2, length=7, dim=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, dim, generator=g, dtype=dtype) * 3
    k = torch.randn(batch, kv_heads, length, dim, generator=g, dtype=dtype) * 3
    v = torch.randn(batch, kv_heads, length, dim, generator=g, dtype=dtype)
    return q, k, v


def _gains(norm: QKNorm, seed=1) -> QKNorm:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.query_gain.copy_(0.5 + torch.rand(norm.query_gain.shape, generator=g) * 2)
        norm.key_gain.copy_(0.5 + torch.rand(norm.key_gain.shape, generator=g) * 2)
    return norm


def _reference(q, k, v, norm: QKNorm, temperature: float) -> torch.Tensor:
    """QK-norm attention written out in fp64: normalise, repeat key heads, causal softmax of q.k / (sqrt(d) T)."""
    q, k, v = q.double(), k.double(), v.double()
    qn = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.query_gain.double().view(1, -1, 1, 1)
    kn = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.key_gain.double().view(1, -1, 1, 1)
    groups = q.shape[1] // k.shape[1]
    kn, v = kn.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = qn @ kn.transpose(-1, -2) / math.sqrt(q.shape[-1]) / temperature
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, -math.inf).softmax(-1) @ v


@pytest.mark.parametrize("path", ["fused", "explicit", "blockwise"])
def test_every_path_matches_the_fp64_reference_with_grouped_heads(path):
    q, k, v = _qkv(dtype=torch.float32)
    norm = _gains(QKNorm(4, 2))
    spec = AttentionSpec(temperature=0.3, qk_norm=True)
    with torch.no_grad():
        if path == "fused":
            out = attend(q, k, v, spec, qk_norm=norm)
        elif path == "explicit":
            with tapping(_NullTap()):
                out = attend(q, k, v, spec, qk_norm=norm)
        else:
            with blockwise_settings(min_scores=0, block_scores=2 * 4 * 7 * 2), tapping(_NullTap()):
                out = attend(q, k, v, spec, qk_norm=norm)
    torch.testing.assert_close(out.double(), _reference(q, k, v, norm, 0.3), atol=2e-5, rtol=0)


def test_off_leaves_q_and_k_alone_and_on_changes_them():
    q, k, v = _qkv()
    norm = _gains(QKNorm(4, 2).double())
    off = attend(q, k, v, AttentionSpec(), qk_norm=norm)  # a module passed with the option off is not used
    plain = attend(q, k, v, AttentionSpec())
    assert torch.equal(off, plain)
    on = attend(q, k, v, AttentionSpec(qk_norm=True), qk_norm=norm)
    assert (on - plain).abs().max() > 1e-2


def test_off_is_stock_transformers_and_switching_back_removes_the_gains(tiny_causal_lm):
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    stock = stock_copy(tiny_causal_lm, "eager")
    with torch.no_grad():
        expected = stock(input_ids=ids).logits
        apply_attention_spec(tiny_causal_lm, AttentionSpec(qk_norm=True))
        normed = tiny_causal_lm(input_ids=ids).logits
        apply_attention_spec(tiny_causal_lm, AttentionSpec())
        back = tiny_causal_lm(input_ids=ids).logits
    assert (normed - expected).abs().max() > 1e-4
    assert not any(name.endswith("study_qk_norm.query_gain") for name, _ in tiny_causal_lm.named_parameters())
    assert (back - expected).abs().max() <= 1e-5


def _tiny_qwen3(**overrides):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=EPS,
                attn_implementation="eager", bos_token_id=0, eos_token_id=1, pad_token_id=None)
    base.update(overrides)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**base)).eval()


def test_equals_qwen3s_own_qk_norm_with_constant_weights_through_rope():
    """Qwen3 normalises q and k per head before RoPE with a weight per dimension; with every weight equal to a
    constant that is a scalar gain, and ours, applied after RoPE, must give the same logits (RMS and a scalar
    commute with the rotation)."""
    qwen = _tiny_qwen3()
    gains = {0: (1.7, 0.6), 1: (0.8, 2.2)}
    for layer, (gq, gk) in gains.items():
        attn = qwen.model.layers[layer].self_attn
        with torch.no_grad():
            attn.q_norm.weight.fill_(gq)
            attn.k_norm.weight.fill_(gk)
    ours = copy.deepcopy(qwen)
    for layer in gains:
        attn = ours.model.layers[layer].self_attn
        attn.q_norm, attn.k_norm = torch.nn.Identity(), torch.nn.Identity()
    apply_attention_spec(ours, AttentionSpec(qk_norm=True))
    for layer, (gq, gk) in gains.items():
        norm = ours.model.layers[layer].self_attn.study_qk_norm
        assert norm.query_gain.shape == (4,) and norm.key_gain.shape == (2,)  # grouped-query: 2 key heads
        with torch.no_grad():
            norm.query_gain.fill_(gq)
            norm.key_gain.fill_(gk)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, got = qwen(input_ids=ids).logits, ours(input_ids=ids).logits
    assert (got - expected).abs().max() <= 1e-5
    with torch.no_grad():  # the check can fail: other gains give other logits
        ours.model.layers[0].self_attn.study_qk_norm.query_gain.fill_(3.0)
        assert (ours(input_ids=ids).logits - expected).abs().max() > 1e-3


@pytest.mark.parametrize("model_type", ["qwen3", "olmo2"])
def test_a_model_that_already_normalises_q_and_k_is_refused(model_type):
    if model_type == "qwen3":
        model = _tiny_qwen3()
    else:
        from transformers import Olmo2Config, Olmo2ForCausalLM

        model = Olmo2ForCausalLM(Olmo2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, max_position_embeddings=64, pad_token_id=None))
    with pytest.raises(ValueError, match=r"qk_norm=True, but .* already normalises its queries and keys \(q_norm, k_norm\)"):
        apply_attention_spec(model, AttentionSpec(qk_norm=True))
    apply_attention_spec(model, AttentionSpec(temperature=0.5))  # without qk_norm the model is fine


def test_rms_normalize_jacobian_is_the_closed_form():
    """d(x / r)/dx = (I - x x^T / (D r^2)) / r with r^2 = mean(x^2) + eps, in fp64."""
    x = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.01  # eps matters here
    r2 = x.pow(2).mean() + EPS
    closed = (torch.eye(8, dtype=torch.float64) - torch.outer(x, x) / (8 * r2)) / r2.sqrt()
    jac = torch.autograd.functional.jacobian(rms_normalize, x)
    torch.testing.assert_close(jac, closed, atol=1e-12, rtol=1e-10)


def test_gain_gradient_of_a_logit_is_the_logit_over_the_gain():
    """l = g_q g_k q_hat.k_hat / sqrt(d): dl/dg_q = l / g_q and dl/dg_k = l / g_k (closed form, fp64 autograd)."""
    q, k, _ = _qkv(batch=1, heads=1, kv_heads=1, length=1)
    norm = _gains(QKNorm(1, 1).double())
    qn, kn = norm(q, k)
    logit = (qn * kn).sum() / math.sqrt(q.shape[-1])
    logit.backward()
    torch.testing.assert_close(norm.query_gain.grad, logit.detach().view(1) / norm.query_gain.detach())
    torch.testing.assert_close(norm.key_gain.grad, logit.detach().view(1) / norm.key_gain.detach())


@pytest.mark.parametrize("path", ["fused", "explicit"])
def test_gradients_match_finite_differences(path):
    """gradcheck in fp64 (central differences) through attend with QK-norm: q, k, v and both gains."""
    q, k, v = _qkv(batch=1, heads=2, kv_heads=1, length=4, dim=4)
    norm = QKNorm(2, 1).double()
    gq, gk = torch.tensor([1.3, 0.7], dtype=torch.float64), torch.tensor([1.1], dtype=torch.float64)
    del norm.query_gain, norm.key_gain  # plain tensors in their place, so gradcheck can perturb them

    def f(q, k, v, gq, gk):
        norm.query_gain, norm.key_gain = gq, gk
        return attend(q, k, v, AttentionSpec(temperature=0.5, qk_norm=True), qk_norm=norm)

    inputs = tuple(t.clone().requires_grad_() for t in (q, k, v, gq, gk))
    if path == "explicit":
        with tapping(_NullTap()):
            assert torch.autograd.gradcheck(f, inputs, fast_mode=True)
    else:
        assert torch.autograd.gradcheck(f, inputs, fast_mode=True)


@pytest.mark.parametrize("temperature", [2.0, 0.5])
def test_logits_are_bounded_by_gain_squared_sqrt_d_over_t_and_reach_it(temperature):
    """Two keys: k and the zero vector (normalised to zero, logit 0), so log(w_0 / w_1) is the logit of k.
    A query along k reaches the bound g_q g_k sqrt(d) / T; random queries and keys stay under it."""
    dim, gq, gk = 16, 1.5, 1.2
    norm = QKNorm(1, 1).double()
    with torch.no_grad():
        norm.query_gain.fill_(gq)
        norm.key_gain.fill_(gk)
    bound = gq * gk * math.sqrt(dim) / temperature
    assert norm.logit_bound(dim, temperature=temperature).item() == pytest.approx(bound)
    g = torch.Generator().manual_seed(0)
    direction = torch.randn(dim, generator=g, dtype=torch.float64) * 10
    queries = torch.cat([direction.view(1, dim), torch.randn(200, dim, generator=g, dtype=torch.float64) * 5])
    keys = torch.stack([direction, torch.zeros(dim, dtype=torch.float64)])
    values = torch.eye(2, dtype=torch.float64)  # the output row is the weight row
    spec = AttentionSpec(temperature=temperature, qk_norm=True)
    for tap in (None, _NullTap()):
        with tapping(tap) if tap else torch.no_grad():
            weights = attend(queries.view(1, 1, -1, dim), keys.view(1, 1, 2, dim), values.view(1, 1, 2, 2), spec,
                             causal=False, qk_norm=norm)[0, 0]
        logit = torch.log(weights[:, 0] / weights[:, 1])
        shrink = direction.pow(2).mean() / (direction.pow(2).mean() + EPS)  # eps keeps the norm just under sqrt(d)
        assert logit[0].item() == pytest.approx(bound * shrink.item(), rel=1e-9)
        assert logit.abs().max().item() <= bound * (1 + 1e-12)
        assert logit[1:].abs().max().item() < 0.99 * bound  # random pairs are not aligned


def test_gains_train_under_trainable_attention_and_are_saved(tmp_path):
    module = CausalLMModule(AttentionSpec(qk_norm=True, temperature=0.1), n_layer=2, n_head=4, n_embd=32,
                            n_positions=64, vocab_size=64, trainable="attention")
    names = {name for name, p in module.named_parameters() if p.requires_grad}
    assert {f"model.transformer.h.{i}.attn.study_qk_norm.{g}" for i in (0, 1) for g in ("query_gain", "key_gain")} <= names
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    module.loss({"input_ids": ids}).backward()
    gain = module.model.transformer.h[0].attn.study_qk_norm.query_gain
    assert gain.grad is not None and gain.grad.abs().min() > 0
    with torch.no_grad():
        gain.fill_(2.5)
    torch.save(module.state_dict(), tmp_path / "state.pt")
    fresh = CausalLMModule(AttentionSpec(qk_norm=True, temperature=0.1), n_layer=2, n_head=4, n_embd=32,
                           n_positions=64, vocab_size=64)
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert torch.equal(fresh.model.transformer.h[0].attn.study_qk_norm.query_gain, torch.full((4,), 2.5))


def test_spec_option_checked_and_in_the_hparams():
    with pytest.raises(ValueError, match="qk_norm must be True or False, got 'yes'"):
        AttentionSpec(qk_norm="yes")
    assert AttentionSpec(qk_norm=True).as_hparams()["qk_norm"] is True
    assert AttentionSpec(qk_norm=True) != AttentionSpec() and hash(AttentionSpec(qk_norm=True)) != hash(AttentionSpec())


def test_llama_and_gpt2_build_one_gain_per_query_and_key_head():
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    llama = apply_attention_spec(LlamaForCausalLM(tiny_llama_config()), AttentionSpec(qk_norm=True))
    gpt2 = apply_attention_spec(GPT2LMHeadModel(tiny_gpt2_config()), AttentionSpec(qk_norm=True, layers=[1]))
    assert llama.model.layers[0].self_attn.study_qk_norm.key_gain.shape == (2,)
    assert not hasattr(gpt2.transformer.h[0].attn, "study_qk_norm")  # layer 0 keeps stock attention
    assert gpt2.transformer.h[1].attn.study_qk_norm.query_gain.shape == (4,)
