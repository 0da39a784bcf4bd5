"""Report files written whole or not at all: each is written beside its target and renamed over it once complete.

A full disk (or a kill) during a write otherwise leaves a truncated report.md or a 0-byte PNG that looks like a
figure; written aside, the previous file stays until the new one is whole, and a failed write removes its
temporary file and raises (the caller names the failure).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, then rename it onto ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # the suffix: savefig reads the format
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(text))
