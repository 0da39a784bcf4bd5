"""Progress of long work (`study analyze`, the probe, the bench): a bar on a terminal, one line per unit otherwise.

On a terminal Lightning's own progress library (tqdm) draws a bar with the time left. Piped into a file or a CI
log, a bar's carriage returns make a mess, so each finished unit prints one line with its time and an estimate of
the time left (mean time per unit so far x units left).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import TextIO, TypeVar

Item = TypeVar("Item")


def format_seconds(seconds: float) -> str:
    """``75.3`` -> ``"1:15"``; ``3725`` -> ``"1:02:05"``."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress(
    items: Iterable[Item], desc: str, unit: str = "item", total: int | None = None, stream: TextIO | None = None,
    enabled: bool = True,
) -> Iterator[Item]:
    """Yield ``items`` while reporting progress on ``stream`` (default: standard error).

    Args:
        desc: what is being done ("analyze", "probe").
        unit: what one item is ("layer", "temperature"), used in the per-line report.
        total: number of items when ``items`` has no length.
        enabled: False yields the items silently (for library calls and tests that want quiet).
    """
    stream = sys.stderr if stream is None else stream
    if total is None and isinstance(items, Sized):
        total = len(items)
    if not enabled:
        yield from items
        return
    if stream.isatty():
        from tqdm.auto import tqdm

        yield from tqdm(items, desc=desc, unit=unit, total=total, file=stream, leave=False)
        return
    started = time.perf_counter()
    done = 0
    for item in items:
        unit_started = time.perf_counter()
        yield item
        done += 1
        now = time.perf_counter()
        line = f"[{desc}] {unit} {item} ({done}/{total or '?'}) in {now - unit_started:.1f}s"
        if total:
            line += f", about {format_seconds((now - started) / done * (total - done))} left"
        print(line, file=stream, flush=True)


__all__ = ["format_seconds", "progress"]
