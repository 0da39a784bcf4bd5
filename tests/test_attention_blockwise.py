"""The blockwise explicit path of `attend` (study.attention.blockwise) against the dense path and a row-by-row
brute force, on every normaliser and every logit transform, with uneven blocks of query rows."""

from __future__ import annotations

import pytest
import torch

from study.attention import AttentionSpec, attend, blockwise, blockwise_settings, normalizer_class, tapping
from study.attention.normalizers import masked_softmax

B, H, HKV, LQ, LK, D = 2, 4, 2, 7, 9, 5
ROWS_PER_BLOCK = 3  # 7 query rows: blocks of 3, 3 and 1

SPECS = {
    "softmax_top3": AttentionSpec(top_k=3),
    "sparsemax": AttentionSpec(normalizer="sparsemax", temperature=0.5),
    "sparsemax_top4": AttentionSpec(normalizer="sparsemax", top_k=4, temperature=0.3),
    "entmax15": AttentionSpec(normalizer="entmax15", temperature=0.7),
    "entmax_bisect_learnable": AttentionSpec(normalizer="entmax", alpha=1.3, learnable=True),
    "ssmax": AttentionSpec(normalizer="ssmax"),
    "ssmax_top2": AttentionSpec(normalizer="ssmax", top_k=2),
    "self_adjust": AttentionSpec(normalizer="self_adjust"),
    "self_adjust_plain_top3": AttentionSpec(normalizer="self_adjust", self_adjust_variant="plain", top_k=3),
}
STOCK_AT_HALF = AttentionSpec(temperature=0.5)  # explicit only with a transform (soft-capping) or a tap


def _inputs(seed: int = 0, lq: int = LQ, lk: int = LK):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=g, requires_grad=True)
    k = torch.randn(B, HKV, lk, D, generator=g, requires_grad=True)
    v = torch.randn(B, HKV, lk, D, generator=g, requires_grad=True)
    return q, k, v


def _normalizer(spec: AttentionSpec):
    normalizer = normalizer_class(spec.normalizer).from_spec(spec, num_heads=H)
    with torch.no_grad():  # distinct per-head parameters, so a head mix-up shows
        for p in normalizer.parameters():
            p.add_(torch.linspace(0.0, 0.3, p.numel()))
    return normalizer


def _row_visible(i: int, lq: int, lk: int, *, causal: bool, window: int | None, mask: torch.Tensor | None):
    """(B, 1, lk) visible keys of query row i, by a loop over positions (queries aligned to the end)."""
    position = i + lk - lq
    out = torch.zeros(B, 1, lk, dtype=torch.bool)
    for b in range(B):
        for j in range(lk):
            ok = (j <= position) if causal else True
            if window is not None:
                ok = ok and (position - j < window if causal else abs(position - j) < window)
            if mask is not None:
                ok = ok and bool(mask.expand(B, 1, LQ, LK)[b, 0, i, j])
            out[b, 0, j] = ok
    return out


def brute_force(q, k, v, spec, normalizer, *, causal=True, window=None, mask=None, bias=None, softcap=None,
                sinks=None):
    """Row by row: each query row's scores, visible keys, top-k picks and weights formed on their own."""
    groups = H // HKV
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scaling = D ** -0.5
    lq, lk = q.shape[-2], k.shape[-2]
    rows = []
    for i in range(lq):
        scores = torch.einsum("bhd,bhkd->bhk", q[:, :, i], k) * scaling
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if bias is not None:
            scores = scores + bias.expand(B, H, lq, lk)[:, :, i]
        scores = (scores / spec.temperature)[:, :, None, :]  # (B, H, 1, LK): one row per normaliser call
        visible = _row_visible(i, lq, lk, causal=causal, window=window, mask=mask)[:, :, None, :]
        visible = visible.expand(B, H, 1, lk)
        selected = visible.clone()
        if spec.top_k is not None:
            for b in range(B):
                for h in range(H):
                    keys = [j for j in range(lk) if visible[b, h, 0, j]]
                    keys.sort(key=lambda j: (-scores[b, h, 0, j].item(), j))  # ties: the lowest position
                    selected[b, h, 0] = False
                    selected[b, h, 0, keys[: spec.top_k]] = True
        if sinks is not None:
            sink = (sinks / spec.temperature).view(1, H, 1, 1).expand(B, H, 1, 1)
            full = torch.cat([scores.masked_fill(~selected, -torch.inf), sink], dim=-1).softmax(-1)
            weights = full[..., :-1]
        elif spec.normalizer == "softmax":
            weights = masked_softmax(scores, selected)
        else:
            weights = normalizer(scores, selected, visible=visible)
        rows.append(torch.einsum("bhk,bhkd->bhd", weights[:, :, 0], v))
    return torch.stack(rows, dim=2)


