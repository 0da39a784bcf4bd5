"""The training order of `study.data`: a shuffle by (seed, epoch) and a loader that resumes mid-epoch.

Both are importable from `study.data` as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler


class EpochSampler(Sampler[int]):
    """A shuffle that depends only on (seed, epoch): Lightning calls `set_epoch` at each epoch start (and, for a
    resumed run, with the checkpoint's epoch), so the order never depends on the random state left by earlier
    steps. Under DDP, Lightning wraps it in a `DistributedSamplerWrapper`, which reshuffles by epoch itself."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % 2**63)
        return iter(torch.randperm(self.size, generator=generator).tolist())


class ResumableLoader(DataLoader):
    """A training DataLoader whose position in the epoch is saved in checkpoints and restored on resume.

    Lightning saves `state_dict()` of a loader that has one and calls `load_state_dict` on resume; the next
    epoch iterator then skips the batches the interrupted run had already trained on, so a killed and resumed
    run trains on the batches an uninterrupted run would have (`consumed` is counted by the datamodule).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consumed = 0  # batches of the current epoch that training steps have used
        self._skip = 0

    def __iter__(self):
        iterator = super().__iter__()
        skip, self._skip = self._skip, 0
        for _ in range(skip):  # tokenised blocks in memory: skipping reads them, which is cheap
            next(iterator)
        self.consumed = skip
        return iterator

    def state_dict(self) -> dict[str, int | None]:
        return {"batches": self.consumed, "epoch": getattr(self.sampler, "epoch", None)}

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        self._skip = int(state.get("batches") or 0)
        # Lightning creates the resumed epoch's iterator before it calls `set_epoch`: without this, the resumed
        # epoch would be shuffled as epoch 0 (measured).
        if state.get("epoch") is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(int(state["epoch"]))


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.stack([row["input_ids"] for row in rows])}


__all__ = ["EpochSampler", "ResumableLoader", "collate"]
