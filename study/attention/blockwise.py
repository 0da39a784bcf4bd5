"""Blockwise explicit attention: the explicit path of `attend`, one block of query rows at a time.

The explicit path forms fp32 scores for every (query, key) pair, so one call holds several (B, H, Lq, Lk) tensors
(scores, masks, the normaliser's sorts and thresholds, the weights), and autograd keeps some of them for the
backward pass. At SmolLM2's context length that is gigabytes per layer. Every normaliser is a function of one row
at a time (each query's weights depend on that query's scores only; a `Normalizer` that is not sets
``row_wise = False`` and keeps the dense path), so the rows can be computed in blocks:

- forward: for each block of query rows, the scores of those rows over all keys, the row statistic the normaliser
  needs (top-k's picks, sparsemax's and entmax's threshold, SSMax's visible count, Self-Adjust's row min and max:
  all inside the normaliser, on whole rows), the weights, and the weighted sum of values;
- backward: each block is recomputed from q, k and v (`torch.utils.checkpoint`, non-reentrant, with the RNG state
  kept so dropout draws the same mask) and differentiated on its own, so no weights are kept between the passes.

Taps see each block once, in the forward pass: its weights over whole rows, and (for a tap that reads logits,
`study.attention.tap.AttentionLogits`) its logits over the key columns the block reaches; per-block maxima and sums
merge into the call's exactly.

Extra memory is then a few (B, H, block, Lk) tensors instead of (B, H, Lq, Lk), i.e. O(L x block); the output
and the gradients are those of the dense explicit path (the same function on the same rows). The price is one
more forward computation of the attention weights during the backward pass.

`attend` takes this path by itself when the dense score tensor would exceed `BlockwiseSettings.min_scores`
elements; `blockwise_settings` overrides the threshold and the block size for a block of code. Without gradients
(evaluation, the analyses) nothing is recomputed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class BlockwiseSettings:
    """When `attend`'s explicit path goes blockwise, and how big a block is.

    Args:
        min_scores: the blockwise path runs when one call's score tensor, B * H * Lq * Lk elements, exceeds this.
            The default, 2**26 (256 MiB of fp32 scores), keeps ordinary training shapes on the dense path (which
            recomputes nothing) and sends SmolLM2 at L >= 4096 (B = 1, 9 heads) blockwise. 0 means always
            blockwise (when the call has more than one block).
        block_scores: score elements per block, B * H * rows * Lk; a block has at least one query row. The
            default, 2**22 (16 MiB of fp32 scores), keeps the normaliser's working set of a block to a few
            hundred MB at any L.
        gather_keys_per_pick: softmax top-k with no tap open selects and gathers (`study.attention.topk`) when
            the row has at least this many keys per pick (Lk >= this * k), or when the explicit path would go
            blockwise; otherwise the dense explicit path runs. Gathering copies k keys and values per row (L k D
            elements, scattered back in the backward), so it pays off where k is small next to Lk; the default,
            128 (twice SmolLM2's and GPT-2's head size), sits near the crossover docs/performance.md measured.
            1 means always gather, a huge value gather only where the explicit path would go blockwise.
    """

    min_scores: int = 2**26
    block_scores: int = 2**22
    gather_keys_per_pick: int = 128

    def __post_init__(self) -> None:
        for name, low in (("min_scores", 0), ("block_scores", 1), ("gather_keys_per_pick", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


class _State(threading.local):
    def __init__(self) -> None:
        self.settings = BlockwiseSettings()


_state = _State()


def current_settings() -> BlockwiseSettings:
    """The settings in force in this thread."""
    return _state.settings


@contextmanager
def blockwise_settings(*, min_scores: int | None = None, block_scores: int | None = None,
                       gather_keys_per_pick: int | None = None) -> Iterator[BlockwiseSettings]:
    """Override the blockwise threshold and block size inside the block (per thread, nestable)::

        with blockwise_settings(min_scores=0, block_scores=2**20):  # always blockwise, 1 Mi scores a block
            loss = model(ids).loss
        with blockwise_settings(min_scores=2**62):  # never blockwise
            ...
    """
    changes = {name: value for name, value in (("min_scores", min_scores), ("block_scores", block_scores),
                                               ("gather_keys_per_pick", gather_keys_per_pick))
               if value is not None}
    saved = _state.settings
    _state.settings = replace(saved, **changes)  # validated here, before the block runs
    try:
        yield _state.settings
    finally:
        _state.settings = saved


@contextmanager
def restored(settings: BlockwiseSettings) -> Iterator[BlockwiseSettings]:
    """Put ``settings`` (a `current_settings()` taken earlier) in force inside the block, whole: activation
    checkpointing's recomputation runs under the forward's settings, every field of them."""
    saved = _state.settings
    _state.settings = settings
    try:
        yield settings
    finally:
        _state.settings = saved


def rows_per_block(batch_heads: int, kv_len: int) -> int:
    """Query rows in ``block_scores`` score elements of a call with ``batch_heads`` = B * H over ``kv_len`` keys
    (at least one row)."""
    return max(_state.settings.block_scores // max(batch_heads * kv_len, 1), 1)


def block_rows(batch_heads: int, q_len: int, kv_len: int) -> int | None:
    """Query rows per block for a call with ``batch_heads`` = B * H, or None when the dense path should run
    (the scores fit under ``min_scores``, or one block would hold every row anyway)."""
    if max(batch_heads * kv_len, 1) * q_len <= _state.settings.min_scores:
        return None
    rows = rows_per_block(batch_heads, kv_len)
    return rows if rows < q_len else None


def gathers_top_k(batch_heads: int, q_len: int, kv_len: int, k: int) -> bool:
    """Whether softmax top-k = ``k`` with no tap open takes the gathered path (see ``gather_keys_per_pick``)."""
    return kv_len >= _state.settings.gather_keys_per_pick * k or block_rows(batch_heads, q_len, kv_len) is not None


def keys_per_block(batch_heads: int, q_len: int, kv_len: int) -> int:
    """Key columns per block for a pass over keys with every query row at once (row statistics, top-k selection):
    ``block_scores`` score elements a block, at least one key, at most every key."""
    return max(min(_state.settings.block_scores // max(batch_heads * q_len, 1), kv_len), 1)


def attend_in_blocks(rows_output: Callable[[slice, bool], Tensor], q_len: int, rows_per_block: int) -> Tensor:
    """Concatenate ``rows_output(rows, first_pass)`` over blocks of query rows, recomputing each in the backward.

    ``rows_output`` returns the attention output of the query rows ``rows`` (a slice of 0..q_len), (..., rows, Dv).
    ``first_pass`` is False when the call is the backward pass's recomputation of that block: side effects that
    must happen once per forward (handing weights to taps) check it.
    """
    done: set[int] = set()

    def block(rows: slice) -> Tensor:
        first_pass = rows.start not in done
        done.add(rows.start)
        return rows_output(rows, first_pass)

    outputs = []
    for start in range(0, q_len, rows_per_block):
        rows = slice(start, min(start + rows_per_block, q_len))
        if torch.is_grad_enabled():
            outputs.append(checkpoint(block, rows, use_reentrant=False, preserve_rng_state=True))
        else:
            outputs.append(block(rows))
    return torch.cat(outputs, dim=-2)


__all__ = ["BlockwiseSettings", "attend_in_blocks", "block_rows", "blockwise_settings", "current_settings",
           "gathers_top_k", "keys_per_block", "restored", "rows_per_block"]
