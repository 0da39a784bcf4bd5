"""Independent text windows for `study analyze --windows K`: the replicates of the frozen-model findings.

Consecutive blocks of one passage share their context and are not independent replicates of a model's
behaviour. The windows here are spread over every text given (for `--text shakespeare`, each held-out play on its
own): each text gets windows in proportion to its length, each window lies inside its own equal stretch of that
text, at a seeded random offset within the stretch, so no two windows overlap and none crosses from one text
into another.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def allocate(sizes: Sequence[int], count: int, length: int) -> list[int]:
    """Windows per text: proportional to each text's size (largest remainder), never more than fit in it."""
    room = [n // length for n in sizes]
    if count < 1:
        raise ValueError(f"the number of windows must be >= 1, got {count}")
    if sum(room) < count:
        raise ValueError(f"{count} windows of L={length} tokens need {count * length} tokens; the text has room "
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
        raise ValueError(f"{count} windows of L={length} do not fit in a text of {size} tokens")
    starts = []
    for j in range(count):
        lo = int(np.ceil(j * stretch))
        hi = int(np.floor((j + 1) * stretch)) - length  # the last start whose window ends inside the stretch
        starts.append(int(rng.integers(lo, max(lo, hi) + 1)))
    return starts


def sample_windows(texts: Sequence[Sequence[int]], count: int, length: int, seed: int = 0) -> tuple[list[list[int]], list[dict]]:
    """(`count` token windows of `length` tokens, where each came from: {"text": index, "start": token offset}).

    Raises ValueError naming the numbers when the texts cannot hold that many whole windows.
    """
    if length < 1:
        raise ValueError(f"L must be >= 1, got L={length}")
    sizes = [len(t) for t in texts]
    rng = np.random.default_rng(seed)
    windows, origins = [], []
    for index, (tokens, k) in enumerate(zip(texts, allocate(sizes, count, length))):
        for start in window_starts(len(tokens), k, length, rng):
            windows.append(list(tokens[start:start + length]))
            origins.append({"text": index, "start": start})
    return windows, origins


def read_texts(spec: str, text: str) -> list[str]:
    """The texts windows are drawn from: each held-out play on its own for 'shakespeare' (a window never spans
    two plays), else the one text `study analyze` read (`text`)."""
    if spec != "shakespeare":
        return [text]
    from pathlib import Path

    from study.data import shakespeare_files

    return [Path(f).read_text(errors="replace") for f in shakespeare_files()["validation"]]
