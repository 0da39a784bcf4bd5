"""Row statistics without the map (`study.attention.rowstats`) against the explicit map and closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from study.attention.core import _rows_reaching, causal_allowed, window_allowed
from study.attention.rowstats import FUSED_ONLY, STATISTICS, fused_logsumexp, row_statistics
from study.metrics import row_entropy

ALL = slice(None)
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def _visible(q_len, kv_len, causal, window, padding):
    visible = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool)
    if causal:
        visible = visible & causal_allowed(q_len, kv_len, torch.device("cpu"))
    if window is not None:
        visible = visible & window_allowed(q_len, kv_len, window, causal, torch.device("cpu"))
    if padding:
        pad = torch.ones(2, 1, 1, kv_len, dtype=torch.bool)
        pad[1, ..., :3] = False  # the second sequence is left-padded by three keys
        visible = visible & pad
    return visible


def _explicit(query, key, scaling, temperature, visible, top_k, bias=None):
    """Every statistic from the explicit (B, H, Lq, Lk) map, as the monitors compute them."""
    raw = query @ key.transpose(-1, -2) * scaling
    if bias is not None:
        raw = raw + bias
    visible = visible.expand(raw.shape)
    z = raw / temperature
    p = z.masked_fill(~visible, -math.inf).softmax(-1).nan_to_num(0.0)
    n = visible.sum(-1)
    first = visible.to(torch.uint8).argmax(-1, keepdim=True)
    values = z.masked_fill(~visible, 0.0)
    mean = values.sum(-1) / n.clamp(min=1)
    return {
        "visible": n,
        "entropy": row_entropy(p),
        "first_key_weight": p.gather(-1, first)[..., 0],
        "max_weight": p.amax(-1),
        "collision": p.square().sum(-1),
        "scaled_max": z.masked_fill(~visible, -math.inf).amax(-1),
        "raw_max": raw.masked_fill(~visible, -math.inf).amax(-1),
        "top_weights": p.topk(top_k, dim=-1).values,
        "logit_sum": values.sum(-1).double(),
        "logit_m2": (values - mean[..., None]).masked_fill(~visible, 0.0).square().sum(-1).double(),
        "tv_uniform": (p - 1.0 / n.clamp(min=1).to(p.dtype)[..., None]).clamp(min=0).sum(-1),
        "nonzero": (p != 0).sum(-1),
    }


def _inputs(dtype, q_len=9, kv_len=9, heads=2, kv_heads=2, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, heads, q_len, dim, generator=generator, dtype=dtype)
    key = torch.randn(2, kv_heads, kv_len, dim, generator=generator, dtype=dtype)
    if kv_heads != heads:  # grouped-query attention: key heads shared out, as `attend` hands them
        key = key.repeat_interleave(heads // kv_heads, dim=1)
    return query, key


def _compare(got, want, dtype, relative=False):
    """Every statistic ``want`` holds, on rows that see a key. ``relative``: within the tolerance times the value's
    size and times |z_max| / 25: fp32 logits of size |z| are rounded by up to 6e-8 |z|, and a weight exp(z - lse)
    inherits the rounding of both z and lse, so the bound allows 4e-7 |z_max| (a few ulps of the logit)."""
    tolerance = TOLERANCE[dtype]
    valid = want["visible"] > 0
    assert torch.equal(got.visible, want["visible"])
    row_scale = (want["scaled_max"].abs() / 25).clamp(min=1.0).double() if relative else None
    for name, expected in want.items():
        value = getattr(got, name, None)
        if value is None or name == "visible":
            continue
        if name == "nonzero":
            assert torch.equal(value[valid], expected[valid]), name
            continue
        error = (value.double() - expected.double()).abs()
        if relative or name.startswith("logit"):
            error = error / expected.double().abs().clamp(min=1.0)
        if relative:
            error = error / (row_scale if error.dim() == row_scale.dim() else row_scale[..., None])
        worst = error[valid].max().item()
        assert worst <= tolerance, f"{name}: {worst:.3g}"


CASES = {  # name: (q_len, kv_len, causal, window, padding, heads, kv_heads)
    "causal": (9, 9, True, None, False, 2, 2),
    "causal_longer_keys": (5, 9, True, None, False, 2, 2),
    "bidirectional_padding": (9, 9, False, None, True, 2, 2),
    "sliding_window": (9, 9, True, 3, False, 2, 2),
    "window_bidirectional_padding": (9, 9, False, 2, True, 2, 2),
    "grouped_query": (9, 9, True, None, True, 4, 2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("temperature", [1.0, 0.3])
@pytest.mark.parametrize("block_keys", [2, None])
@pytest.mark.parametrize("skip_rows", [False, True])
def test_key_block_pass_equals_the_explicit_map(dtype, case, temperature, block_keys, skip_rows):
    """``skip_rows``: each block of keys is scored only for the rows causality and the window let see it, as
    `attend` asks."""
    q_len, kv_len, causal, window, padding, heads, kv_heads = CASES[case]
    query, key = _inputs(dtype, q_len, kv_len, heads, kv_heads)
    visible = _visible(q_len, kv_len, causal, window, padding)
    rows_of = (lambda keys: _rows_reaching(keys, q_len, kv_len, causal, window)) if skip_rows else (lambda keys: ALL)
    got = row_statistics(query, key, scaling=0.4, temperature=temperature, visible_of=lambda keys: visible[..., keys],
                         rows_of=rows_of, top_k=4, block_keys=block_keys)
    _compare(got, _explicit(query, key, 0.4, temperature, visible, 4), dtype)


@pytest.mark.parametrize("block_keys", [3, None])
@pytest.mark.parametrize("needs", [{"top", "tv_uniform", "nonzero"}, {"entropy", "top"}, {"collision"},
                                   {"max_logit", "first_key"}, {"logit_moments", "max_weight"}])
def test_a_statistic_is_the_same_whatever_is_asked_beside_it(needs, block_keys):
    """The key-block pass computes only what it is asked for (and, with one key block, reads the first pass's
    exp(z - m) again for TV and nonzero): each statistic asked alone equals, bit for bit, the one computed with all."""
    q_len, kv_len, causal, window, padding, heads, kv_heads = CASES["grouped_query"]
    query, key = _inputs(torch.float32, q_len, kv_len, heads, kv_heads, seed=4)
    visible = _visible(q_len, kv_len, causal, window, padding)

    def stats(asked):
        return row_statistics(query, key, scaling=0.4, temperature=0.3, visible_of=lambda keys: visible[..., keys],
                              needs=frozenset(asked), top_k=4, block_keys=block_keys)

    some, every = stats(needs), stats(STATISTICS)
    fields = {"top": ["top_weights"], "max_logit": ["scaled_max", "raw_max"], "first_key": ["first_key_weight"],
              "logit_moments": ["logit_count", "logit_sum", "logit_m2"]}
    for name in sorted(needs):
        for field in fields.get(name, [name]):
            assert torch.equal(getattr(some, field), getattr(every, field)), field
    assert torch.equal(some.visible, every.visible)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_entropy_and_first_key_equal_the_explicit_map(dtype, case):
    q_len, kv_len, causal, window, padding, heads, kv_heads = CASES[case]
    query, key = _inputs(dtype, q_len, kv_len, heads, kv_heads, seed=1)
    visible = _visible(q_len, kv_len, causal, window, padding)
    assert fused_logsumexp(query, key, visible, False, 0.4) is not None  # the fused kernel ran, not the fallback
    got = row_statistics(query, key, scaling=0.4, temperature=0.5, visible_of=lambda keys: visible[..., keys],
                         mask=visible, needs=FUSED_ONLY, block_keys=4)
    assert got.max_weight is None  # nothing beyond what the fused way gives: no key-block pass ran
    _compare(got, _explicit(query, key, 0.4, 0.5, visible, 1), dtype)


def test_fused_kernel_with_the_causal_flag_equals_the_mask():
    query, key = _inputs(torch.float64, seed=2)
    visible = _visible(9, 9, True, None, False)
    got = row_statistics(query, key, scaling=0.4, visible_of=lambda keys: visible[..., keys], is_causal=True,
                         needs=FUSED_ONLY)
    _compare(got, _explicit(query, key, 0.4, 1.0, visible, 1), torch.float64)


@pytest.mark.parametrize("needs", [FUSED_ONLY, STATISTICS])
def test_low_temperature_fp32_within_relative_tolerance(needs):
    """At T = 0.01 the logits reach hundreds: against the fp32 explicit map, every statistic agrees within 1e-5
    of its size (the key-block pass shifts by the row maximum); the fused identity lse - sum p s subtracts two
    numbers of the logits' size, so its entropy agrees within 1e-5 of the largest logit, and within 1e-4 absolute
    against the fp64 map."""
    query, key = _inputs(torch.float32, seed=3)
    query = query * 4
    visible = _visible(9, 9, True, None, True)
    got = row_statistics(query, key, scaling=0.4, temperature=0.01, visible_of=lambda keys: visible[..., keys],
                         mask=visible, needs=needs, top_k=3, block_keys=2)
    want = _explicit(query, key, 0.4, 0.01, visible, 3)
    valid = want["visible"] > 0
    largest = want["scaled_max"][valid].abs()
    assert largest.max() > 300
    if needs == FUSED_ONLY:
        assert ((got.entropy - want["entropy"])[valid].abs() / largest).max() <= 1e-5
        exact = _explicit(query.double(), key.double(), 0.4, 0.01, visible, 3)
        assert ((got.entropy.double() - exact["entropy"])[valid].abs() / largest).max() <= 1e-5
        want = {name: want[name] for name in ("visible", "first_key_weight", "scaled_max")}
    _compare(got, want, torch.float32, relative=True)


def test_logit_transform_biases_the_logits():
    query, key = _inputs(torch.float64, seed=4)
    bias = torch.randn(1, 2, 9, 9, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    visible = _visible(9, 9, True, None, False)
    got = row_statistics(query, key, scaling=0.4, temperature=0.7, visible_of=lambda keys: visible[..., keys],
                         logit_transform=lambda raw, rows, keys: raw + bias[..., rows, keys], needs=FUSED_ONLY, block_keys=3)
    assert got.max_weight is None
    _compare(got, _explicit(query, key, 0.4, 0.7, visible, 1, bias=bias), torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("needs", [FUSED_ONLY, STATISTICS])
def test_uniform_rows_closed_forms(dtype, needs):
    """A zeroed query sees equal logits: H = log n, collision = max weight = first-key weight = 1 / n."""
    query, key = _inputs(dtype)
    query = torch.zeros_like(query)
    visible = _visible(9, 9, True, 4, True)
    got = row_statistics(query, key, scaling=0.4, temperature=0.1, visible_of=lambda keys: visible[..., keys],
                         mask=visible, needs=needs, top_k=2, block_keys=3)
    n = visible.expand(2, 2, 9, 9).sum(-1).to(dtype)
    valid = n > 0
    tolerance = TOLERANCE[dtype]
    assert (got.entropy - n.clamp(min=1).log())[valid].abs().max() <= tolerance
    assert (got.first_key_weight - 1 / n)[valid].abs().max() <= tolerance
    if needs == STATISTICS:
        for value in (got.collision, got.max_weight):
            assert (value - 1 / n)[valid].abs().max() <= tolerance
        assert got.tv_uniform[valid].abs().max() <= tolerance
        assert torch.equal(got.nonzero, n.long())


def test_unknown_statistic_named():
    query, key = _inputs(torch.float32)
    with pytest.raises(ValueError, match="unknown row statistics \\['entropie'\\]"):
        row_statistics(query, key, scaling=0.4, needs=frozenset({"entropie"}))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("q_len", [1, 4, 9])
def test_rows_reaching_a_key_block_are_exactly_the_rows_that_see_one_of_its_keys(causal, window, q_len):
    """Brute force over every block of keys: the slice holds exactly the rows with a visible key in the block."""
    kv_len = 9
    visible = _visible(q_len, kv_len, causal and q_len > 1, window, False)[0, 0]
    for start in range(kv_len):
        for stop in range(start + 1, kv_len + 1):
            rows = _rows_reaching(slice(start, stop), q_len, kv_len, causal and q_len > 1, window)
            want = [i for i in range(q_len) if visible[i, start:stop].any()]
            assert list(range(q_len)[rows]) == want, (start, stop)