def _padding_mask():
    mask = torch.ones(B, 1, 1, LK, dtype=torch.bool)
    mask[1, :, :, :3] = False  # sample 1: the first three keys are padding
    return mask


def _alibi_float_mask():
    """A float mask: ALiBi-like biases on visible keys, the dtype's minimum on one masked key per sample."""
    distance = (torch.arange(LQ)[:, None] + LK - LQ - torch.arange(LK)).abs().float()
    mask = (-0.3 * distance).expand(B, 1, LQ, LK).clone()
    mask[0, :, :, 1] = torch.finfo(torch.float32).min
    mask[1, :, :, 4] = torch.finfo(torch.float32).min
    return mask


CASES = {
    "causal": {},
    "bidirectional": {"causal": False},
    "padding": {"mask": "padding"},
    "float_mask_with_bias": {"mask": "alibi"},
    "window_causal": {"sliding_window": 3},
    "window_bidirectional": {"sliding_window": 2, "causal": False},
    "softcap": {"softcap": 1.5},
    "logit_bias": {"logit_bias": "t5"},
}


def _case_kwargs(case: str):
    kwargs = dict(CASES[case])
    if kwargs.get("mask") == "padding":
        kwargs["mask"] = _padding_mask()
    elif kwargs.get("mask") == "alibi":
        kwargs["mask"] = _alibi_float_mask()
    if kwargs.get("logit_bias") == "t5":
        kwargs["logit_bias"] = torch.randn(1, H, LQ, LK, generator=torch.Generator().manual_seed(5))
    return kwargs


def _brute_kwargs(kwargs):
    out = {"causal": kwargs.get("causal", True), "window": kwargs.get("sliding_window"),
           "softcap": kwargs.get("softcap"), "sinks": kwargs.get("sinks")}
    mask, bias = kwargs.get("mask"), kwargs.get("logit_bias")
    if mask is not None and mask.dtype != torch.bool:
        keep = mask > torch.finfo(mask.dtype).min / 2
        bias = mask.masked_fill(~keep, 0.0) if bias is None else bias + mask.masked_fill(~keep, 0.0)
        mask = keep
    out["mask"], out["bias"] = mask, bias
    return out


class _RowBlockTap:
    """An open tap that takes blocks of rows: top-k softmax, which takes the gathered path without taps
    (`study.attention.topk`), keeps its explicit blockwise path under it; the function is the same."""

    row_blocks = True

    def observe(self, layer, weights, allowed, spec) -> None:
        pass


def _blockwise(fn, lk: int = LK):
    """Run ``fn`` with the blockwise path forced at ROWS_PER_BLOCK rows a block; fail if it did not run."""
    calls = []
    original = blockwise.attend_in_blocks

    def spy(rows_output, q_len, rows_per_block):
        calls.append(rows_per_block)
        return original(rows_output, q_len, rows_per_block)

    blockwise.attend_in_blocks = spy
    try:
        with blockwise_settings(min_scores=0, block_scores=B * H * lk * ROWS_PER_BLOCK), tapping(_RowBlockTap()):
            out = fn()
    finally:
        blockwise.attend_in_blocks = original
    assert calls == [ROWS_PER_BLOCK], "the blockwise path did not run"
    return out


