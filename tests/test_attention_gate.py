"""The output gate (`AttentionSpec(output_gate=True)`, Qiu et al.'s G1): off is stock exactly, on equals a brute-force
gated attention written out by hand (with T and top-k), its gradients against finite differences, its parameters
trained under `trainable: attention`, its init, and its refusal on pretrained models (module and sweep)."""

import math
import pickle

import pytest
import torch

from study.attention import NORMALIZERS, AttentionSpec, apply_attention_spec, attend, tapping
from study.attention.gate import OutputGate
from study.attention.hf import stock_copy
from study.model import CausalLMModule
from study.sweep.config import SweepConfigError, build_plan
from tests.conftest import tiny_gpt2_config, tiny_llama_config
from tests.test_sweep import write_spec

SIZE = dict(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=64)


class _NullTap:
    def observe(self, *args, **kwargs) -> None:
        return None


def _gpt2(seed=0):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(tiny_gpt2_config(attn_implementation="eager")).eval()


def _ids(seed=0, length=16):
    return torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(seed))


def test_off_is_stock_exactly_and_switching_back_removes_the_gate(tiny_causal_lm):
    ids = _ids()
    stock = stock_copy(tiny_causal_lm, "sdpa")
    with torch.no_grad():
        expected = stock(input_ids=ids).logits
        off = apply_attention_spec(tiny_causal_lm, AttentionSpec(output_gate=False))(input_ids=ids).logits
        gated = apply_attention_spec(tiny_causal_lm, AttentionSpec(output_gate=True))(input_ids=ids).logits
        back = apply_attention_spec(tiny_causal_lm, AttentionSpec())(input_ids=ids).logits
    assert torch.equal(off, expected) and torch.equal(back, expected)
    assert (gated - expected).abs().max() > 1e-3  # the check can fail: the gate changes the output
    assert not any("study_output_gate" in name for name, _ in tiny_causal_lm.named_parameters())
    assert all(not m._forward_pre_hooks for m in tiny_causal_lm.modules())  # the input hook went with it


def test_a_module_built_without_the_gate_is_the_stock_model_bit_for_bit():
    """From scratch, ``output_gate=False`` draws nothing extra: the same weights, the same logits as before."""
    torch.manual_seed(0)
    plain = CausalLMModule(AttentionSpec(), **SIZE)
    torch.manual_seed(0)
    off = CausalLMModule(AttentionSpec(output_gate=False), **SIZE)
    assert plain.model.state_dict().keys() == off.model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(plain.model.state_dict().values(), off.model.state_dict().values()))
    torch.manual_seed(0)
    gated = CausalLMModule(AttentionSpec(output_gate=True), **SIZE)
    own = {k: v for k, v in gated.model.state_dict().items() if "study_output_gate" not in k}
    # the gate is drawn after the model: every stock weight is the ungated model's
    assert own.keys() == plain.model.state_dict().keys()
    assert all(torch.equal(own[k], v) for k, v in plain.model.state_dict().items())


