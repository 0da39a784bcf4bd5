"""Attention-row statistics against closed forms and a brute-force per-row loop."""

import math

import pytest
import torch

from study.metrics.attention import (
    effective_support,
    finalize,
    kl_to_uniform,
    max_weight,
    nonzero_count,
    normalized_entropy,
    row_entropy,
    sample_rows,
    selection_uniformity,
    softmax_jacobian_max_entry,
    softmax_jacobian_norm,
    summarize_rows,
    topk_mass,
    tv_to_uniform,
    visible_count,
)


def causal_mask(lq: int, lk: int) -> torch.Tensor:
    """Row t sees keys 0..t (queries aligned with the last keys when lq < lk)."""
    return torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)


def masked_softmax(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over allowed keys; a fully masked row is all zeros (not NaN)."""
    w = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.nan_to_num(w, nan=0.0)


def random_inputs(seed: int, b=2, h=3, lq=7, lk=9, sparse=True):
    """Random weights with a causal mask, left padding of some keys and some fully padded query rows."""
    g = torch.Generator().manual_seed(seed)
    allowed = causal_mask(lq, lk).expand(b, h, lq, lk).clone()
    pad_keys = torch.randint(0, 3, (b,), generator=g)
    for i in range(b):
        allowed[i, :, :, : pad_keys[i]] = False  # left padding: keys never visible
    allowed[0, :, :2, :] = False  # two fully padded query rows in the first sequence
    logits = torch.randn(b, h, lq, lk, generator=g) * 2
    if sparse:
        # Exact zeros inside the visible window, as top-k selection or sparsemax would leave.
        allowed_sparse = allowed & (torch.rand(b, h, lq, lk, generator=g) > 0.3)
        # Keep each visible row's largest logit so that every visible row still sums to 1.
        best = logits.masked_fill(~allowed, float("-inf")).argmax(-1, keepdim=True)
        allowed_sparse.scatter_(-1, best, allowed.gather(-1, best))
        weights = masked_softmax(logits, allowed_sparse)
    else:
        weights = masked_softmax(logits, allowed)
    return weights, allowed


# ---------------------------------------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 5, 16])
def test_uniform_rows(n):
    lk = 20
    allowed = torch.zeros(lk, dtype=torch.bool)
    allowed[:n] = True
    w = allowed.float() / n
    assert visible_count(allowed) == n
    assert row_entropy(w) == pytest.approx(math.log(n), abs=1e-6)
    assert normalized_entropy(w, allowed) == pytest.approx(1.0, abs=1e-6)
    assert kl_to_uniform(w, allowed) == pytest.approx(0.0, abs=1e-6)
    assert tv_to_uniform(w, allowed) == pytest.approx(0.0, abs=1e-6)
    assert effective_support(w) == pytest.approx(n, rel=1e-5)
    assert nonzero_count(w) == n
    assert max_weight(w) == pytest.approx(1 / n)


def test_one_hot_rows():
    allowed = torch.ones(3, 6, dtype=torch.bool)
    w = torch.zeros(3, 6)
    w[torch.arange(3), torch.tensor([0, 2, 5])] = 1.0
    torch.testing.assert_close(row_entropy(w), torch.zeros(3))
    torch.testing.assert_close(effective_support(w), torch.ones(3))
    torch.testing.assert_close(max_weight(w), torch.ones(3))
    torch.testing.assert_close(normalized_entropy(w, allowed), torch.zeros(3))
    torch.testing.assert_close(kl_to_uniform(w, allowed), torch.full((3,), math.log(6)))
    torch.testing.assert_close(tv_to_uniform(w, allowed), torch.full((3,), 1 - 1 / 6))
    torch.testing.assert_close(nonzero_count(w), torch.ones(3, dtype=torch.long))


def test_causal_rows_use_visible_count():
    lq = lk = 6
    allowed = causal_mask(lq, lk)
    w = allowed.float() / allowed.sum(-1, keepdim=True)  # uniform over each row's visible keys
    n = torch.arange(1, lq + 1)
    torch.testing.assert_close(visible_count(allowed), n)
    torch.testing.assert_close(row_entropy(w), n.float().log())
    torch.testing.assert_close(kl_to_uniform(w, allowed), torch.zeros(lq), atol=1e-6, rtol=0)
    torch.testing.assert_close(tv_to_uniform(w, allowed), torch.zeros(lq), atol=1e-6, rtol=0)
    # Row 0 sees one key: degenerate, 0 by convention; the others are uniform, 1.
    expected = torch.tensor([0.0] + [1.0] * (lq - 1))
    torch.testing.assert_close(normalized_entropy(w, allowed), expected)

    sums = summarize_rows(w.expand(1, 2, lq, lk), allowed)
    means = finalize(sums)
    torch.testing.assert_close(sums["rows"], torch.full((2,), float(lq), dtype=torch.float64))
    torch.testing.assert_close(sums["rows_nondegenerate"], torch.full((2,), lq - 1.0, dtype=torch.float64))
    torch.testing.assert_close(means["normalized_entropy"], torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(means["kl_uniform"], torch.zeros(2, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(means["effective_support"], n.double().mean().expand(2))


def test_exact_zeros_and_padding_give_no_nan():
    weights, allowed = random_inputs(0)
    assert (weights == 0).any()
    for fn in (normalized_entropy, kl_to_uniform, tv_to_uniform):
        assert torch.isfinite(fn(weights, allowed)).all()
    for fn in (row_entropy, effective_support, max_weight):
        assert torch.isfinite(fn(weights)).all()
    assert torch.isfinite(selection_uniformity(weights, allowed, 4)).all()
    sums = summarize_rows(weights, allowed)
    assert all(torch.isfinite(v).all() for v in sums.values())


def test_fully_padded_rows_are_excluded():
    weights, allowed = random_inputs(1)
    b, h, lq, lk = weights.shape
    # Extra padded query rows whose weights are garbage (HF gives masked rows uniform weights): no effect.
    pad = torch.zeros(b, h, 3, lk, dtype=torch.bool)
    junk = torch.full((b, h, 3, lk), 1.0 / lk)
    padded = summarize_rows(torch.cat([weights, junk], 2), torch.cat([allowed, pad], 2))
    plain = summarize_rows(weights, allowed)
    for key in plain:
        torch.testing.assert_close(padded[key], plain[key])
    # And NaN weights on padded rows do not leak either.
    nan_junk = torch.full((b, h, 3, lk), float("nan"))
    padded = summarize_rows(torch.cat([weights, nan_junk], 2), torch.cat([allowed, pad], 2))
    for key in plain:
        torch.testing.assert_close(padded[key], plain[key])


# ---------------------------------------------------------------------------------------------------------
# Brute force
# ---------------------------------------------------------------------------------------------------------


def visible_rows(weights, allowed):
    """(head, n, the row's visible weights as floats) for every row with n >= 1 visible keys, one at a time."""
    b, h, lq, _ = weights.shape
    for bi in range(b):
        for hi in range(h):
            for qi in range(lq):
                mask = allowed[bi, hi, qi]
                n = int(mask.sum())
                if n:
                    yield hi, n, weights[bi, hi, qi][mask].double().tolist()


def brute_row(a: list[float], n: int, ks) -> dict[str, float]:
    """Every statistic for one row with Python floats; `a` holds only the visible weights."""
    h = -sum(x * math.log(x) for x in a if x > 0)
    s = sorted(a, reverse=True)
    out = {
        "entropy": h,
        "kl_uniform": math.log(n) - h,
        "tv_uniform": 0.5 * sum(abs(x - 1 / n) for x in a),
        "max_weight": s[0],
        "effective_support": math.exp(h),
        "nonzero": sum(x != 0 for x in a),
        "saturated": float(s[0] > 0.99),
    }
    for k in ks:
        m = min(k, n)
        sel = s[:m]
        out[f"topk_mass/{k}"] = sum(sel)
        out[f"selection_tv/{k}"] = 0.5 * sum(abs(x / sum(sel) - 1 / m) for x in sel)
        out[f"selection_entropy/{k}"] = -sum(x / sum(sel) * math.log(x / sum(sel)) for x in sel if x > 0)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sparse", [False, True])
def test_summarize_rows_matches_brute_force(seed, sparse):
    ks = (1, 3, 4, 16)
    weights, allowed = random_inputs(seed, sparse=sparse)
    b, h, lq, lk = weights.shape
    sums = summarize_rows(weights, allowed, selection_ks=ks)

    expected = {key: [0.0] * h for key in sums}
    for hi, n, a in visible_rows(weights, allowed):
        expected["rows"][hi] += 1
        for key, value in brute_row(a, n, ks).items():
            expected[key][hi] += value
        if n >= 2:
            expected["rows_nondegenerate"][hi] += 1
            expected["normalized_entropy"][hi] += brute_row(a, n, ())["entropy"] / math.log(n)
    assert set(expected) == set(sums)
    for key, value in sums.items():
        assert value.shape == (h,)
        torch.testing.assert_close(
            value, torch.tensor(expected[key], dtype=torch.float64), atol=1e-5, rtol=1e-5
        )

    # finalize divides by the right count, and sums from two halves add up to the whole.
    means = finalize(sums)
    torch.testing.assert_close(means["entropy"], sums["entropy"] / sums["rows"])
    torch.testing.assert_close(
        means["normalized_entropy"], sums["normalized_entropy"] / sums["rows_nondegenerate"]
    )
    halves = [summarize_rows(weights[i : i + 1], allowed[i : i + 1], selection_ks=ks) for i in range(b)]
    for key in sums:
        torch.testing.assert_close(halves[0][key] + halves[1][key], sums[key])


def test_summarize_rows_with_broadcast_mask_and_fp16():
    lq = lk = 8
    allowed = causal_mask(lq, lk)
    logits = torch.randn(2, 2, lq, lk, generator=torch.Generator().manual_seed(3))
    weights = masked_softmax(logits, allowed)
    full = summarize_rows(weights, allowed.expand(2, 2, lq, lk).clone())
    broadcast = summarize_rows(weights, allowed[None, None])
    half = summarize_rows(weights.half(), allowed)
    for key in full:
        torch.testing.assert_close(broadcast[key], full[key])
        torch.testing.assert_close(half[key], full[key], atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("k", [1, 2, 5, 12])
def test_topk_mass_and_selection_uniformity_brute_force(k):
    weights, allowed = random_inputs(4, sparse=True)
    mass = topk_mass(weights, k)
    sel = selection_uniformity(weights, allowed, k)
    flat_w, flat_a = weights.reshape(-1, weights.shape[-1]), allowed.reshape(-1, allowed.shape[-1])
    for r in range(flat_w.shape[0]):
        n = int(flat_a[r].sum())
        if n == 0:
            assert sel.reshape(-1)[r] == 0
            continue
        expected = brute_row(flat_w[r][flat_a[r]].double().tolist(), n, (k,))
        assert mass.reshape(-1)[r].item() == pytest.approx(expected[f"topk_mass/{k}"], abs=1e-6)
        assert sel.reshape(-1)[r].item() == pytest.approx(expected[f"selection_tv/{k}"], abs=1e-6)
    if k == 1:
        assert (sel == 0).all()
    if k >= weights.shape[-1]:
        valid = visible_count(allowed) > 0
        torch.testing.assert_close(mass[valid], torch.ones_like(mass[valid]))


def test_selection_uniformity_closed_form():
    # Top-2 of (0.6, 0.2, 0.2) renormalised is (0.75, 0.25): TV to (0.5, 0.5) is 0.25.
    w = torch.tensor([[0.6, 0.2, 0.2, 0.0]])
    allowed = torch.tensor([[True, True, True, False]])
    assert selection_uniformity(w, allowed, 2).item() == pytest.approx(0.25)
    # k beyond the visible count selects the 3 visible keys: TV of (0.6, 0.2, 0.2) to uniform over 3.
    assert selection_uniformity(w, allowed, 4).item() == pytest.approx(0.6 - 1 / 3)


# ---------------------------------------------------------------------------------------------------------
# Jacobian
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.05, 0.5, 1.0, 4.0])
def test_softmax_jacobian_norm_matches_autograd(temperature):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 7, generator=g, dtype=torch.float64) * 3
    weights = (logits / temperature).softmax(-1)
    got = softmax_jacobian_norm(weights, temperature)
    for r in range(logits.shape[0]):
        jac = torch.autograd.functional.jacobian(lambda x: (x / temperature).softmax(-1), logits[r])
        expected = torch.linalg.matrix_norm(jac, 2)
        assert got[r].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    assert (got >= 0).all() and (got <= 1 / (2 * temperature) + 1e-6).all()


