"""Vectorised analyses against the per-row, per-N, per-token loop oracles (study.frozen.analysis.reference)."""

import math

import numpy as np
import pytest
import torch

from study.frozen.analysis import reference as R
from study.frozen.analysis.critical import critical_n
from study.frozen.analysis.dilution import dilution_stats
from study.frozen.analysis.distance import distance_stats
from study.frozen.analysis.gradient import gradient_sensitivity
from study.frozen.analysis.separability import separability_stats
from study.metrics import softmax_jacobian_norm


def _random_head(heads=2, length=12, dim=5, seed=0, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(heads, length, length, generator=gen, dtype=torch.float64)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    weights = torch.softmax(logits.masked_fill(~causal, -1e300), -1).masked_fill(~causal, 0.0)
    x = torch.randn(heads, length, dim, generator=gen, dtype=torch.float64)
    return logits, weights, x


def _assert_matches(got: torch.Tensor, want: np.ndarray, tol=1e-5):
    got = got.numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=tol, rtol=0, equal_nan=True)


def test_distance_matches_loop_oracle():
    _, w, x = _random_head()
    ns = [1, 3, 5, 12]
    # A tiny budget forces many row chunks, so chunk boundaries are exercised too.
    got = distance_stats(w, x, ns, budget=100)
    for p in range(w.shape[0]):
        want = R.distance_head(w[p].numpy(), x[p].numpy(), ns)
        for key, value in want.items():
            _assert_matches(got[key][p], value)


def test_distance_broadcasts_hidden_states_over_heads():
    _, w, x = _random_head(heads=3)
    shared = x[0]  # one vector per position for every head (the hidden-state option)
    got = distance_stats(w, shared[None], [2])
    want = R.distance_head(w[2].numpy(), shared.numpy(), [2])
    _assert_matches(got["d_sum_outside"][2], want["d_sum_outside"])


def test_full_selection_gives_zero_distance():
    _, w, x = _random_head(length=9)
    got = distance_stats(w, x, [9])
    last = {k: got[k][:, -1, 0] for k in ("d_sum_outside", "d_norm_of_sum", "bound", "expectation")}
    for key, value in last.items():
        assert torch.all(value.abs() < 1e-12), key
    assert torch.isnan(got["d_sum_outside"][:, :-1]).all()  # rows with fewer than N visible keys


def test_monte_carlo_and_closed_form_expectation():
    # The closed form puts the expectation over I_N inside the norm: E[s | i not in I_N] =
    # (N/(n-1)) sum_{j != i} alpha_j x_j, so by Jensen it is a LOWER bound on the exact E[d]; Monte Carlo
    # must approach the exact value (all 35 subsets of 3 among 7 enumerated by the oracle).
    _, w, x = _random_head(heads=1, length=7)
    got = distance_stats(w, x, [3], mc_samples=4000, seed=1)
    exact = R.exact_expected_distance(w[0, -1].numpy(), x[0].numpy(), 3)
    mc = got["mc_expectation"][0, -1, 0].item()
    assert abs(mc - exact) < 0.03 * exact
    assert got["expectation"][0, -1, 0].item() <= exact + 1e-12


def test_separability_matches_loop_oracle():
    _, w, x = _random_head()
    ns = [1, 2, 4, 11]
    got = separability_stats(w, x, ns, budget=100)
    for p in range(w.shape[0]):
        want = R.separability_head(w[p].numpy(), x[p].numpy(), ns)
        for key, value in want.items():
            _assert_matches(got[key][p], value)


def test_separability_in_unit_interval_and_above_lower_bound():
    # Lower bound: with |x| = M and |x_j - x_k| >= delta, x_j.x_k <= M^2 - delta^2/2, so
    # |s - alpha_i x_i|^2 = |sum_{j in I_N, j != i} alpha_j x_j|^2 <= xi_i^2. Every non-separable i has
    # r <= |s - alpha_i x_i| <= xi_i, hence N - N_s <= sum xi_i / r: the lower bound holds row by row
    # (and xi^2 >= |.|^2 >= 0, so the clamp only ever absorbs rounding).
    # The upper bound is a Gaussian-tail (probabilistic) statement: single rows can exceed it (measured:
    # about 1 in 6 random rows with N_s = N), so it is only reported, not asserted.
    _, w, x = _random_head(heads=4, length=16, dim=6, seed=3)
    got = separability_stats(w, x, [1, 2, 4, 8])
    valid = got["valid"]
    ratio = got["ratio"][valid]
    assert torch.all((ratio >= 0) & (ratio <= 1))
    assert torch.all(ratio >= got["lower"][valid] - 1e-12)
    assert torch.all(got["xi_clamped"][valid] == 0)


