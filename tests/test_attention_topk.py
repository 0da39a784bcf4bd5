"""Top-k by selection, then gather (`study.attention.topk`): the explicit path's outputs and gradients, its picks
among ties, across key blocks."""

import pytest
import torch

from study.attention import AttentionSpec, attend, blockwise_settings, tapping
from study.attention.core import causal_allowed
from study.attention.registry import MASK_VALUE
from study.attention.select import top_k_indices
from study.attention.topk import ranked_top_k, select_top_k

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
    with blockwise_settings(block_scores=block_scores, min_scores=2**62, gather_keys_per_pick=1), tapping(*([ExplicitPath()] if explicit else [])):
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


@pytest.mark.parametrize("block_rows", [1, 2, 3, 10])
def test_selection_over_row_blocks_breaks_ties_like_top_k_indices(block_rows):
    """Rows of equal logits and rows that see fewer than k keys: the picks are `top_k_indices`'s on the whole row."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (2, 2, 10, 10), generator=generator).float()  # many exact ties
    visible = causal_allowed(10, 10, scores.device) & _padding_mask(10)
    picks = select_top_k(10, 10, 4, 4, lambda rows, keys: scores[..., rows, keys],
                         lambda rows, keys: visible[..., rows, keys], rows_per_block=block_rows)
    assert torch.equal(picks, top_k_indices(scores.masked_fill(~visible, MASK_VALUE), 4))


@pytest.mark.parametrize("block_rows", [1, 3, 10])
def test_selection_over_the_reachable_keys_picks_the_visible_keys_of_the_whole_row(block_rows):
    """With causality's reach (keys after a block's last query left out), each row's visible picks are those of
    `top_k_indices` on the whole row, in its order; a row that sees fewer than k keys fills up with hidden ones."""
    generator = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 3, (2, 2, 10, 10), generator=generator).float()
    visible = causal_allowed(10, 10, scores.device).expand(2, 2, 10, 10)

    def reach(rows):
        return slice(0, rows.stop)

    picks = select_top_k(10, 10, 4, 4, lambda rows, keys: scores[..., rows, keys],
                         lambda rows, keys: visible[..., rows, keys], reach, rows_per_block=block_rows)
    want = top_k_indices(scores.masked_fill(~visible, MASK_VALUE), 4)
    seen = visible.gather(-1, picks)
    for row in range(10):
        n = min(row + 1, 4)  # the visible keys of the row
        assert torch.equal(picks[..., row, :n], want[..., row, :n])
        assert not seen[..., row, n:].any()


@pytest.mark.parametrize("shape", [(3, 7, 50), (2, 5, 9)])
def test_ranked_top_k_is_top_k_indices(shape):
    """The float `topk` with the tie repair equals the exact rule: on continuous values, on many exact ties, on
    signed zeros and on rows of one repeated value."""
    generator = torch.Generator().manual_seed(2)
    cases = [torch.randn(shape, generator=generator), torch.randint(0, 4, shape, generator=generator).float(),
             torch.zeros(shape), torch.full(shape, MASK_VALUE)]
    signed = torch.randint(0, 2, shape, generator=generator).float()
    cases.append(torch.where(signed > 0, torch.tensor(0.0), torch.tensor(-0.0)))
    for values in cases:
        for k in (1, 3, shape[-1]):
            assert torch.equal(ranked_top_k(values, k), top_k_indices(values, k))


def test_zeroed_queries_attend_to_the_first_k_visible_keys():
    query, key, value = _inputs(torch.float64)
    query = torch.zeros_like(query)
    with blockwise_settings(gather_keys_per_pick=1):
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

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), blockwise_settings(gather_keys_per_pick=1):
        attend(*(t.requires_grad_() for t in (query, key, value)), AttentionSpec(top_k=4))
    assert shapes and not any(len(shape) >= 2 and shape[-2:] == (64, 64) for shape in shapes)


def test_top_k_gathers_where_keys_outnumber_picks_or_the_explicit_path_would_go_blockwise():
    """The default rule: a short row (128 keys, k = 4) keeps the dense explicit path; a long one (1024 keys, k = 4)
    gathers; a short row gathers too once its dense scores would exceed ``min_scores``."""
    from study.attention.blockwise import gathers_top_k

    assert not gathers_top_k(32, 128, 128, 4) and gathers_top_k(32, 1024, 1024, 4)
    with blockwise_settings(min_scores=32 * 128 * 128 - 1, block_scores=32 * 128):
        assert gathers_top_k(32, 128, 128, 4)
    with blockwise_settings(gather_keys_per_pick=1):
        assert gathers_top_k(32, 128, 128, 64)
    with pytest.raises(ValueError, match="gather_keys_per_pick must be an integer >= 1, got 0"):
        with blockwise_settings(gather_keys_per_pick=0):
            pass


def test_checkpointing_recomputes_top_k_on_the_forwards_path():
    """The forward gathers under ``gather_keys_per_pick=1``; the backward runs outside that block, where a row of 10
    keys would take the dense path: the recomputation restores every blockwise setting of the forward
    (`study.attention.recompute`), so torch's checkpoint sees the same saved tensors and the gradients are the
    uncheckpointed ones."""
    from torch.utils.checkpoint import checkpoint

    from study.attention.recompute import same_path_context

    query, key, value = (t.requires_grad_() for t in _inputs(torch.float64))
    spec = AttentionSpec(top_k=3)
    with blockwise_settings(gather_keys_per_pick=1):
        want = torch.autograd.grad(attend(query, key, value, spec).sum(), (query, key, value))
        out = checkpoint(lambda q, k, v: attend(q, k, v, spec), query, key, value, use_reentrant=False,
                         context_fn=same_path_context)
    got = torch.autograd.grad(out.sum(), (query, key, value))
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-12)