def test_softmax_jacobian_norm_extremes():
    # Two equal keys reach the upper bound 1/(2T); a one-hot row has a zero Jacobian.
    w = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(softmax_jacobian_norm(w, 2.0), torch.tensor([0.25, 0.0], dtype=torch.float64))


def test_sample_rows_is_deterministic_and_non_degenerate():
    weights, allowed = random_inputs(6, sparse=False)
    a = sample_rows(weights, allowed, 5, generator=torch.Generator().manual_seed(0))
    b = sample_rows(weights, allowed, 5, generator=torch.Generator().manual_seed(0))
    assert a.shape == (5, weights.shape[-1])
    torch.testing.assert_close(a, b)
    assert ((a > 0).sum(-1) >= 2).all()  # dense softmax rows: support = visible count >= 2
    torch.testing.assert_close(a.sum(-1), torch.ones(5))
    n_valid = int((visible_count(allowed) >= 2).sum())
    assert sample_rows(weights, allowed, 10_000).shape[0] == n_valid


def test_as_distribution_normalises_magnitudes_and_keeps_zero_rows():
    from study.metrics import as_distribution

    w = torch.tensor([[0.2, -0.2, 0.6], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(as_distribution(w), torch.tensor([[0.2, 0.2, 0.6], [0.0, 0.0, 0.0]]))


def test_softmax_jacobian_norm_at_low_temperature_matches_eigvalsh_in_float64():
    """Near-one-hot rows (T = 0.01) made float32 eigvalsh fail to converge; the secular-equation root does not."""
    torch.manual_seed(0)
    for temperature in (0.01, 0.1):
        weights = (torch.randn(32, 40, dtype=torch.float64) / temperature).softmax(-1)
        jac = torch.diag_embed(weights) - weights.unsqueeze(-1) * weights.unsqueeze(-2)
        expected = torch.linalg.eigvalsh(jac)[..., -1].clamp(min=0) / temperature
        torch.testing.assert_close(softmax_jacobian_norm(weights, temperature), expected, atol=1e-10, rtol=1e-8)


def test_entropy_sums_equal_the_full_summary():
    from study.metrics import entropy_sums

    weights, allowed = random_inputs(3, sparse=True)
    full = summarize_rows(weights, allowed)
    light = entropy_sums(weights, allowed)
    assert set(light) == {"rows", "rows_nondegenerate", "entropy", "normalized_entropy"}
    for key, value in light.items():
        torch.testing.assert_close(value, full[key])


def test_by_visible_sums_match_brute_force():
    from study.metrics import VISIBLE_BINS, by_visible_sums

    weights, allowed = random_inputs(0, sparse=False)
    h = weights.shape[1]
    sums = by_visible_sums(weights, allowed)
    expected = {key: torch.zeros(h, VISIBLE_BINS, dtype=torch.float64) for key in sums}
    for hi, n, a in visible_rows(weights, allowed):
        bin_ = min(int(math.floor(math.log2(n))), VISIBLE_BINS - 1)
        expected["by_n/rows"][hi, bin_] += 1
        expected["by_n/max_weight"][hi, bin_] += max(a)
        if n >= 2:
            expected["by_n/normalized_entropy"][hi, bin_] += brute_row(a, n, ())["entropy"] / math.log(n)
    for key, value in sums.items():
        torch.testing.assert_close(value, expected[key], atol=1e-5, rtol=1e-5)
    # The selection monitor takes them from `summarize_rows` (one masked copy, entropy and maximum for both).
    from study.metrics import summarize_rows

    together = summarize_rows(weights, allowed, by_visible=True)
    assert summarize_rows(weights, allowed).keys() | sums.keys() == together.keys()
    for key, value in sums.items():
        torch.testing.assert_close(together[key], value, atol=0, rtol=0)


def test_selection_entropy_is_monotone_in_k_for_a_fixed_row_and_log_k_when_uniform():
    from study.metrics import selection_entropy

    torch.manual_seed(0)
    w = torch.softmax(torch.randn(50, 20) * 2, -1)
    allowed = torch.ones(50, 20, dtype=torch.bool)
    values = torch.stack([selection_entropy(w, allowed, k) for k in range(1, 21)])
    assert (values.diff(dim=0) >= -1e-6).all()  # the sanity check the report runs: true by construction
    uniform = torch.full((1, 8), 1 / 8)
    torch.testing.assert_close(selection_entropy(uniform, torch.ones(1, 8, dtype=torch.bool), 4), torch.tensor([math.log(4)]))


def _softmax_jacobian(row: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.autograd.functional.jacobian(lambda x: torch.softmax(x / temperature, -1), row.to(torch.float64))


@pytest.mark.parametrize("temperature", [0.01, 0.3, 2.0])
def test_corollary_3_holds_entrywise_and_fails_as_a_spectral_norm(temperature):
    """Every entry of (1/T)(diag(a) - a a^T) is at most 1/(4T), whatever the row; its spectral norm reaches 1/(2T)
    at a = (1/2, 1/2), so the spectral reading of the bound is false by mathematics."""
    torch.manual_seed(1)
    rows = torch.softmax(torch.randn(500, 9, dtype=torch.float64) * 4, -1)
    rows = torch.cat([rows, torch.tensor([[0.5, 0.5] + [0.0] * 7], dtype=torch.float64)])
    entries = softmax_jacobian_max_entry(rows, temperature)
    brute = torch.stack([_softmax_jacobian(torch.log(r.clamp(min=1e-300)) * temperature, temperature).abs().max()
                         for r in rows[:20]])  # fmt: skip
    torch.testing.assert_close(entries[:20], brute, rtol=1e-9, atol=1e-12)
    assert (entries <= 1 / (4 * temperature) * (1 + 1e-12)).all()
    assert entries[-1].item() == pytest.approx(1 / (4 * temperature))  # the two-key row reaches it exactly
    spectral = softmax_jacobian_norm(rows[-1:], temperature)
    assert spectral.item() == pytest.approx(1 / (2 * temperature))  # twice the entrywise bound


def test_max_entry_rejects_a_bad_temperature():
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        softmax_jacobian_max_entry(torch.ones(1, 2) / 2, 0)