def _brute_force_layer(attn, x: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """GPT-2's attention layer with the G1 gate, written out in fp64 from its weights: q, k, v from c_attn; causal
    scores q.k / (sqrt(d) T); the k largest per row (ties: lowest position), softmax; the gate sigmoid(x W + b) per
    head and element; the gated heads joined and projected by c_proj."""
    batch, length, width = x.shape
    heads = attn.num_heads
    dim = width // heads
    qkv = x @ attn.c_attn.weight + attn.c_attn.bias  # Conv1D: x W + b
    q, k, v = (t.reshape(batch, length, heads, dim).transpose(1, 2) for t in qkv.split(width, dim=-1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(dim) / temperature
    weights = torch.zeros_like(scores)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                row = scores[b, h, i, : i + 1]
                keep = sorted(range(i + 1), key=lambda j: (-row[j].item(), j))[: top_k or i + 1]
                picked = torch.softmax(row[keep], dim=-1)
                weights[b, h, i, keep] = picked
    y = weights @ v  # (B, H, L, D)
    gate = attn.study_output_gate.linear
    g = torch.sigmoid(x @ gate.weight.T + gate.bias).reshape(batch, length, heads, dim).transpose(1, 2)
    joined = (y * g).transpose(1, 2).reshape(batch, length, width)
    return joined @ attn.c_proj.weight + attn.c_proj.bias


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, None), (0.3, None), (0.5, 3), (2.0, 1)])
def test_on_at_init_equals_the_brute_force_gated_attention(temperature, top_k):
    model = apply_attention_spec(_gpt2().double(), AttentionSpec(temperature=temperature, top_k=top_k,
                                                                 output_gate=True))
    attn = model.transformer.h[1].attn
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    with torch.no_grad():
        got = attn(x)[0]
        expected = _brute_force_layer(attn, x, temperature, top_k)
        ungated = apply_attention_spec(model, AttentionSpec(temperature=temperature, top_k=top_k)).transformer.h[1].attn(x)[0]
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
    assert (ungated - expected).abs().max() > 1e-3  # the reference's gate matters


@pytest.mark.parametrize("normalizer", sorted(NORMALIZERS))
def test_every_normaliser_is_gated_elementwise_per_head(normalizer):
    """For any normaliser, T and top-k: the gated output of ``attend`` is the ungated one times sigmoid(X W)
    reshaped per head, on the dense and the fused-or-explicit path alike."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(2, 7, 24, generator=g, dtype=torch.float64)
    gate = OutputGate(24, 4, 8).double()
    torch.nn.init.normal_(gate.linear.weight, std=0.5, generator=g)
    torch.nn.init.normal_(gate.linear.bias, std=0.5, generator=g)
    temperature = 1.0 if normalizer == "uniform" else 0.4
    spec = AttentionSpec(normalizer=normalizer, temperature=temperature, top_k=3)
    gated_spec = AttentionSpec(normalizer=normalizer, temperature=temperature, top_k=3, output_gate=True)
    by_hand = torch.sigmoid(x @ gate.linear.weight.T + gate.linear.bias).view(2, 7, 4, 8).transpose(1, 2)
    with torch.no_grad():
        plain = attend(q, k, v, spec)
        gated = attend(q, k, v, gated_spec, output_gate=gate, gate_input=x)
    torch.testing.assert_close(gated, plain * by_hand, atol=1e-12, rtol=0)
    assert (gated - plain).abs().max() > 1e-2


@pytest.mark.parametrize("path", ["fused", "explicit", "top-k"])
def test_gradients_match_finite_differences(path):
    """gradcheck in fp64 through attend with the gate: q, k, v, the layer's input and the gate's W and b."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(1, 4, 5, generator=g, dtype=torch.float64)
    w, b = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    gate = OutputGate(5, 2, 3).double()
    del gate.linear.weight, gate.linear.bias  # plain tensors in their place, so gradcheck can perturb them
    spec = AttentionSpec(temperature=0.5, top_k=2 if path == "top-k" else None, output_gate=True)

    def f(q, k, v, x, w, b):
        gate.linear.weight, gate.linear.bias = w, b
        return attend(q, k, v, spec, output_gate=gate, gate_input=x)

    inputs = tuple(t.clone().requires_grad_() for t in (q, k, v, x, w, b))
    if path == "fused":
        assert torch.autograd.gradcheck(f, inputs, fast_mode=True)
    else:
        with tapping(_NullTap()):
            assert torch.autograd.gradcheck(f, inputs, fast_mode=True)


