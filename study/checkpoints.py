"""Reading Lightning checkpoint files without trusting them: why one does not load, the step it holds.

Every read unpickles with `weights_only=True` (tensors, containers and plain values only): a checkpoint is a
pickle, and a planted or downloaded one could otherwise run code the moment it is read. Lightning's own checkpoints
(model, optimizer, schedulers, loops, this package's callbacks) hold nothing else, so no global is allow-listed.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's content, read with `weights_only=True`; a file holding anything but data raises."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # mmap: cheap on big files


def checkpoint_problem(path: str | Path) -> str | None:
    """Why a checkpoint file does not load (truncated, not a checkpoint, holds code), on one line; None if it loads."""
    try:
        load_checkpoint(Path(path))
    except pickle.UnpicklingError as err:  # weights_only refused an object: nothing of it was run
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        what = found.group(1) if found else "an object that is not data"
        return f"UnpicklingError: it holds {what}, which no checkpoint needs (refused before it could run)"
    except Exception as err:  # noqa: BLE001 - any failure to load is the answer
        first = (str(err).strip().splitlines() or [""])[0].split(". ")[0]  # torch's first sentence says it
        return f"{type(err).__name__}: {first}"
    return None


def checkpoint_step(path: Path) -> int | None:
    """The global step saved in a checkpoint, or None (with the reason printed, one line) if it does not load."""
    try:
        return int(load_checkpoint(path).get("global_step", 0))
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is reported, not fatal here
        print(f"cannot read {path}: {checkpoint_problem(path)}", flush=True)
        return None
