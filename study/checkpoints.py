"""Reading Lightning checkpoint files without trusting them: why one does not load, the step it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_checkpoint(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)  # mmap: cheap on big files


def checkpoint_problem(path: str | Path) -> str | None:
    """Why a checkpoint file does not load (truncated, not a checkpoint), on one line; None if it loads."""
    try:
        load_checkpoint(Path(path))
    except Exception as err:  # noqa: BLE001 - any failure to load is the answer
        first = (str(err).strip().splitlines() or [""])[0].split(". ")[0]  # torch's first sentence says it
        return f"{type(err).__name__}: {first}"
    return None


def checkpoint_step(path: Path) -> int | None:
    """The global step saved in a checkpoint, or None (with the reason printed) if the file does not load."""
    try:
        return int(load_checkpoint(path).get("global_step", 0))
    except Exception as err:  # noqa: BLE001 - an unreadable checkpoint is reported, not fatal here
        print(f"cannot read {path}: {type(err).__name__}: {err}", flush=True)
        return None