def test_the_gates_parameters_train_under_trainable_attention_and_reach_the_optimiser(tmp_path):
    module = CausalLMModule(AttentionSpec(output_gate=True, temperature=0.1, top_k=4), trainable="attention", **SIZE)
    gates = {f"model.transformer.h.{i}.attn.study_output_gate.linear.{p}" for i in (0, 1) for p in ("weight", "bias")}
    trained = {name for name, p in module.named_parameters() if p.requires_grad}
    assert gates <= trained and not any("mlp" in name or "wte" in name for name in trained)
    module.trainer = type("Trainer", (), {"estimated_stepping_batches": 10})()  # what configure_optimizers reads
    optimizer = module.configure_optimizers()["optimizer"]
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    named = dict(module.named_parameters())
    assert all(id(named[name]) in in_optimizer for name in gates)
    module.loss({"input_ids": _ids()}).backward()
    weight = named["model.transformer.h.0.attn.study_output_gate.linear.weight"]
    assert weight.grad is not None and weight.grad.abs().max() > 0
    before = weight.detach().clone()
    optimizer.step()
    assert not torch.equal(weight.detach(), before)
    torch.save(module.state_dict(), tmp_path / "state.pt")  # saved with the model, and loaded back
    fresh = CausalLMModule(AttentionSpec(output_gate=True, temperature=0.1, top_k=4), **SIZE)
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert torch.equal(fresh.model.transformer.h[0].attn.study_output_gate.linear.weight, weight.detach())


def test_the_gradient_monitors_do_not_count_the_gate_as_an_attention_projection():
    """W_q, W_k, W_v and W_o gradient norms are the study's rows; the gate's W is none of them."""
    from transformers import LlamaForCausalLM

    from study.metrics.gradients import parameter_kind

    for model in (_gpt2(), LlamaForCausalLM(tiny_llama_config())):
        apply_attention_spec(model, AttentionSpec(output_gate=True))
        kinds = {parameter_kind(name) for name, _ in model.named_parameters() if "study_output_gate" in name}
        assert kinds == {"other"}


def test_gradient_checkpointing_gives_the_same_loss_and_gate_gradients():
    """The layer's input reaches the gate through a pre-hook; the recomputed forward must find it again."""
    losses, grads = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        module = CausalLMModule(AttentionSpec(output_gate=True, temperature=0.3), gradient_checkpointing=checkpointing,
                                **SIZE)
        module.train()
        loss = module.loss({"input_ids": _ids()})
        loss.backward()
        losses.append(loss.detach())
        grads.append(module.model.transformer.h[0].attn.study_output_gate.linear.weight.grad.clone())
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


def test_the_gate_is_initialised_as_the_models_own_linear_layers():
    """Qiu et al.'s gate is extra columns of the query projection: the model's linear init (normal, std
    initializer_range; bias zero), with a bias exactly when the attention projections have one."""
    gpt2 = apply_attention_spec(_gpt2(), AttentionSpec(output_gate=True))
    proj = gpt2.transformer.h[0].attn.study_output_gate.linear
    assert proj.weight.shape == (32, 32) and torch.equal(proj.bias, torch.zeros(32))
    assert proj.weight.std().item() == pytest.approx(gpt2.config.initializer_range, rel=0.1)
    assert abs(proj.weight.mean().item()) < 0.005
    from transformers import LlamaForCausalLM

    llama = apply_attention_spec(LlamaForCausalLM(tiny_llama_config(initializer_range=0.05)),
                                 AttentionSpec(output_gate=True, layers=[1]))
    assert not hasattr(llama.model.layers[0].self_attn, "study_output_gate")  # layer 0 keeps stock attention
    proj = llama.model.layers[1].self_attn.study_output_gate.linear
    assert proj.bias is None and proj.weight.shape == (32, 32)  # Llama's projections have no bias
    assert proj.weight.std().item() == pytest.approx(0.05, rel=0.1)


def test_refused_on_a_pretrained_model_before_it_is_loaded():
    with pytest.raises(ValueError, match=r"^output_gate=True adds a new gate .* the pretrained 'no/such-model' .* "
                                         r"built from scratch \(model_name_or_path null\)$"):
        CausalLMModule(AttentionSpec(output_gate=True), model_name_or_path="no/such-model")


