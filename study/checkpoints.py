"""Reading Lightning checkpoint files without trusting them: why one does not load, the step it holds.

Every read unpickles with `weights_only=True` passed explicitly (tensors, containers and plain values only): a
checkpoint is a pickle, and a planted or downloaded one could otherwise run code the moment it is read. torch's
`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` overrides only a load that does not say `weights_only`, so an explicit True holds
whatever the environment says. Lightning's own checkpoints (model, optimizer, schedulers, loops, this package's
callbacks) hold nothing else, so no global is allow-listed.

Every byte is verified before a checkpoint is used. torch writes a checkpoint as a zip archive whose every record
(the pickle and each tensor's storage) carries its CRC-32 in the zip headers, but torch itself never checks them
when it reads (a lazily loaded, memory-mapped checkpoint is not even read): 64 KB zeroed inside a tensor loads
without an error and is trained on. `verify_records` reads every record through `zipfile`, which checks each
record's CRC-32 and its headers, so damage anywhere in the file (data or zip structure) is found before Lightning
sees the file.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's content, read with `weights_only=True`; a file holding anything but data raises."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # mmap: cheap on big files


def verify_records(path: Path) -> str | None:
    """Why the checkpoint's bytes are damaged (a record whose CRC-32 differs, a broken zip structure); None if every
    record reads back as written. Reads the whole file once."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every record and checks its CRC-32 and local header
    except zipfile.BadZipFile as err:
        return f"damaged: {err} (not a readable zip archive)"
    except (OSError, RuntimeError, ValueError, EOFError) as err:  # a header zipfile cannot follow, a read error
        return f"damaged: {type(err).__name__}: {err}"
    if bad is not None:
        return f"damaged: record {bad} fails its CRC-32 check"
    return None


PICKLE_PROTOCOL_2_UP = b"\x80"  # the opcode that opens a pickle of protocol 2 or later


def is_pickle(path: str | Path) -> bool:
    """Whether the file is a pickle, bare or inside torch's zip format (a ``data.pkl`` record); read, never
    unpickled."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        if head[:1] == PICKLE_PROTOCOL_2_UP:
            return True
        if head == b"PK" and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith(".pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return False


def checkpoint_problem(path: str | Path) -> str | None:
    """Why a checkpoint file cannot be used (truncated, damaged bytes, not a checkpoint, holds code), on one line;
    None if it loads and every byte is as written."""
    try:
        load_checkpoint(Path(path))
    except pickle.UnpicklingError as err:  # weights_only refused an object: nothing of it was run
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        what = found.group(1) if found else "an object that is not data"
        return f"UnpicklingError: it holds {what}, which no checkpoint needs (refused before it could run)"
    except Exception as err:  # noqa: BLE001 - any failure to load is the answer
        first = (str(err).strip().splitlines() or [""])[0].split(". ")[0]  # torch's first sentence says it
        return f"{type(err).__name__}: {first}"
    return verify_records(Path(path))


def checkpoint_step(path: Path) -> int | None:
    """The global step saved in a sound checkpoint, or None (with the reason printed, one line) if it cannot be used."""
    problem = checkpoint_problem(path)
    if problem is None:
        try:
            return int(load_checkpoint(path).get("global_step", 0))
        except Exception as err:  # noqa: BLE001 - a step that is not a number: the checkpoint is not usable
            problem = f"{type(err).__name__}: {err}"
    print(f"cannot read {path}: {problem}", flush=True)
    return None