def test_uniform_attention_separability_by_hand():
    # Uniform attention alpha_i = 1/n, orthogonal vectors x_i = M e_i: for i in I_N,
    # |s - x_i/n| = |sum_{j in I_N, j != i} x_j| / n = M sqrt(N - 1) / n, while for i outside
    # |s - x_i/n| = M sqrt(N + 1) / n = r. Every selected key is strictly closer: N_s = N.
    n = 6
    w = torch.full((n, n), 1.0, dtype=torch.float64).tril()
    w = w / w.sum(-1, keepdim=True)
    x = 2.0 * torch.eye(n, dtype=torch.float64)
    got = separability_stats(w, x, [1, 2, 3])
    assert torch.all(got["ratio"][-1] == 1.0)
    assert got["radius"].item() == 2.0
    # One dimension, x = (+1, -1, +1, +1), uniform 1/4, N = 2: the stable sort picks keys 0 and 1, so
    # s = (1 - 1)/4 = 0; selected keys are at |0 -+ 1/4| = 1/4 and so are the others: r = 1/4, and
    # "strictly closer than r" fails for both, N_s = 0.
    w4 = torch.full((4, 4), 0.25, dtype=torch.float64).tril()
    x4 = torch.tensor([[1.0], [-1.0], [1.0], [1.0]], dtype=torch.float64)
    got4 = separability_stats(w4, x4, [2])
    assert got4["n_s"][-1, 0].item() == 0.0
    assert got4["r"][-1, 0].item() == 0.25


def test_gradient_probe_matches_loop_and_jacobian():
    logits, _, _ = _random_head(heads=1, length=8)
    temps = [0.05, 1.0, 10.0]
    got = gradient_sensitivity(logits, temps, [1e-7, 1e-1, 10.0], seed=5)["g"][0]
    # Reproduce the probe's direction v with the same generator, then check row by row.
    gen = torch.Generator().manual_seed(5)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    v = torch.randn(8, 8, generator=gen, dtype=torch.float64).masked_fill(~causal, 0.0)
    v = v / v.norm(dim=-1, keepdim=True)
    for t in range(8):
        lt, vt = logits[0, t, : t + 1].numpy(), v[t, : t + 1].numpy()
        for i, T in enumerate(temps):
            for j, eps in enumerate([1e-7, 1e-1, 10.0]):
                assert got[t, i, j].item() == pytest.approx(R.gradient_row(lt, vt, T, eps), abs=1e-6)
            # eps -> 0: g approaches |J v| with J = (1/T)(diag(a) - a a^T).
            a = R.softmax(lt / T)
            jac = (np.diag(a) - np.outer(a, a)) / T
            assert got[t, i, 0].item() == pytest.approx(np.linalg.norm(jac @ vt), rel=1e-4, abs=1e-9)


def test_jacobian_spectral_norm_matches_eigvalsh():
    logits, w, _ = _random_head(heads=3, length=10, scale=3.0)
    for T in (0.1, 1.0, 4.0):
        probs = torch.softmax(logits / T, -1)
        got = softmax_jacobian_norm(probs, T)
        jac = (torch.diag_embed(probs) - probs[..., :, None] * probs[..., None, :]) / T
        want = torch.linalg.eigvalsh(jac)[..., -1]
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-9)
        assert torch.all(got <= 1 / (2 * T) + 1e-12)
    # Causal rows with zeros, a one-hot row (norm 0) and a tie (two equal largest weights).
    got = softmax_jacobian_norm(w, 1.0)
    jac = torch.diag_embed(w) - w[..., :, None] * w[..., None, :]
    torch.testing.assert_close(got, torch.linalg.eigvalsh(jac)[..., -1], atol=1e-12, rtol=1e-9)
    special = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(softmax_jacobian_norm(special, 1.0), torch.tensor([0.0, 0.5], dtype=torch.float64))


def test_dilution_uniform_rows():
    n = 5
    w = torch.full((n, n), 1.0).tril()
    w = w / w.sum(-1, keepdim=True)
    got = dilution_stats(w)
    torch.testing.assert_close(got["max_weight"], 1 / torch.arange(1, n + 1, dtype=torch.float32))
    torch.testing.assert_close(got["scaled_min"], torch.ones(n))
    torch.testing.assert_close(got["scaled_max"], torch.ones(n))


def test_dilution_of_chosen_rows_equals_those_rows_of_every_row():
    """`rows=` (what `study analyze` reports: n = each L) gives exactly those rows of the whole computation."""
    gen = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(2, 3, 12, 12, generator=gen).masked_fill(~torch.ones(12, 12).tril().bool(),
                                                                        -math.inf), -1)
    every, chosen = dilution_stats(w), dilution_stats(w, rows=[0, 4, 11])
    for key in ("max_weight", "scaled_min", "scaled_max", "entropy"):
        torch.testing.assert_close(chosen[key], every[key][..., [0, 4, 11]], atol=0, rtol=0)
    assert chosen["visible"] == [1, 5, 12]
    with pytest.raises(ValueError, match="got row 12"):
        dilution_stats(w, rows=[3, 12])