def _values_and_grads(fn, tensors):
    out = fn()
    weights = torch.linspace(-1.0, 1.0, out.numel()).view_as(out)  # a loss that weighs every output differently
    grads = torch.autograd.grad((out * weights).sum(), tensors)
    return out.detach(), grads


def _check(spec_name: str, case: str, extra: dict | None = None, lq: int = LQ, lk: int = LK):
    spec = SPECS[spec_name] if spec_name in SPECS else STOCK_AT_HALF
    q, k, v = _inputs(0, lq, lk)
    normalizer = _normalizer(spec)
    kwargs = {**_case_kwargs(case), **(extra or {})}
    tensors = [q, k, v, *normalizer.parameters(), *(t for t in kwargs.values()
                                                     if isinstance(t, torch.Tensor) and t.requires_grad)]

    def call():
        return attend(q, k, v, spec, normalizer=normalizer, **kwargs)

    with blockwise_settings(min_scores=2**62):
        dense = _values_and_grads(call, tensors)
    blocks = _blockwise(lambda: _values_and_grads(call, tensors), lk)
    brute = _values_and_grads(lambda: brute_force(q, k, v, spec, normalizer, **_brute_kwargs(kwargs)), tensors)
    for name, (value, reference) in {"dense": (blocks, dense), "brute force": (blocks, brute)}.items():
        torch.testing.assert_close(value[0], reference[0], atol=1e-5, rtol=1e-5, msg=f"output vs {name}")
        for i, (g, ref) in enumerate(zip(value[1], reference[1])):
            torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-5, msg=f"gradient {i} vs {name}")


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("case", ["causal", "padding", "window_causal"])
def test_every_normalizer_equals_dense_and_brute_force(spec_name, case):
    _check(spec_name, case)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("spec_name", ["softmax_top3", "sparsemax", "entmax_bisect_learnable"])
def test_every_transform_equals_dense_and_brute_force(spec_name, case):
    _check(spec_name, case)


@pytest.mark.parametrize(("spec_name", "case"), [("softmax_top3", "causal"), ("stock_at_half", "softcap"),
                                                  ("softmax_top3", "padding")])
def test_sinks_equal_dense_and_brute_force(spec_name, case):
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    _check(spec_name, case, {"sinks": sinks})


@pytest.mark.parametrize(("lq", "lk"), [(LK, LK), (4, LK), (LQ, LK + 6)])
@pytest.mark.parametrize("case", ["causal", "window_causal", "window_bidirectional"])
def test_query_and_key_lengths(lq, lk, case):
    """Square (training), a few queries (decoding) and a long cache: the key range each block reaches is exact."""
    _check("sparsemax_top4", case, lq=lq, lk=lk)
    _check("self_adjust", case, lq=lq, lk=lk)


def _shift_rows(original):
    def shifted(q_len, kv_len, device, rows=slice(None), keys=slice(None)):
        if rows != slice(None) and rows.start:
            rows = slice(rows.start - 1, rows.stop - 1)
        return original(q_len, kv_len, device, rows, keys)

    return shifted


def _one_key_short(original):
    def short(rows, q_len, kv_len, causal, window):
        keys = original(rows, q_len, kv_len, causal, window)
        return keys if keys == slice(None) or keys.stop - keys.start < 2 else slice(keys.start, keys.stop - 1)

    return short


@pytest.mark.parametrize(("name", "wrong"), [("causal_allowed", _shift_rows), ("_reachable_keys", _one_key_short)])
def test_a_wrong_block_boundary_is_caught(monkeypatch, name, wrong):
    """The checks above can fail: each block's causal rows shifted by one, or one key short of its range."""
    from study.attention import core

    monkeypatch.setattr(core, name, wrong(getattr(core, name)))
    with pytest.raises(AssertionError):
        _check("sparsemax", "causal")


