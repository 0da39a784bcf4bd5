"""The softmax top-k shortcut in `attend` equals Softmax over `top_k_allowed` (values and gradients)."""

import pytest
import torch

from study.attention.core import _top_k_softmax, causal_allowed
from study.attention.normalizers import Softmax, top_k_allowed


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("padded", [False, True])
def test_top_k_softmax_matches_generic_path(k, padded):
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    allowed = causal_allowed(6, 6, scores.device)[None, None]
    if padded:  # batch 1: first two positions padded, so rows 0 and 1 see no key at all
        pad = torch.ones(2, 1, 1, 6, dtype=torch.bool)
        pad[1, ..., :2] = False
        allowed = allowed & pad & pad.transpose(-1, -2)
    a, b = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    fast = _top_k_softmax(a, allowed, k)
    generic = Softmax()(b, top_k_allowed(b, allowed, k), visible=allowed)
    torch.testing.assert_close(fast, generic, atol=1e-12, rtol=0)
    assert not fast.isnan().any()
    grad = torch.randn_like(fast)
    (fast * grad).sum().backward()
    (generic * grad).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-12, rtol=0)


def test_exact_ties_pick_the_lowest_positions_on_both_top_k_paths():
    """The documented tie rule (lowest position wins): `torch.topk(sorted=False)` alone picked keys 3 and 5 of
    the tied keys 1, 2, 3, 5."""
    scores = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 1.0]).repeat(1, 2, 3, 1)  # (1, 2, 3, 8)
    allowed = torch.ones(1, 1, 3, 8, dtype=torch.bool)
    expected = torch.zeros(8, dtype=torch.bool)
    expected[[1, 2]] = True
    assert (top_k_allowed(scores, allowed, 2) == expected).all()
    assert ((_top_k_softmax(scores, allowed, 2) > 0) == expected).all()


def test_zeroed_queries_with_top_k_attend_to_the_first_k_visible_keys():
    """All scores tie: both paths of `attend` (softmax shortcut, generic normaliser) keep keys 0..k-1."""
    from study.attention import AttentionSpec, attend

    q = torch.zeros(1, 2, 6, 4)
    k = torch.randn(1, 2, 6, 4)
    v = torch.eye(6).expand(1, 2, 6, 6)  # output row = the weights
    for spec in (AttentionSpec(top_k=3), AttentionSpec(top_k=3, normalizer="sparsemax")):
        out = attend(q, k, v, spec, causal=False)
        torch.testing.assert_close(out, torch.tensor([1 / 3] * 3 + [0.0] * 3).expand(1, 2, 6, 6))


def test_analyses_rank_ties_by_position_like_attention():
    from study.attention import top_k_indices
    from study.frozen.analysis.rows import top_ranks

    a = torch.tensor([[0.25, 0.1, 0.25, 0.25, 0.15, 0.0], [0.2] * 5 + [0.0]])
    visible = torch.tensor([[True] * 6, [True] * 5 + [False]])
    top, _ = top_ranks(a, visible, 3)
    assert top.tolist() == [[0, 2, 3], [0, 1, 2]]
    assert top_k_indices(a, 3, visible).tolist() == top.tolist()
    assert top_k_indices(a.double(), 3, visible).tolist() == top.tolist()  # the stable-sort path agrees