def test_critical_n_ks():
    gen = torch.Generator().manual_seed(0)
    d = torch.rand(3, 40, generator=gen)
    e = d.clone()
    e[0] += 5.0  # N = 1: clearly different samples; from N = 2 on identical
    res = critical_n(d, e, [1, 2, 4])
    assert res["pvalues"][0] < 1e-6 and res["pvalues"][1] == 1.0
    assert res["n_star"] == {"0.01": 2, "0.05": 2}
    never = critical_n(d, d + 5.0, [1, 2, 4])
    assert never["n_star"]["0.05"] is None


def test_bad_input_raises_naming_value():
    _, w, x = _random_head(length=6)
    with pytest.raises(ValueError, match="N=7"):
        distance_stats(w, x, [1, 7])
    with pytest.raises(ValueError, match="N=0"):
        separability_stats(w, x, [0])
    with pytest.raises(ValueError, match="T=0.0"):
        gradient_sensitivity(w, [1.0, 0.0])
    with pytest.raises(ValueError, match="-1.0"):
        softmax_jacobian_norm(w, -1.0)
    with pytest.raises(ValueError, match="empty"):
        distance_stats(torch.zeros(2, 0, 0), torch.zeros(2, 0, 3), [1])
    assert not math.isnan(distance_stats(w, x, [6])["d_sum_outside"][0, -1, 0].item())


@pytest.mark.parametrize("spec", [
    dict(normalizer="softmax"),
    dict(normalizer="sparsemax"),
    dict(normalizer="self_adjust"),  # rows in [0, 1] that do not sum to 1
    dict(normalizer="self_adjust", self_adjust_variant="plain"),  # negative weights
], ids=lambda s: "-".join(s.values()))
def test_dilution_entropy_equals_the_monitors_entropy(spec):
    """One convention for rows as distributions: the analyses' entropy is the training monitors' on the same
    weights (the monitors' `row_distribution`, then `row_entropy` per row and `entropy_sums` per head)."""
    from study.attention import AttentionSpec, normalizer_class
    from study.callbacks.base import row_distribution
    from study.metrics import entropy_sums, row_entropy

    spec = AttentionSpec(**spec)
    scores = 2 * torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(4))
    allowed = torch.ones(10, 10, dtype=torch.bool).tril()
    weights = normalizer_class(spec.normalizer).from_spec(spec, num_heads=3)(scores, allowed)
    if spec.self_adjust_variant == "plain":
        assert (weights < 0).any()
    got = dilution_stats(weights)["entropy"]  # (B, H, L)
    monitors = row_distribution(weights, spec)
    torch.testing.assert_close(got, row_entropy(monitors))
    torch.testing.assert_close(got.double().sum((0, 2)), entropy_sums(monitors, allowed)["entropy"])


def test_gradient_spectral_norms_use_the_one_masked_softmax():
    """Alg. 5's exact Jacobian norms come from `masked_softmax` (finfo.min fill, zeros outside the mask) and
    `study.metrics.softmax_jacobian_norm`; the -inf fill the analysis once spelled out gives the same rows."""
    from study.attention.normalizers import masked_softmax

    logits, _, _ = _random_head(heads=2, length=9, scale=30.0)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    for T in (1e-3, 0.1, 1.0):
        by_hand = torch.softmax((logits / T).masked_fill(~causal, -math.inf), -1)
        shared = masked_softmax(logits / T, causal)
        assert torch.equal(shared, by_hand)
        assert torch.equal(softmax_jacobian_norm(shared, T, iterations=80), softmax_jacobian_norm(by_hand, T, iterations=80))


def test_theorem1_effect_sizes_planted():
    """d = E on every head: KS 0 and d/E 1; d = 2E: d/E 2."""
    from types import SimpleNamespace

    from study.frozen.analysis.critical import _effect_sizes, head_subsets

    e = torch.rand(3, 2, 2, 4, generator=torch.Generator().manual_seed(1)) + 0.5  # (windows, nL, G, heads)
    settings = SimpleNamespace(grids=SimpleNamespace(lengths=[4, 8], critical_ns=[1, 4]))
    same = _effect_sizes(settings, [{"d_windows": e, "e_windows": e}])
    assert same["heads"] == 4 and same["by_length"][0]["ns"] == [1, 4]
    assert all(v == 0.0 for w in same["by_length"][1]["ks"] for v in w)
    assert all(abs(v - 1) < 1e-12 for w in same["by_length"][1]["d_over_e"] for v in w)
    double = _effect_sizes(settings, [{"d_windows": 2 * e, "e_windows": e}])["by_length"][1]
    assert all(abs(v - 2) < 1e-12 for w in double["d_over_e"] for v in w)
    assert head_subsets(1) == [[0]] and head_subsets(2) == [[0], [0, 1]]
    assert head_subsets(30)[:3] == [[0], [0, 29], list(range(0, 30, 4))] and head_subsets(30)[-1] == list(range(30))
