"""Progress of long work (`study analyze`, the probe, the bench): a bar on a terminal, one line per unit otherwise.

The one owner of progress reports and of how durations are printed (`format_seconds`, used by the sweep too).

On a terminal Lightning's own progress library (tqdm) draws a bar with the time left. Piped into a file or a CI
log, a bar's carriage returns make a mess, so each finished unit prints one line with its time and an estimate of
the time left (mean time per unit so far x units left).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TextIO, TypeVar

Item = TypeVar("Item")


def format_seconds(seconds: float) -> str:
    """``75.3`` -> ``"1:15"``; ``3725`` -> ``"1:02:05"``."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Progress of ``total`` units of work that finish one after another, reported as each one ends.

    On a terminal, a tqdm bar (Lightning's own progress library) with the time left; otherwise one line per unit:
    ``[desc] unit label (done/total) in 1.2s, about 0:35 left`` (mean time per unit so far x units left). For
    loops, `progress` wraps an iterable; work driven by something else (the bench's threads) calls `advance`.

    Args:
        desc: what is being done ("analyze", "probe", "bench small timing").
        total: number of units (None: unknown, no estimate).
        unit: what one unit is ("layer", "T", "variant"), used in the per-line report.
        stream: where to report (default: standard error).
        enabled: False reports nothing (for library calls and tests that want quiet).

    Example::

        with Progress("bench memory", total=len(variants), unit="variant") as bar:
            for v in variants:
                measure(v)
                bar.advance(v.name)
    """

    def __init__(self, desc: str, total: int | None = None, unit: str = "item", stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.desc, self.total, self.unit, self.enabled = desc, total, unit, enabled
        self.stream = sys.stderr if stream is None else stream
        self.done = 0
        self.started = self._last = time.perf_counter()
        self._bar = None
        if enabled and self.stream.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(desc=desc, unit=unit, total=total, file=self.stream, leave=False)

    def advance(self, label: object = "", n: int = 1) -> None:
        """``n`` more units are done; ``label`` names the (last) one."""
        self.done += n
        now = time.perf_counter()
        unit_seconds, self._last = now - self._last, now
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(str(label), refresh=False)
            self._bar.update(n)
            return
        name = f"{self.unit} {label}" if label != "" else self.unit
        line = f"[{self.desc}] {name} ({self.done}/{self.total or '?'}) in {unit_seconds:.1f}s"
        if self.total:
            left = (now - self.started) / self.done * max(self.total - self.done, 0)
            line += f", about {format_seconds(left)} left"
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    items: Iterable[Item], desc: str, unit: str = "item", total: int | None = None, stream: TextIO | None = None,
    enabled: bool = True, label: Callable[[Item], object] = str,
) -> Iterator[Item]:
    """Yield ``items`` while reporting progress on ``stream`` (default: standard error), one unit per item.

    Args:
        desc: what is being done ("analyze", "probe").
        unit: what one item is ("layer", "temperature"), used in the per-line report.
        total: number of items when ``items`` has no length.
        enabled: False yields the items silently (for library calls and tests that want quiet).
        label: how an item is named in its line (default: ``str``).
    """
    if total is None and isinstance(items, Sized):
        total = len(items)
    with Progress(desc, total=total, unit=unit, stream=stream, enabled=enabled) as bar:
        for item in items:
            bar._last = time.perf_counter()  # a unit's time is the consumer's work on it, not the producer's
            yield item
            bar.advance(label(item))


__all__ = ["Progress", "format_seconds", "progress"]