def test_dropout_mask_is_recomputed_identically_in_the_backward():
    """With the identity as values the output is the dropped weight matrix W, and d(sum(out * G))/dv = W^T G:
    equal only if the backward's recomputation drew the same dropout mask as the forward."""
    spec = AttentionSpec(normalizer="sparsemax", temperature=2.0)
    q = torch.randn(1, 2, LK, D, generator=torch.Generator().manual_seed(1))
    k = torch.randn(1, 2, LK, D, generator=torch.Generator().manual_seed(2))
    v = torch.eye(LK).expand(1, 2, LK, LK).clone().requires_grad_(True)
    torch.manual_seed(0)
    with blockwise_settings(min_scores=0, block_scores=2 * LK * 2):
        out = attend(q, k, v, spec, dropout=0.5)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (grad_v,) = torch.autograd.grad((out * g).sum(), v)
    assert (out == 0).any() and (out > 1).any()  # dropout did zero and rescale entries
    torch.testing.assert_close(grad_v, out.detach().transpose(-1, -2) @ g)


class _RowSums:
    """A tap that sums rows: takes blocks of query rows."""

    row_blocks = True

    def __init__(self):
        self.calls = []

    def observe(self, layer, weights, allowed, spec):
        self.calls.append((layer, weights.shape[-2], weights.sum().item(), allowed.expand_as(weights).sum().item(),
                           weights.amax(-1).sum().item()))


class _WholeMaps(_RowSums):
    row_blocks = False


def test_taps_get_each_block_once_with_one_layer_number_and_sums_equal_the_dense_map():
    spec = SPECS["sparsemax"]
    q, k, v = _inputs()
    dense_tap, block_tap, whole_tap = _RowSums(), _RowSums(), _RowSums()
    with blockwise_settings(min_scores=2**62), tapping(dense_tap):
        attend(q, k, v, spec).sum().backward()
    with tapping(block_tap):
        for _ in range(2):  # two unnamed calls: layers 0 and 1
            _blockwise(lambda: attend(q, k, v, spec)).sum().backward()  # the backward recomputes, never re-taps
    assert [c[:2] for c in block_tap.calls] == [(0, 3), (0, 3), (0, 1), (1, 3), (1, 3), (1, 1)]
    for position in (2, 3, 4):
        assert sum(c[position] for c in block_tap.calls[:3]) == pytest.approx(dense_tap.calls[0][position], abs=1e-4)
    # A tap without the flag keeps the dense path: one full map per call.
    with blockwise_settings(min_scores=0, block_scores=1), tapping(whole_tap, _WholeMaps()):
        attend(q, k, v, spec, layer=5)
    assert [c[:2] for c in whole_tap.calls] == [(5, LQ)]


def test_default_settings_keep_small_calls_dense_and_send_long_smollm2_calls_blockwise():
    assert blockwise.block_rows(B * H, LQ, LK) is None
    assert blockwise.block_rows(1 * 9, 4096, 4096) is not None
    rows = blockwise.block_rows(1 * 9, 8192, 8192)
    assert 1 <= rows < 8192 and rows * 9 * 8192 <= blockwise.BlockwiseSettings().block_scores


@pytest.mark.parametrize(("kwargs", "named"), [({"min_scores": -1}, "min_scores"), ({"block_scores": 0}, "block_scores"),
                                               ({"block_scores": 2.5}, "2.5"), ({"min_scores": True}, "True")])
def test_bad_settings_fail_naming_the_value(kwargs, named):
    with pytest.raises(ValueError, match=named), blockwise_settings(**kwargs):
        pass


