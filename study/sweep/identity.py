"""What a run depends on beyond its arguments: the content of the base config and of the files the settings
name, and the identity of the model and the data it trains on.

A run's arguments hold the base config's *path*, not its content: editing `learning_rate` in the base YAML, then
adding a seed, used to train the new runs at the new rate and pool them with the old ones as seeds of one setting.
`run_dependencies` gives each run a small record of what it trained with (name -> digest); the run's status keeps
it, plan.json shows it, and a sweep refuses to go on with a run whose record differs from what it would use now,
naming what changed (`changed_dependencies`).

Digests (`study.provenance`, which every run's provenance record uses too): a file's SHA-256 (its size and
modification time past `HASH_LIMIT`), a model folder's content digest (its files' names and bytes), a tokenizer
folder's list of (file, size, modification time), a hub name as itself (its revision cannot be checked offline).
Paths inside the sweep's own folder (its logs) are the sweep's outputs, not its inputs: left out, but for the
sweep's pretrained model once it exists (each run reads it whole before it trains from it and records its digest:
`study.sweep.run`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from study.provenance import file_digest, input_digests


def run_dependencies(base: Path, resolved: dict[str, Any], sweep_dir: Path) -> dict[str, str]:
    """name -> digest of everything the run reads besides its arguments (see the module docstring): its base
    config and `study.provenance.input_digests`, the sweep's own folder left out."""
    return {f"base config {base}": file_digest(base), **input_digests(resolved, outputs=sweep_dir)}


def changed_dependencies(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """What differs between a run's recorded dependencies and the current ones, one phrase each."""
    changes = []
    for name in sorted(set(recorded) | set(now)):
        if name not in now:
            changes.append(f"{name} is no longer used")
        elif name not in recorded:
            changes.append(f"{name} is new")
        elif recorded[name] != now[name]:
            changes.append(f"{name} changed ({recorded[name]} -> {now[name]})")
    return changes
