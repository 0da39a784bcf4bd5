"""Shared fixtures: tiny models built from configs (no hub), small local text corpora."""

from __future__ import annotations

import copy
import os

import pytest
import torch

# Tests never reach the hub: the offline paths are what CI can run.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One thread per pytest-xdist worker (`make test` runs one worker per core), two in a single process.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


def tiny_gpt2_config(**overrides):
    from transformers import GPT2Config

    base = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64, bos_token_id=63, eos_token_id=63)
    base.update(overrides)
    return GPT2Config(**base)


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: 2 query heads per key/value head
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
    )
    base.update(overrides)
    return LlamaConfig(**base)


@pytest.fixture(params=["gpt2", "llama"])
def tiny_causal_lm(request):
    """A fresh tiny causal LM (eval mode) of each architecture; configs are copied, never shared."""
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    torch.manual_seed(0)
    if request.param == "gpt2":
        model = GPT2LMHeadModel(copy.deepcopy(tiny_gpt2_config(attn_implementation="eager")))
    else:
        model = LlamaForCausalLM(copy.deepcopy(tiny_llama_config(attn_implementation="eager")))
    return model.eval()


@pytest.fixture
def text_files(tmp_path):
    """Two small plain-text files (train, validation) of a few thousand words."""
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
    gen = torch.Generator().manual_seed(0)
    paths = []
    for name, n_lines in (("train.txt", 400), ("val.txt", 80)):
        lines = [" ".join(words[i] for i in torch.randint(len(words), (12,), generator=gen)) for _ in range(n_lines)]
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


# `make test` must stay fast: a test that takes seconds belongs behind `@pytest.mark.slow` (run by `make test-all`).
# Name the unmarked ones that took longer than this, so that the next slow test is marked when it lands.
UNMARKED_SLOW_SECONDS = 5.0
_unmarked_slow: list[tuple[str, float]] = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.duration > UNMARKED_SLOW_SECONDS and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter):
    if _unmarked_slow:
        terminalreporter.write_sep("-", f"tests over {UNMARKED_SLOW_SECONDS:.0f} s not marked slow")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}  (mark it @pytest.mark.slow)")
