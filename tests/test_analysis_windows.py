"""Independent text windows (`study analyze --windows`) and the per-window results the report's frozen findings
read: the sampler's windows never overlap or cross texts, and each per-window number equals a direct computation."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from study.frozen.analysis import analyze, capture_attention
from study.frozen.analysis.dilution import fixed_query_dilution
from study.frozen.analysis.gradient import saturated_rows
from study.frozen.analysis.windows import allocate, sample_windows

GPT2 = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
SMALL = dict(lengths=[8, 16, 32], temperatures=[0.01, 0.05, 0.1, 1.0, 10.0], mc_samples=0, spectral_rows=4)


# ---- the sampler ----------------------------------------------------------------------------------------------
def test_windows_are_disjoint_inside_one_text_and_spread_in_proportion():
    texts = [list(range(1000)), list(range(10_000, 10_300)), list(range(20_000, 20_050))]
    windows, origins = sample_windows(texts, 12, 40, seed=3)
    assert len(windows) == 12 and all(len(w) == 40 for w in windows)
    assert [sum(o["text"] == i for o in origins) for i in range(3)] == allocate([1000, 300, 50], 12, 40) == [9, 3, 0]
    for w, o in zip(windows, origins):
        assert w == texts[o["text"]][o["start"]:o["start"] + 40]  # a window never crosses into another text
    for i in range(3):
        spans = sorted((o["start"], o["start"] + 40) for o in origins if o["text"] == i)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # never overlapping
    starts = [o["start"] for o in origins if o["text"] == 0]
    assert max(starts) > 800 and min(starts) < 111  # spread over the whole text, not consecutive blocks
    assert sample_windows(texts, 12, 40, seed=3) == (windows, origins)
    assert sample_windows(texts, 12, 40, seed=4)[1] != origins


def test_windows_fill_a_text_exactly_and_too_many_fail_naming_the_numbers():
    windows, origins = sample_windows([list(range(100))], 4, 25)
    assert [o["start"] for o in origins] == [0, 25, 50, 75]
    with pytest.raises(ValueError, match="5 windows of L=25 tokens need 125 tokens; the text has room for 4 whole"):
        sample_windows([list(range(100))], 5, 25)
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        sample_windows([list(range(100))], 0, 25)


# ---- per-window results ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three_windows():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(copy.deepcopy(GPT2)).eval()
    ids = torch.randint(0, 64, (3, 32))
    return model, ids, analyze(model, ids, **SMALL)


def test_per_window_n_star_is_algorithm_3_on_that_window_alone(three_windows):
    model, ids, res = three_windows
    json.dumps(res, allow_nan=False)
    block = res["alg3_critical_n_by_window"]
    for w in range(3):
        alone = analyze(model, ids[w:w + 1], **SMALL)["alg3_critical_n"]
        for li, row in enumerate(alone):
            assert block["n_star"]["0.01"][w][li] == row["n_star"]["0.01"]
            assert block["n_star_over_length"]["0.05"][w][li] == row["n_star_over_length"]["0.05"]


def test_per_window_separability_and_gradient_agree_with_the_pooled_per_head_numbers(three_windows):
    model, ids, res = three_windows
    alone = analyze(model, ids[1:2], **SMALL)
    ns = res["alg4_separability_by_window"]["ns"]
    for i in range(len(ns)):
        values = [layer[i][h] for layer in alone["alg4_separability"]["ratio"] for h in range(4)]
        values = [v for v in values if v is not None]
        assert res["alg4_separability_by_window"]["median_over_heads"][1][i] == pytest.approx(np.median(values))
    # every window has the same rows, so the mean over windows of the per-window head mean is the pooled mean
    g = np.array(res["alg5_gradient"]["g_per_head"])  # [layer][head][T][eps]
    by_window = np.array(res["alg5_gradient_by_window"]["g_mean_over_heads"])  # [window][T][eps]
    assert by_window.mean(0) == pytest.approx(g.reshape(-1, *g.shape[2:]).mean(0), rel=1e-9)
    top = np.array(res["alg5_gradient_by_window"]["g_max_over_heads"])
    assert (top >= by_window - 1e-15).all()


# ---- Lemma 1 on fixed queries ---------------------------------------------------------------------------------
def test_fixed_query_dilution_matches_a_loop_and_respects_both_bounds():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 20, 8, generator=gen), torch.randn(2, 3, 20, 8, generator=gen)
    scaling, T = 8**-0.5, 0.7
    logits = q @ k.transpose(-1, -2) * scaling
    counts = [1, 2, 5, 20]
    got = fixed_query_dilution(logits, q, k, scaling, counts, temperature=T)
    for b in range(2):
        for h in range(3):
            for j, n in enumerate(counts):
                z = logits[b, h, -1, 20 - n:].double() / T
                w = torch.softmax(z, -1)
                assert got["max_weight"][b, h, j] == pytest.approx(w.max().item())
                assert got["scaled_min"][b, h, j] == pytest.approx(n * w.min().item())
                ent = -(w * w.log()).sum().item()
                assert got["entropy"][b, h, j] == pytest.approx(ent, abs=1e-12)
                if n > 1:
                    assert got["normalized_entropy"][b, h, j] == pytest.approx(ent / math.log(n))
                d = q[b, h, -1].norm().item() * k[b, h, 20 - n:].norm(dim=-1).max().item() * scaling
                assert got["log10_paper_bound"][b, h, j] == pytest.approx(2 * d / T / math.log(10))
    scaled = got["scaled_max"].log10()
    assert (scaled <= got["log10_range_bound"] + 1e-12).all()  # n max w <= exp(Delta / T)
    assert (got["log10_range_bound"] <= got["log10_paper_bound"] + 1e-12).all()  # Delta <= 2 |q| max |k|
    uniform = fixed_query_dilution(torch.zeros(1, 1, 6, 6), torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2), 1.0,
                                   [2, 6])
    assert uniform["max_weight"][0, 0].tolist() == pytest.approx([1 / 2, 1 / 6])
    assert uniform["normalized_entropy"][0, 0].tolist() == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="n=7"):
        fixed_query_dilution(torch.zeros(1, 1, 6, 6), torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2), 1.0, [7])


def test_saturated_rows_counts_rows_with_a_weight_above_0_99():
    logits = torch.tensor([[[[0.0, 0, 0], [0, 5, 0], [0, 0.0, 0.1]]]])  # (1, 1, 3, 3)
    got = saturated_rows(logits, [1.0, 0.01])[0, 0]
    # row 0 sees one key (saturated at any T); row 1: softmax(0, 5) has 0.9933 at T = 1; row 2 only at T = 0.01
    assert got.tolist() == pytest.approx([2 / 3, 1.0])


def test_fixed_query_block_of_analyze(three_windows):
    model, ids, res = three_windows
    block = res["lemma1_fixed_query_by_window"]
    assert block["lengths"] == [8, 16, 32] and len(block["max_weight"]) == 3
    cap = capture_attention(model, ids)
    direct = fixed_query_dilution(cap.logits(0), cap.queries[0], cap.keys[0], cap.scalings[0], [8, 16, 32])
    direct1 = fixed_query_dilution(cap.logits(1), cap.queries[1], cap.keys[1], cap.scalings[1], [8, 16, 32])
    want = torch.cat([direct["max_weight"], direct1["max_weight"]], 1).mean(1)  # (B, nL) over both layers' heads
    assert np.array(block["max_weight"]) == pytest.approx(want.numpy(), rel=1e-6)
