"""`attend` against brute-force references: fast and explicit paths, top-k, masks, GQA, low temperature."""

import math

import pytest
import torch

from study.attention import AttentionSpec, attend, causal_allowed, tapping


class WeightsTap:
    """Keeps the weights each attention call reports (tests only; monitors reduce them instead)."""

    def __init__(self):
        self.weights, self.allowed = {}, {}

    def observe(self, layer, weights, allowed, spec):
        self.weights[layer], self.allowed[layer] = weights, allowed


def reference(q, k, v, temperature=1.0, top_k=None, allowed=None):
    """Row-by-row softmax attention in float64: the brute-force oracle."""
    B, H, Lq, D = q.shape
    Lk = k.shape[-2]
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(B, H, Lq, Lk, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                visible = [j for j in range(Lk) if j <= i + Lk - Lq and (allowed is None or allowed[b, 0, i, j])]
                if not visible:
                    continue
                s = torch.stack([q[b, h, i].double() @ k[b, h, j].double() for j in visible]) / math.sqrt(D)
                s = s / temperature
                if top_k is not None and top_k < len(visible):
                    keep = s.topk(top_k).indices
                    s = s[keep]
                    visible = [visible[j] for j in keep.tolist()]
                a = s.softmax(0)
                weights[b, h, i, visible] = a
                out[b, h, i] = (a[:, None] * v[b, h, visible].double()).sum(0)
    return out, weights


@pytest.fixture
def qkv():
    torch.manual_seed(0)
    return torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
def test_fast_path_matches_reference(qkv, temperature):
    q, k, v = qkv
    out = attend(q, k, v, AttentionSpec(temperature=temperature))
    expected, _ = reference(q, k, v, temperature)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.25])
def test_temperature_folded_into_sdpa_equals_explicit_path(qkv, temperature):
    q, k, v = qkv
    spec = AttentionSpec(temperature=temperature)
    fast = attend(q, k, v, spec)
    with tapping(WeightsTap()):  # an open tap forces the explicit path
        explicit = attend(q, k, v, spec)
    torch.testing.assert_close(fast, explicit, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_top_k_matches_reference(qkv, top_k):
    q, k, v = qkv
    tap = WeightsTap()
    with tapping(tap):
        out = attend(q, k, v, AttentionSpec(top_k=top_k, temperature=0.7), layer=0)
    expected, expected_weights = reference(q, k, v, 0.7, top_k)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tap.weights[0].double(), expected_weights, atol=1e-6, rtol=1e-5)
    # Exactly min(k, visible) keys per row carry weight.
    visible = torch.arange(1, 8).clamp(max=top_k)
    assert torch.equal((tap.weights[0] > 0).sum(-1), visible.expand(2, 3, 7))


def test_top_k_at_least_length_equals_softmax(qkv):
    q, k, v = qkv
    torch.testing.assert_close(attend(q, k, v, AttentionSpec(top_k=7)), attend(q, k, v, AttentionSpec()), atol=1e-6, rtol=0)
    torch.testing.assert_close(attend(q, k, v, AttentionSpec(top_k=100)), attend(q, k, v, AttentionSpec()), atol=1e-6, rtol=0)


