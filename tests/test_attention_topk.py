"""Top-k by selection, then gather (`study.attention.topk`): the explicit path's outputs and gradients, its picks
among ties, across key blocks."""

import pytest
import torch

from study.attention import AttentionSpec, attend, blockwise_settings, tapping
from study.attention.core import causal_allowed
from study.attention.registry import MASK_VALUE
from study.attention.select import top_k_indices
from study.attention.topk import select_top_k

# fp32: the gathered path sums k terms where the explicit one sums Lk (zeros included) and scatters the key and
# value gradients where it multiplies matrices: the two orders differ by up to ~1.7e-6 of a value's size here.
TOLERANCE = {torch.float32: 2e-6, torch.float64: 1e-12}


class ExplicitPath:
    """An open tap that reads weights: `attend` then takes its explicit path (the reference)."""

    def observe(self, layer, weights, allowed, spec) -> None:
        pass


def _inputs(dtype, heads=4, kv_heads=2, q_len=10, kv_len=10, dim=8, seed=0, ties=False):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, heads, q_len, dim, generator=generator, dtype=dtype)
    key = torch.randn(2, kv_heads, kv_len, dim, generator=generator, dtype=dtype)
    value = torch.randn(2, kv_heads, kv_len, dim, generator=generator, dtype=dtype)
    if ties:  # every other key repeats its predecessor and one query is zero: exact ties in every row
        key[..., 1::2, :] = key[..., 0::2, :][..., : key[..., 1::2, :].shape[-2], :]
        query[:, :, 3] = 0.0
    return query, key, value


def _padding_mask(kv_len):
    mask = torch.ones(2, 1, 1, kv_len, dtype=torch.bool)
    mask[1, ..., :3] = False  # the second sequence is left-padded
    return mask


CASES = {  # name: attend keyword arguments
    "causal": {},
    "causal_longer_keys": {"q_len": 6},
    "padding_bidirectional": {"causal": False, "mask": "padding"},
    "padding_causal": {"mask": "padding"},
    "sliding_window": {"sliding_window": 3},
    "softcap_and_bias": {"softcap": 2.0, "logit_bias": True},
    "float_mask_alibi": {"mask": "alibi"},
}


def _call(case, dtype, ties, explicit, block_scores):
    options = dict(CASES[case])
    q_len = options.pop("q_len", 10)
    query, key, value = _inputs(dtype, q_len=q_len, ties=ties)
    mask = options.pop("mask", None)
    if mask == "padding":
        mask = _padding_mask(10)
    elif mask == "alibi":  # a float mask: 0 / min on padding plus a per-key bias
        slope = torch.linspace(-1, 0, 10, dtype=dtype).view(1, 1, 1, 10)
        mask = slope.masked_fill(~_padding_mask(10), torch.finfo(dtype).min)
    if options.pop("logit_bias", False):
        options["logit_bias"] = torch.randn(1, 4, q_len, 10, dtype=dtype,
                                            generator=torch.Generator().manual_seed(7)).requires_grad_()
    leaves = [t.requires_grad_() for t in (query, key, value)]
    leaves += [options["logit_bias"]] if "logit_bias" in options else []
    spec = AttentionSpec(temperature=0.5, top_k=3)
    with blockwise_settings(block_scores=block_scores, min_scores=2**62), tapping(*([ExplicitPath()] if explicit else [])):
        output = attend(query, key, value, spec, mask=mask, **options)
    output.backward(torch.randn(output.shape, dtype=dtype, generator=torch.Generator().manual_seed(3)))
    return output.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("ties", [False, True])
def test_outputs_and_gradients_equal_the_explicit_path(dtype, case, ties):
    block_scores = 2 * 4 * 10 * 3  # 3 keys a block: the running top-k merges across blocks
    got, got_grads = _call(case, dtype, ties, explicit=False, block_scores=block_scores)
    want, want_grads = _call(case, dtype, ties, explicit=True, block_scores=block_scores)
    tolerance = TOLERANCE[dtype]  # relative to each entry's size where it exceeds 1 (gradients reach ~10)
    for got_value, want_value in zip([got, *got_grads], [want, *want_grads]):
        assert ((got_value - want_value).abs() / want_value.abs().clamp(min=1.0)).max() <= tolerance


@pytest.mark.parametrize("block_keys", [1, 2, 3, 10])
def test_selection_over_key_blocks_breaks_ties_like_top_k_indices(block_keys):
    """Rows of equal logits and rows that see fewer than k keys: the picks are `top_k_indices`'s on the whole row."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (2, 2, 10, 10), generator=generator).float()  # many exact ties
    visible = causal_allowed(10, 10, scores.device) & _padding_mask(10)

    def logits_of(query, key_block, keys):
        return scores[..., keys]

    picks = select_top_k(torch.zeros(2, 2, 10, 1), torch.zeros(2, 2, 10, 1), 4, logits_of,
                         lambda keys: visible[..., keys], block_keys=block_keys)
    assert torch.equal(picks, top_k_indices(scores.masked_fill(~visible, MASK_VALUE), 4))


def test_zeroed_queries_attend_to_the_first_k_visible_keys():
    query, key, value = _inputs(torch.float64)
    query = torch.zeros_like(query)
    output = attend(query, key, value, AttentionSpec(top_k=3))
    shared = value.repeat_interleave(2, dim=1)
    for row in range(10):
        first = shared[..., : min(row + 1, 3), :].mean(-2)
        assert torch.allclose(output[..., row, :], first, atol=1e-12)


def test_the_backward_pass_holds_no_square_tensor():
    """Every tensor autograd saves is O(L k D): none has an Lq x Lk shape."""
    query, key, value = _inputs(torch.float32, q_len=64, kv_len=64)
    shapes = []

    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        attend(*(t.requires_grad_() for t in (query, key, value)), AttentionSpec(top_k=4))
    assert shapes and not any(len(shape) >= 2 and shape[-2:] == (64, 64) for shape in shapes)