def test_without_gradients_the_blocks_run_straight_and_equal_the_dense_path():
    """Without gradients the blocks run straight (no checkpoint) and give the same output."""
    spec = SPECS["entmax15"]
    q, k, v = _inputs()
    with torch.no_grad(), blockwise_settings(min_scores=2**62):
        dense = attend(q, k, v, spec)
    with torch.no_grad():
        blocks = _blockwise(lambda: attend(q, k, v, spec))
    torch.testing.assert_close(blocks, dense, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("spec_name", ["sparsemax_top4", "self_adjust", "ssmax"])
def test_monitor_sums_over_blocks_equal_the_dense_sums(spec_name):
    """The entropy and selection monitors, fed block by block, sum to what they sum on the whole map."""
    from study.callbacks import AttentionEntropyMonitor, SelectionUniformityMonitor

    spec = SPECS[spec_name]
    q, k, v = _inputs(3, LK, LK)
    sums = []
    for run in (lambda f: f(), _blockwise):
        monitors = [AttentionEntropyMonitor(), SelectionUniformityMonitor(selection_ks=(1, 4, 16))]
        for monitor in monitors:
            monitor._phase = "train"  # as on a logging step
        with tapping(*monitors):
            run(lambda: attend(q, k, v, spec, mask=_padding_mask(), layer=2)).sum().backward()
        sums.append([monitor._sums["train"][2] for monitor in monitors])
    for dense, blocks in zip(*sums):
        assert dense.keys() == blocks.keys()
        for key in dense:
            torch.testing.assert_close(blocks[key], dense[key], atol=1e-6, rtol=1e-6, msg=key)


class _FusedRowSums(_RowSums):
    fused_output = True  # reads what it is handed: the call's output may stay the fused kernel's


@pytest.mark.parametrize("blocks", [False, True])
def test_a_monitor_tap_keeps_the_fused_output_and_gradients_and_sees_the_explicit_weights(blocks, monkeypatch):
    """With only ``fused_output`` taps open, a stock-softmax call trains exactly as untapped (output and gradients
    bitwise the fused kernel's), and the taps see the same weights (and block sums) as on the explicit path."""
    from study.attention import core

    fused_calls = []
    original = core._fused
    monkeypatch.setattr(core, "_fused", lambda *a, **kw: fused_calls.append(1) or original(*a, **kw))
    spec = AttentionSpec(temperature=0.3)
    limits = {"min_scores": 0, "block_scores": ROWS_PER_BLOCK * B * H * LK} if blocks else {"min_scores": 2**62}
    results = {}
    for name, tap in (("untapped", None), ("fused", _FusedRowSums()), ("explicit", _RowSums())):
        q, k, v = _inputs()
        with blockwise_settings(**limits), tapping(*([tap] if tap else [])):
            out = attend(q, k, v, spec, mask=_padding_mask(), layer=3)
            out.sum().backward()
        results[name] = (out.detach(), q.grad, k.grad, v.grad, tap)
        assert len(fused_calls) == (0 if name == "explicit" else 1), name
        fused_calls.clear()
    for untapped, fused in zip(results["untapped"][:4], results["fused"][:4]):
        assert torch.equal(untapped, fused)
    seen_fused, seen_explicit = results["fused"][4].calls, results["explicit"][4].calls
    assert [c[:2] for c in seen_fused] == ([(3, 3), (3, 3), (3, 1)] if blocks else [(3, LQ)])
    for position in (2, 3, 4):  # weight sum, allowed count, sum of row maxima: the explicit path's
        assert sum(c[position] for c in seen_fused) == pytest.approx(sum(c[position] for c in seen_explicit), abs=1e-5)
    # The explicit path's output is the same attention up to fp32 rounding.
    torch.testing.assert_close(results["explicit"][0], results["untapped"][0], atol=1e-5, rtol=1e-5)


def test_a_tap_without_the_flag_keeps_the_explicit_path_differentiable_twice():
    """The probe's Hessian differentiates through the weights twice: the fused CPU kernel cannot, so any open tap
    without ``fused_output`` sends the whole call through the explicit path."""
    spec = AttentionSpec(temperature=0.5)
    q, k, v = _inputs()
    with tapping(_FusedRowSums(), _RowSums()):
        out = attend(q, k, v, spec)
        (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
        grad_q.sum().backward()  # a second derivative: fails on the fused kernel's backward
    assert k.grad is not None and torch.isfinite(k.grad).all()