def test_top_1_rows_are_one_hot_at_the_argmax(qkv):
    q, k, v = qkv
    tap = WeightsTap()
    with tapping(tap):
        attend(q, k, v, AttentionSpec(top_k=1), layer=0)
    w = tap.weights[0]
    assert torch.equal(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert torch.equal((w == 1).sum(-1), torch.ones_like(w.sum(-1), dtype=torch.long))
    scores = (q @ k.transpose(-1, -2)).masked_fill(~causal_allowed(7, 7, q.device), -torch.inf)
    assert torch.equal(w.argmax(-1), scores.argmax(-1))


@pytest.mark.parametrize("spec", [AttentionSpec(), AttentionSpec(top_k=2), AttentionSpec(temperature=0.01)])
def test_no_weight_above_the_diagonal(qkv, spec):
    q, k, v = qkv
    tap = WeightsTap()
    with tapping(tap):
        attend(q, k, v, spec, layer=0)
    assert tap.weights[0].triu(diagonal=1).abs().max() == 0


@pytest.mark.parametrize("spec", [AttentionSpec(), AttentionSpec(top_k=2, temperature=0.1)])
def test_future_keys_never_change_past_outputs(qkv, spec):
    q, k, v = qkv
    out = attend(q, k, v, spec)
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 5 * torch.randn_like(k2[..., 4:, :])
    v2[..., 4:, :] += 5 * torch.randn_like(v2[..., 4:, :])
    out2 = attend(q, k2, v2, spec)
    torch.testing.assert_close(out[..., :4, :], out2[..., :4, :], atol=0, rtol=0)


def test_kv_longer_than_queries_aligns_causality_to_the_end():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    expected, _ = reference(q, k, v)
    for spec in (AttentionSpec(), AttentionSpec(top_k=6)):
        torch.testing.assert_close(attend(q, k, v, spec).double(), expected, atol=1e-5, rtol=1e-5)


def test_padding_mask_and_fully_masked_rows_give_zeros_not_nan(qkv):
    q, k, v = qkv
    allowed = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    allowed[0, :, :, :3] = False  # left padding: queries 0..2 of sample 0 see nothing
    for spec in (AttentionSpec(), AttentionSpec(top_k=2), AttentionSpec(temperature=0.01)):
        out = attend(q, k, v, spec, mask=allowed)
        assert out.isfinite().all()
        assert out[0, :, :3].abs().max() == 0  # queries that see no key attend to nothing, on both paths
        expected, _ = reference(q, k, v, spec.temperature, spec.top_k, allowed)
        torch.testing.assert_close(out[:, :, 3:].double(), expected[:, :, 3:], atol=1e-5, rtol=1e-5)


def test_grouped_query_attention_shares_key_heads():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    expected, _ = reference(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    for spec in (AttentionSpec(), AttentionSpec(top_k=5)):
        torch.testing.assert_close(attend(q, k, v, spec).double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("top_k", [None, 3])
def test_low_temperature_gradients_stay_finite(qkv, autocast, top_k):
    q, k, v = (t.clone().requires_grad_() for t in qkv)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = attend(q, k, v, AttentionSpec(temperature=0.01, top_k=top_k), mask=torch.ones(1, 1, 7, 7, dtype=torch.bool))
    out.float().square().sum().backward()
    assert out.isfinite().all()
    assert all(t.grad.isfinite().all() for t in (q, k, v))


def test_non_causal_attention(qkv):
    q, k, v = qkv
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1) @ v
    torch.testing.assert_close(attend(q, k, v, AttentionSpec(), causal=False), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attend(q, k, v, AttentionSpec(top_k=7), causal=False), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_core_imports_without_transformers_and_loads_it_on_demand():
    """`import study.attention` is pure torch; the transformers registration loads when its names are used."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "import study.attention as a\n"
        "assert 'transformers' not in sys.modules, 'transformers imported by study.attention'\n"
        "q = torch.randn(1, 2, 4, 8)\n"
        "a.attend(q, q, q, a.AttentionSpec(normalizer='sparsemax', top_k=2))\n"
        "assert 'transformers' not in sys.modules\n"
        "from study.attention import apply_attention_spec\n"
        "assert 'transformers' in sys.modules and apply_attention_spec.__module__ == 'study.attention.hf'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _reference(q, k, v, temperature, *, softcap=None, bias=None, sinks=None, top_k=None, window=None):
    """Brute force, one row at a time, in float64: the documented order (model's logit first, then 1/T)."""
    B, H, L, _ = q.shape
    out = torch.zeros(B, H, L, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                keys = [j for j in range(i + 1) if window is None or i - j < window]
                logit = torch.stack([(q[b, h, i] @ k[b, h, j]).double() * q.shape[-1] ** -0.5 for j in keys])
                if softcap is not None:
                    logit = softcap * torch.tanh(logit / softcap)
                if bias is not None:
                    logit = logit + bias[0, h, i, keys].double()
                z = logit / temperature
                if top_k is not None and top_k < len(keys):
                    keep = sorted(range(len(keys)), key=lambda n: (-z[n].item(), n))[:top_k]
                    keys, z = [keys[n] for n in sorted(keep)], z[sorted(keep)]
                if sinks is not None:
                    z = torch.cat([z, sinks[h : h + 1].double() / temperature])
                w = z.softmax(-1)[: len(keys)]
                out[b, h, i] = w @ v[b, h, keys].double()
    return out


@pytest.mark.parametrize("top_k", [None, 2])
@pytest.mark.parametrize("tapped", [False, True], ids=["fast", "explicit"])
def test_model_logit_transforms_then_temperature_against_brute_force(top_k, tapped):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8) * 2 for _ in range(3))
    bias, sinks = torch.randn(1, 3, 6, 6), torch.randn(3)
    spec = AttentionSpec(temperature=0.7, top_k=top_k)
    kwargs = dict(softcap=None if top_k is None and not tapped else 1.5, logit_bias=bias, sinks=sinks, sliding_window=4)

    class Null:
        def observe(self, *args):
            pass

    if tapped:
        with tapping(Null()):
            got = attend(q, k, v, spec, **kwargs)
    else:
        got = attend(q, k, v, spec, **kwargs)
    want = _reference(q, k, v, 0.7, softcap=kwargs["softcap"], bias=bias, sinks=sinks, top_k=top_k, window=4)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


def test_sinks_with_another_normaliser_are_refused_by_name():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"sinks \(s_aux\).*'sparsemax'"):
        attend(q, q, q, AttentionSpec(normalizer="sparsemax"), sinks=torch.zeros(2))


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(softcap=0.0), "softcap must be > 0, got 0.0"),
        (dict(sliding_window=0), "sliding_window must be an integer >= 1, got 0"),
        (dict(sliding_window=2.5), "sliding_window must be an integer >= 1, got 2.5"),
        (dict(sinks=torch.zeros(3)), r"shape \(2,\), got \(3,\)"),
    ],
)
def test_bad_transform_arguments_fail_naming_the_value(kwargs, named):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=named):
        attend(q, q, q, AttentionSpec(), **kwargs)
