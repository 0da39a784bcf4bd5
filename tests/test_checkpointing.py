"""Activation checkpointing (`CausalLMModule(gradient_checkpointing=True)`): the same losses, gradients and logged
monitor values as without it, on every attention path, and each attention call handed to the taps once per step
although the backward pass recomputes it."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch

from study.attention import AttentionSpec, blockwise_settings, tapping
from study.model import CausalLMModule
from tests.conftest import tiny_llama_config

SPECS = {
    "stock": AttentionSpec(),  # the fused SDPA path when no tap is open
    "temperature": AttentionSpec(temperature=0.5),
    "top-k": AttentionSpec(top_k=3),
    "sparsemax": AttentionSpec(normalizer="sparsemax"),
}


class CountingTap:
    """Every (layer, query rows) the taps are handed, in order; `row_blocks` lets the blockwise path hand it blocks."""

    row_blocks = True

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def observe(self, layer, weights, allowed, spec) -> None:
        self.calls.append((layer, weights.shape[-2]))


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(copy.deepcopy(tiny_llama_config())).save_pretrained(folder)
    return str(folder)


def module_for(arch: str, spec: AttentionSpec, checkpointing: bool, llama_folder: str) -> CausalLMModule:
    torch.manual_seed(0)
    if arch == "gpt2":
        module = CausalLMModule(spec, n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=64,
                                hparams_experiment=False, gradient_checkpointing=checkpointing)  # fmt: skip
    else:
        module = CausalLMModule(spec, model_name_or_path=llama_folder, vocab_size=64, hparams_experiment=False,
                                gradient_checkpointing=checkpointing)  # fmt: skip
    return module.train()


def step(module: CausalLMModule, ids: torch.Tensor, tap: CountingTap | None, blockwise: bool):
    """The forward under the tap and the blockwise settings; the backward (the recomputation) outside both: it
    must take the forward's path all the same."""
    module.zero_grad(set_to_none=True)
    with tapping(tap) if tap else nullcontext(), blockwise_settings(min_scores=0, block_scores=256) if blockwise else nullcontext():
        loss = module.loss({"input_ids": ids})
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


# top-k on both tapped paths runs in `make test`; every other spec and path is slow (`make test-all`)
CASES = [pytest.param(arch, spec, path, marks=() if spec == "top-k" and path != "no tap" else pytest.mark.slow)
         for arch in ("gpt2", "llama") for spec in SPECS for path in ("no tap", "dense", "blockwise")]  # fmt: skip


@pytest.mark.parametrize(("arch", "spec_name", "path"), CASES)
def test_checkpointing_keeps_losses_gradients_and_one_tap_call_per_attention_call(arch, spec_name, path, llama_folder):
    ids = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1))
    results = {}
    for checkpointing in (False, True):
        module = module_for(arch, SPECS[spec_name], checkpointing, llama_folder)
        assert module.model.is_activation_checkpointing is checkpointing
        tap = None if path == "no tap" else CountingTap()
        results[checkpointing] = (*step(module, ids, tap, path == "blockwise"), tap and tap.calls)
    (loss, grads, calls), (loss_ckpt, grads_ckpt, calls_ckpt) = results[False], results[True]
    assert loss_ckpt == loss
    assert grads_ckpt.keys() == grads.keys() and len(grads) > 10
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    if path != "no tap":
        # each layer's call once, whole (dense) or in its blocks of rows (blockwise), though recomputed in backward
        assert calls_ckpt == calls
        assert sorted({layer for layer, _ in calls}) == [0, 1]
        assert sum(rows for _, rows in calls) == 2 * 16
        assert (len(calls) > 2) is (path == "blockwise")


@pytest.mark.slow
def test_monitors_log_the_same_values_with_and_without_checkpointing(tmp_path, llama_folder):
    """Two training steps under the attention monitors, logging every step: every logged scalar is the same."""
    from study.callbacks import AttentionEntropyMonitor, GradientNormMonitor, SelectionUniformityMonitor
    from tests.callback_helpers import make_trainer, scalars, token_loader

    logged = {}
    for checkpointing in (False, True):
        module = module_for("llama", AttentionSpec(temperature=0.5, top_k=4), checkpointing, llama_folder)
        monitors = [AttentionEntropyMonitor(every_n_steps=1, validation=False),
                    SelectionUniformityMonitor(every_n_steps=1, validation=False), GradientNormMonitor(every_n_steps=1)]  # fmt: skip
        root = tmp_path / str(checkpointing)
        make_trainer(root, monitors, max_steps=2, limit_val_batches=0).fit(module, token_loader(n=4))
        logged[checkpointing] = {tag: values for tag, values in scalars(root).items() if not tag.startswith("hparams")}
    assert logged[True].keys() == logged[False].keys()
    assert any("entropy" in tag for tag in logged[False]) and any("grad" in tag for tag in logged[False])
    for tag, values in logged[False].items():
        assert [s for s, _ in logged[True][tag]] == [s for s, _ in values], tag
        assert [v for _, v in logged[True][tag]] == pytest.approx([v for _, v in values], rel=1e-5, abs=1e-8), tag


def test_a_model_without_checkpointing_support_is_named(monkeypatch):
    from study.model import enable_gradient_checkpointing

    model = CausalLMModule(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=32, hparams_experiment=False).model
    monkeypatch.setattr(type(model), "supports_gradient_checkpointing", False)
    with pytest.raises(ValueError, match="GPT2LMHeadModel does not support"):
        enable_gradient_checkpointing(model)