def test_the_sweep_refuses_it_on_a_pretrained_model_and_in_the_pretraining_run(tmp_path):
    spec = write_spec(tmp_path, {"temperature": [0.1]}, {"model.model_name_or_path": "smollm2-135m"},
                      arms=[{"output_gate": [True]}])
    with pytest.raises(SweepConfigError, match=r"run T0.1_kall_softmax_s0_gate: model.attention.output_gate true on "
                                               r"the pretrained model 'smollm2-135m'"):
        build_plan(spec)
    pretrain = {"overrides": {"model.attention.output_gate": True}}
    with pytest.raises(SweepConfigError, match="the pretraining run: model.attention.output_gate true"):
        build_plan(write_spec(tmp_path, {"temperature": [0.1]}, pretrain=pretrain))


def test_the_sweep_accepts_a_gated_arm_from_scratch(tmp_path):
    plan = build_plan(write_spec(tmp_path, {"temperature": [0.1, 1]}, arms=[{"output_gate": [True]}]))
    assert [r.name for r in plan.runs] == ["T0.1_kall_softmax_s0", "T1_kall_softmax_s0",
                                           "T0.1_kall_softmax_s0_gate", "T1_kall_softmax_s0_gate"]
    assert [r.resolved["model"]["attention"].get("output_gate", False) for r in plan.runs] == [False, False, True, True]
    assert "--model.attention.output_gate=true" in [a.lower() for a in plan.runs[2].args]


def test_attend_needs_the_gate_and_its_input():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="output_gate=True needs the layer's gate and its input; gate_input not given"):
        attend(q, q, q, AttentionSpec(output_gate=True), output_gate=OutputGate(8, 2, 4))
    with pytest.raises(ValueError, match=r"the output gate of 2 heads x 4 gives \(1, 2, 3, 4\), but the attention "
                                         r"output is \(1, 2, 3, 5\)"):
        attend(q, q, torch.randn(1, 2, 3, 5), AttentionSpec(output_gate=True), output_gate=OutputGate(8, 2, 4),
               gate_input=torch.randn(1, 3, 8))
    plain = attend(q, q, q, AttentionSpec())  # off: a gate passed is not used
    assert torch.equal(attend(q, q, q, AttentionSpec(), output_gate=OutputGate(8, 2, 4)), plain)


def test_spec_option_checked_hashed_in_the_hparams_and_old_pickles_load():
    with pytest.raises(ValueError, match="output_gate must be True or False, got 1"):
        AttentionSpec(output_gate=1)
    assert AttentionSpec(output_gate=True).as_hparams()["output_gate"] is True
    assert AttentionSpec(output_gate=True) != AttentionSpec()
    assert hash(AttentionSpec(output_gate=True)) != hash(AttentionSpec())
    old = AttentionSpec(temperature=0.5)
    state = dict(old.__dict__)
    del state["output_gate"]  # a spec pickled before the field existed
    restored = AttentionSpec.__new__(AttentionSpec)
    restored.__setstate__(state)
    assert restored == old and restored.output_gate is False
    assert pickle.loads(pickle.dumps(AttentionSpec(output_gate=True))).output_gate is True


@pytest.mark.slow  # builds the data module twice: a few seconds
def test_study_fit_takes_it_from_a_yaml_config_and_refuses_it_with_a_pretrained_model(text_files, tmp_path):
    from study.attention import attention_modules
    from study.fit import lightning_main
    from tests.test_cli import fit_args

    config = tmp_path / "gated.yaml"
    config.write_text("model:\n  attention:\n    output_gate: true\n    temperature: 0.1\n")
    cli = lightning_main(fit_args(text_files, tmp_path, "--config", str(config))[1:], run=False)
    modules = attention_modules(cli.model.model)
    assert len(modules) == 2 and all(isinstance(m.study_output_gate, OutputGate) for m in modules)
    with pytest.raises((SystemExit, ValueError)) as info:
        lightning_main(fit_args(text_files, tmp_path, "--config", str(config), "--model.model_name_or_path=gpt2")[1:],
                       run=False)
    assert "output_gate=True adds a new gate to every attention layer" in str(info.value)
    assert not (tmp_path / "logs").exists()  # nothing trained, nothing logged
