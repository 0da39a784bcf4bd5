"""Training from scratch: the init-scale control (T folded into W_q and W_k at T = 1 in the softmax), Wortsman et
al.'s independent weight decay and AdamW epsilon, and the z-loss."""

import copy
from types import SimpleNamespace

import pytest
import torch

from study.attention import AttentionSpec, apply_attention_spec
from study.model import CausalLMModule, fold_temperature_into_init, lm_loss_and_z_loss
from tests.conftest import tiny_llama_config

SIZE = dict(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=64)


def _built(seed=0, **kwargs) -> CausalLMModule:
    torch.manual_seed(seed)
    return CausalLMModule(**SIZE, **kwargs).eval()


def _logits(module, ids):
    with torch.no_grad():
        return module(ids).logits


@pytest.fixture
def ids():
    return torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("temperature", [0.1, 3.0])
def test_init_scale_control_is_the_same_function_at_step_zero(ids, temperature):
    softmax = _built(attention=AttentionSpec(temperature=temperature))
    folded = _built(attention=AttentionSpec(temperature=temperature), temperature_in="init")
    assert folded.model.transformer.h[0].attn.study_spec.temperature == 1.0  # T = 1 in the softmax
    assert folded.hparam_summary()["attention/temperature"] == temperature  # the HParams still say T
    assert folded.hparam_summary()["temperature_in"] == "init"
    residual = (_logits(folded, ids) - _logits(softmax, ids)).abs().max()
    assert residual <= 2e-5
    # ... and not trivially: the weights differ, and T matters for this model
    w = softmax.model.transformer.h[0].attn.c_attn.weight
    w_folded = folded.model.transformer.h[0].attn.c_attn.weight
    torch.testing.assert_close(w_folded[:, :64], w[:, :64] * temperature**-0.5)
    assert torch.equal(w_folded[:, 64:], w[:, 64:])  # W_v untouched
    assert (_logits(_built(), ids) - _logits(softmax, ids)).abs().max() > 10 * residual


