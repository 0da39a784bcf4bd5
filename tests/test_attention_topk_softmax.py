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
