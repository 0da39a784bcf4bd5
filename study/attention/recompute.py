"""Activation checkpointing that recomputes attention on the path its forward took.

Which path `attend` takes depends on per-thread state: the open taps (explicit path) and the blockwise settings
(`blockwise_settings`). Activation checkpointing recomputes a layer's forward inside the backward pass, which
often runs outside the blocks that set that state (``with tapping(tap): loss = model(x)`` then
``loss.backward()``). Recomputed on another path, the layer would save other tensors than its forward did, and
torch's checkpoint refuses that (or the gradients would come from another computation). `same_path_context` is
the ``context_fn`` of `torch.utils.checkpoint.checkpoint` (non-reentrant) that captures the state when the
forward runs and restores it for the recomputation; the taps see nothing of the recomputation
(`study.attention.tap.recomputing`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext

from study.attention import blockwise, tap


def same_path_context() -> tuple[AbstractContextManager, AbstractContextManager]:
    """(forward context, recomputation context) for `torch.utils.checkpoint.checkpoint`'s ``context_fn``."""
    settings = blockwise.current_settings()
    taps = tap.active_taps()

    @contextmanager
    def as_in_the_forward():
        with blockwise.restored(settings), tap.reopened(taps):
            yield

    return nullcontext(), as_in_the_forward()


__all__ = ["same_path_context"]