def test_fold_on_separate_q_and_k_projections_matches_the_temperature(ids):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    stock = LlamaForCausalLM(tiny_llama_config()).eval()
    with torch.no_grad():  # random Llama weights are tiny (std 0.02): make attention non-uniform
        for layer in stock.model.layers:
            layer.self_attn.q_proj.weight.mul_(20)
            layer.self_attn.k_proj.weight.mul_(20)
    folded = apply_attention_spec(copy.deepcopy(stock), AttentionSpec())
    apply_attention_spec(stock, AttentionSpec(temperature=0.2))
    fold_temperature_into_init(folded, 0.2)
    with torch.no_grad():
        expected, got = stock(input_ids=ids).logits, folded(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    assert (got - apply_attention_spec(stock, AttentionSpec())(input_ids=ids).logits).abs().max() > 1e-3


def test_init_scale_control_refuses_what_it_cannot_mean():
    with pytest.raises(ValueError, match="temperature_in='init' with qk_norm=True"):
        CausalLMModule(AttentionSpec(qk_norm=True, temperature=0.1), temperature_in="init", **SIZE)
    with pytest.raises(ValueError, match="'gpt2' is loaded, not initialised"):
        CausalLMModule(model_name_or_path="gpt2", temperature_in="init", **SIZE)
    with pytest.raises(ValueError, match="temperature_in = 'weights': choose one of"):
        CausalLMModule(temperature_in="weights", **SIZE)
    with pytest.raises(ValueError, match="z_loss = -1: must be a finite number >= 0"):
        CausalLMModule(z_loss=-1, **SIZE)


def _one_decay_step(learning_rate: float, independent: bool) -> float:
    """The factor a weight is multiplied by in one AdamW step with a zero gradient (Adam's own step is then 0)."""
    module = _built(learning_rate=learning_rate, weight_decay=0.1, independent_weight_decay=independent,
                    warmup_steps=0, min_lr_ratio=0.1)
    module.trainer = SimpleNamespace(estimated_stepping_batches=10)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert optimizer.defaults["eps"] == 1e-8 and optimizer.defaults["betas"] == (0.9, 0.95)
    weight = module.model.transformer.h[0].attn.c_attn.weight
    before = weight.detach().clone()
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(learning_rate)  # step 0 of the cosine: the peak
    return (weight.detach() / before).mean().item()


def test_independent_weight_decay_does_not_scale_with_the_learning_rate():
    # PyTorch's AdamW: 1 - lr * wd, so a 10x larger lr decays 10x more
    assert _one_decay_step(0.01, independent=False) == pytest.approx(1 - 0.01 * 0.1, abs=1e-6)
    assert _one_decay_step(0.1, independent=False) == pytest.approx(1 - 0.1 * 0.1, abs=1e-6)
    # Wortsman et al.'s independent decay: 1 - s_t * wd at every peak lr (s_0 = 1 here)
    assert _one_decay_step(0.01, independent=True) == pytest.approx(1 - 0.1, abs=1e-6)
    assert _one_decay_step(0.1, independent=True) == pytest.approx(1 - 0.1, abs=1e-6)


def z_loss_term(logits, attention_mask=None):
    """The reference: mean(log Z)^2 by logsumexp over the positions that predict a next token."""
    log_z = logits[:, :-1].double().logsumexp(dim=-1)
    keep = torch.ones_like(log_z) if attention_mask is None else attention_mask[:, 1:].double()
    return (log_z.pow(2) * keep).sum() / keep.sum()


def test_z_loss_by_hand_and_added_to_the_training_loss_only(ids):
    logits = torch.tensor([[[0.0, 0.0], [1.0, 2.0], [5.0, 5.0]]])  # log Z: log 2, log(e + e^2), 5 + log 2
    log_z = torch.tensor([torch.log(torch.tensor(2.0)), torch.log(torch.exp(torch.tensor(1.0)) + torch.exp(torch.tensor(2.0)))])
    targets = torch.tensor([[0, 1, 0]])
    loss, z = lm_loss_and_z_loss(logits, targets)
    assert z.item() == pytest.approx(log_z.pow(2).mean().item(), rel=1e-6)  # the last position predicts nothing
    assert loss.item() == pytest.approx(((log_z[0] - 0.0) + (log_z[1] - 1.0)).item() / 2, rel=1e-6)  # -log p(target)
    _, masked = lm_loss_and_z_loss(logits, targets, torch.tensor([[1, 1, 0]]))
    assert masked.item() == pytest.approx(log_z[0].pow(2).item(), rel=1e-6)
    module = _built(z_loss=1e-2)
    module.log = module.log_dict = lambda *a, **k: None
    batch = {"input_ids": ids}
    plain = module.loss(batch)
    total = module.training_step(batch, 0)
    expected = plain + 1e-2 * z_loss_term(module(ids).logits)
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)
    assert total.item() > plain.item()


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_one_log_softmax_gives_hugging_faces_loss_and_the_logsumexp_z_loss_with_their_gradients(scale):
    # logits of 1e3 and more are where a diverging run goes: log Z read back at the row's largest logit keeps
    # its precision there (a read at an arbitrary key would lose it)
    from transformers.loss.loss_utils import ForCausalLMLoss

    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 50, generator=gen) * scale).requires_grad_()
    ids = torch.randint(0, 50, (3, 7), generator=gen)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    loss, z = lm_loss_and_z_loss(logits, ids, mask)
    stock = ForCausalLMLoss(logits, ids, vocab_size=50)
    reference_z = z_loss_term(logits, mask)
    assert loss.item() == pytest.approx(stock.item(), rel=1e-6)
    assert z.item() == pytest.approx(reference_z.item(), rel=1e-6)
    got = torch.autograd.grad(loss + 1e-2 * z, logits)[0]
    want = torch.autograd.grad(stock + 1e-2 * reference_z.float(), logits)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
