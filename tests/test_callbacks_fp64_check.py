"""Fp64GradientCheck: the step-0 W_q/W_k gradient of the first batch in fp32 over fp64, logged once at step 0."""

import math

import pytest
import torch

from study import tags
from study.callbacks import Fp64GradientCheck
from study.callbacks.fp64_check import _qk_norms, ratios
from tests.callback_helpers import make_trainer, scalars, token_loader
from tests.test_callbacks_baseline import module


def test_ratio_is_one_at_t1_and_logged_once_at_step0(tmp_path):
    make_trainer(tmp_path, [Fp64GradientCheck()], max_steps=3).fit(module(temperature=1.0), token_loader(n=6, vocab=64))
    logged = scalars(tmp_path)
    for tag in (tags.FP64_RATIO_QK, tags.FP64_RATIO_LAST_QK, tags.FP64_RATIO_LAYERS_WORST):
        assert [s for s, _ in logged[tag]] == [0]
        assert logged[tag][0][1] == pytest.approx(1.0, abs=1e-4)


def test_norms_are_the_models_own_gradient_in_fp64():
    """The fp64 norm equals an fp64 backward of the untouched model; the model itself keeps no gradient."""
    lit = module(temperature=1.0)
    batch = {"input_ids": torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))}
    whole, last = _qk_norms(lit.model, batch, torch.float64)
    assert all(p.grad is None for p in lit.model.parameters()) and lit.model.dtype == torch.float32
    ref = lit.model.double().eval()
    ref(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss.backward()
    width = ref.config.n_embd  # fused qkv: weight columns and bias entries q | k | v
    qk = [float(m.attn.c_attn.weight.grad[:, : 2 * width].pow(2).sum() + m.attn.c_attn.bias.grad[: 2 * width].pow(2).sum())
          for m in ref.transformer.h]
    assert whole == pytest.approx(math.sqrt(sum(qk)), rel=1e-9)
    assert last == pytest.approx(math.sqrt(qk[-1]), rel=1e-9)


def test_seeded_check_runs_only_in_that_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "1")
    make_trainer(tmp_path, [Fp64GradientCheck(seed=0)], max_steps=1).fit(module(), token_loader(n=2, vocab=64))
    assert tags.FP64_RATIO_QK not in scalars(tmp_path)
    with pytest.raises(ValueError, match="got '0'"):
        Fp64GradientCheck(seed="0")


def test_the_model_is_converted_in_place_and_back_exactly_and_the_taps_see_nothing():
    """The fp64 pass converts the training model itself (no float64 copy beside it): afterwards every weight is
    bit-identical, the training mode is restored, and an open tap saw none of the check's attention calls."""
    from study.attention.tap import tapping

    lit = module(temperature=0.1)
    lit.model.train()
    before = {name: p.detach().clone() for name, p in lit.model.named_parameters()}
    batch = {"input_ids": torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))}

    class Counter:
        calls = 0

        def observe(self, *args, **kwargs):
            Counter.calls += 1

    with tapping(Counter()):
        _qk_norms(lit.model, batch, torch.float64)
    assert Counter.calls == 0
    assert lit.model.training and lit.model.dtype == torch.float32
    assert all(torch.equal(p, before[name]) and p.dtype == torch.float32 for name, p in lit.model.named_parameters())


def test_the_worst_layer_ratio_is_the_one_furthest_from_one_over_every_layer_and_group():
    """One layer's W_v off by 1/0.8 outweighs another's W_q/W_k off by 1.1 (in log: 0.22 against 0.10); W_q and W_k
    combine as one norm per layer; a zero fp64 norm (a non-finite ratio) is the furthest of all."""
    fp64 = {"attn_q": 3.0, "attn_k": 4.0, "block_0/attn_q": 3.0, "block_0/attn_k": 4.0, "block_0/attn_v": 1.0,
            "block_1/attn_q": 0.0, "block_1/attn_k": 0.0, "block_1/attn_v": 2.0, "block_1/attn_out": 1.0}
    fp32 = {**fp64, "block_0/attn_q": 3.3, "block_0/attn_k": 4.4, "block_1/attn_v": 2.5}
    got = ratios(fp32, {**fp64, "block_1/attn_q": 1.0})
    assert got[tags.FP64_RATIO_QK] == pytest.approx(1.0)
    assert got[tags.FP64_RATIO_LAST_QK] == pytest.approx(0.0)  # layer 1: fp32 0 over fp64 1
    assert got[tags.FP64_RATIO_LAYERS_WORST] == pytest.approx(0.0)
    fp64_ok = {**fp64, "block_1/attn_q": 1.0}
    fp32_ok = {**fp32, "block_1/attn_q": 1.0}
    assert ratios(fp32_ok, fp64_ok)[tags.FP64_RATIO_LAYERS_WORST] == pytest.approx(2.5 / 2.0)
    assert math.isnan(ratios(fp32, fp64)[tags.FP64_RATIO_LAST_QK])  # fp64 norm 0: no ratio
    assert math.isnan(ratios(fp32, fp64)[tags.FP64_RATIO_LAYERS_WORST])  # and it is the worst


def test_the_logged_fp64_norms_are_each_blocks_float64_gradient(tmp_path):
    """Each block's fp64 W_q, W_k and W_v norms, logged once at step 0, equal a float64 backward of the model on the
    first batch (GPT-2's fused c_attn split into q | k | v columns), to the float32 an event file stores a scalar in."""
    lit = module(temperature=0.1)
    start = {name: p.detach().clone() for name, p in lit.model.named_parameters()}
    loader = token_loader(n=2, vocab=64)
    make_trainer(tmp_path, [Fp64GradientCheck()], max_steps=1).fit(lit, loader)
    logged = scalars(tmp_path)
    ref = module(temperature=0.1)
    ref.model.load_state_dict(start, strict=False)  # lm_head is tied to the embedding
    ref = ref.model.double().eval()
    ids = next(iter(loader))["input_ids"]
    ref(input_ids=ids, labels=ids).loss.backward()
    width = ref.config.n_embd
    for i, block in enumerate(ref.transformer.h):
        w, b = block.attn.c_attn.weight.grad, block.attn.c_attn.bias.grad
        for j, kind in enumerate(("attn_q", "attn_k", "attn_v")):
            cols = slice(j * width, (j + 1) * width)
            expected = math.sqrt(float(w[:, cols].pow(2).sum() + b[cols].pow(2).sum()))
            tag = tags.fp64_grad_norm(f"block_{i}/{kind}")
            assert [s for s, _ in logged[tag]] == [0]
            assert logged[tag][0][1] == pytest.approx(expected, rel=2e-7)


def test_the_fp64_norms_do_not_depend_on_the_thread_count_where_fp32_ones_may():
    """At T = 0.01 the float64 step-0 norms agree between one and two threads far inside the 7 digits an event file
    keeps: the report's gradient rows, fitted on them, cannot be tipped by the thread count (as fp32's can)."""
    from study.callbacks.fp64_check import _grad_norms

    lit = module(temperature=0.01)
    batch = {"input_ids": torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(2))}
    threads = torch.get_num_threads()
    try:
        norms = []
        for n in (1, 2):
            torch.set_num_threads(n)
            norms.append(_grad_norms(lit.model, batch, torch.float64))
    finally:
        torch.set_num_threads(threads)
    keys = [k for k in norms[0] if k.startswith("block_")]
    assert keys and all(norms[0][k] == pytest.approx(norms[1][k], rel=1e-10) for k in keys)
