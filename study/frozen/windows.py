"""Independent text windows, the replicates of every measurement on a frozen model (`study probe --windows`,
`study analyze --windows`): the one sampler of both.

Consecutive blocks of one passage share their context and are not independent replicates of a model's
behaviour. The windows here are spread over every document of the text (for `--text shakespeare`, each held-out
play on its own): each document gets windows in proportion to its length, each window lies inside its own equal
stretch of that document, at a seeded random offset within the stretch, so no two windows overlap and none
crosses from one document into another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from study.errors import ConfigError


def allocate(sizes: Sequence[int], count: int, length: int) -> list[int]:
    """Windows per text: proportional to each text's size (largest remainder), never more than fit in it."""
    room = [n // length for n in sizes]
    if count < 1:
        raise ConfigError(f"the number of windows must be >= 1, got {count}")
    if sum(room) < count:
        raise ConfigError(f"{count} windows of L={length} tokens need {count * length} tokens; the text has room "
                         f"for {sum(room)} whole windows ({sum(sizes)} tokens in {len(sizes)} text(s))")
    total = sum(sizes)
    share = [count * n / total for n in sizes]
    given = [min(int(s), r) for s, r in zip(share, room)]
    # the remaining windows go to the largest remainders among texts that still have room
    order = sorted(range(len(sizes)), key=lambda i: share[i] - int(share[i]), reverse=True)
    while sum(given) < count:
        for i in order:
            if sum(given) < count and given[i] < room[i]:
                given[i] += 1
    return given


def window_starts(size: int, count: int, length: int, rng: np.random.Generator) -> list[int]:
    """`count` non-overlapping starts in a text of `size` tokens: window j lies in stretch j of `count` equal ones."""
    if count == 0:
        return []
    stretch = size / count
    if stretch < length:
        raise ConfigError(f"{count} windows of L={length} do not fit in a text of {size} tokens")
    starts = []
    for j in range(count):
        lo = int(np.ceil(j * stretch))
        hi = int(np.floor((j + 1) * stretch)) - length  # the last start whose window ends inside the stretch
        starts.append(int(rng.integers(lo, max(lo, hi) + 1)))
    return starts


def sample_windows(texts: Sequence[Sequence[int]], count: int, length: int, seed: int = 0) -> tuple[list[list[int]], list[dict]]:
    """(`count` token windows of `length` tokens, where each came from: {"text": index, "start": token offset}).

    Raises ConfigError naming the numbers when the texts cannot hold that many whole windows.
    """
    if length < 1:
        raise ConfigError(f"L must be >= 1, got L={length}")
    sizes = [len(t) for t in texts]
    rng = np.random.default_rng(seed)
    windows, origins = [], []
    for index, (tokens, k) in enumerate(zip(texts, allocate(sizes, count, length))):
        for start in window_starts(len(tokens), k, length, rng):
            windows.append(list(tokens[start:start + length]))
            origins.append({"text": index, "start": start})
    return windows, origins


@dataclass
class Windows:
    """Token windows of one length: ``ids[i]`` comes from document ``names[origins[i]["text"]]`` at token
    ``origins[i]["start"]``."""

    ids: torch.Tensor  # (count, length), int64
    names: list[str]  # the documents' names, in the text's order
    origins: list[dict]  # {"text": index into names, "start": token offset}, as sample_windows draws them

    @property
    def sources(self) -> list[tuple[str, int]]:
        """(document name, start) of each window."""
        return [(self.names[o["text"]], o["start"]) for o in self.origins]

    def taking_turns(self) -> Windows:
        """The same windows, the documents taking turns (the first of each, then the second of each, ...), so that
        the first few (the probe's fp64 subset) come from different documents."""
        rank = {}
        keys = []
        for i, o in enumerate(self.origins):
            rank[o["text"]] = rank.get(o["text"], -1) + 1
            keys.append((rank[o["text"]], o["text"], i))
        order = [i for _, _, i in sorted(keys)]
        return Windows(self.ids[order], self.names, [self.origins[i] for i in order])


def text_windows(tokenizer, docs: Sequence[tuple[str, str]], count: int, seq_len: int, seed: int = 0) -> Windows:
    """``count`` windows of ``seq_len`` tokens from the documents ``docs`` ((name, text), `study.frozen.text`),
    each tokenised on its own, drawn by `sample_windows` with ``seed``."""
    tokens = [tokenizer(text, add_special_tokens=False)["input_ids"] for _, text in docs]
    windows, origins = sample_windows(tokens, count, seq_len, seed=seed)
    return Windows(torch.tensor(windows, dtype=torch.long), [name for name, _ in docs], origins)
