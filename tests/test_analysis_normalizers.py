"""The analyses see each layer's real attention weights, whatever its normaliser (issue "Beyond softmax")."""

import copy

import pytest
import torch
from transformers import GPT2LMHeadModel

from study.attention import AttentionSpec, apply_attention_spec, tapping
from study.frozen.analysis import (
    analyze,
    capture_attention,
    dilution_stats,
    distance_stats,
    gradient_sensitivity,
)
from tests.conftest import tiny_gpt2_config


class _Keep:
    def __init__(self):
        self.seen = {}

    def observe(self, layer, weights, allowed, spec):
        self.seen[layer] = weights.clone()


def _model(spec):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(copy.deepcopy(tiny_gpt2_config())).eval()
    # Larger weights make sparse maps visibly sparse on a random model.
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(6.0)
    return apply_attention_spec(model, spec)


SPECS = [
    AttentionSpec(normalizer="sparsemax"),
    AttentionSpec(normalizer="entmax15", temperature=0.5),
    AttentionSpec(normalizer="ssmax"),
    AttentionSpec(normalizer="softmax", temperature=0.3, top_k=4),
    AttentionSpec(normalizer="self_adjust"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.normalizer}-T{s.temperature}-k{s.top_k}")
def test_captured_weights_equal_tapped_weights(spec):
    model = _model(spec)
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    tap = _Keep()
    with torch.no_grad(), tapping(tap):
        want_logits = model(input_ids=ids).logits
    cap = capture_attention(model, ids)
    assert model.config._attn_implementation == "study"  # restored after the capture
    for layer in range(cap.n_layers):
        assert cap.spec(layer) == spec
        torch.testing.assert_close(cap.weights(layer), tap.seen[layer], rtol=0, atol=1e-6)
    # The capture runs the layers' own attention, so the model's outputs are unchanged.
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, want_logits)


def test_sparsemax_weights_have_exact_zeros_and_finite_statistics():
    model = _model(AttentionSpec(normalizer="sparsemax"))
    ids = torch.randint(0, 64, (1, 32), generator=torch.Generator().manual_seed(2))
    tap = _Keep()
    with torch.no_grad(), tapping(tap):
        model(input_ids=ids)
    cap = capture_attention(model, ids)
    w = cap.weights(1)
    causal = torch.ones(32, 32, dtype=torch.bool).tril()
    zeros = (w == 0) & causal
    assert zeros.any(), "sparsemax should give exact zeros on visible keys"
    assert torch.equal(zeros, (tap.seen[1] == 0) & causal)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 32))
    plain = torch.softmax((cap.logits(1)).masked_fill(~causal, float("-inf")), -1)
    assert not torch.allclose(w, plain, atol=1e-3)  # not the softmax of the logits
    ent = dilution_stats(w)["entropy"]
    assert torch.isfinite(ent).all() and (ent >= 0).all()
    d = distance_stats(w, cap.vectors(1), [1, 5])
    assert torch.isfinite(d["d_sum_outside"][d["valid"]]).all()


def test_gradient_probe_through_a_normaliser():
    model = _model(AttentionSpec(normalizer="sparsemax"))
    cap = capture_attention(model, torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(3)))
    logits = cap.logits(0)
    g = gradient_sensitivity(logits, [0.1, 1.0], [1e-3], normalize=lambda z: cap.normalize(0, z))["g"]
    assert torch.isfinite(g).all()
    # Sparsemax is 1-Lipschitz in its input: |f(z') - f(z)| <= |z' - z| = eps / T.
    assert (g[..., 0, 0] <= 1 / 0.1 + 1e-6).all() and (g[..., 1, 0] <= 1.0 + 1e-6).all()
    # Softmax normaliser through the same path equals the built-in softmax probe.
    soft = gradient_sensitivity(logits, [0.1, 1.0], [1e-3])["g"]
    cap.specs = [None] * cap.n_layers
    cap.normalizers = [None] * cap.n_layers
    via = gradient_sensitivity(logits, [0.1, 1.0], [1e-3], normalize=lambda z: cap.normalize(0, z))["g"]
    torch.testing.assert_close(via, soft)


def test_analyze_reports_the_normaliser():
    model = _model(AttentionSpec(normalizer="sparsemax", layers=(1,)))
    res = analyze(model, torch.randint(0, 64, (1, 16)), lengths=[16], ns=[1, 5], temperatures=[0.1, 1.0],
                  mc_samples=0, spectral_rows=2, critical_ns=[1, 2, 4])
    assert res["model"]["normalizers"] == ["softmax", "sparsemax"]
    assert [a["normalizer"] for a in res["model"]["attention"]] == ["softmax", "sparsemax"]
    assert "own normaliser" in res["choices"]["gradient_probe"]
    # Lemma 1 on sparse rows: the smallest visible weight is exactly 0 somewhere in layer 1.
    assert min(v for head in res["lemma1_dilution"]["scaled_min"][1] for v in head) == 0.0


def test_float32_ranking_with_ties_matches_the_stable_float64_path():
    # Sparse rows are full of exact ties (zeros): the fast float32 top-k ranking must break them by position,
    # as the stable sort of the float64 path (and the loop oracle) does, so every statistic agrees.
    gen = torch.Generator().manual_seed(4)
    L = 24
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    scores = (3 * torch.randn(2, L, L, generator=gen)).masked_fill(~causal, float("-inf"))
    from study.attention.normalizers import NORMALIZERS

    w = NORMALIZERS["sparsemax"]()(scores.masked_fill(~causal, -1e4), causal)
    w = w.masked_fill(~causal, 0.0)
    w[:, :, 3] = 0.0  # negative zero and ties
    w[:, 5:, 4] = -0.0
    x = torch.randn(2, L, 6, generator=gen)
    assert (w[causal.expand_as(w)] == 0).float().mean() > 0.3
    got = distance_stats(w, x, [1, 3, 8], bound=True)
    want = distance_stats(w.double(), x.double(), [1, 3, 8], bound=True)
    for key in ("d_sum_outside", "d_norm_of_sum", "bound", "d1", "max_top_norm", "top_mass"):
        torch.testing.assert_close(got[key].double(), want[key], rtol=1e-4, atol=1e-4, equal_nan=True)
