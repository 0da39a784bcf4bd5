"""Cache folders that can be trusted: built aside and renamed into place, checked on every use, rebuilt when damaged.

The materialised models (`study.pretrained`) and the tokenised blocks and tokenizers (`study.corpus`, `study.data`)
are folders that later runs read without rebuilding. A folder that a kill left half-written, or whose bytes were
damaged later (a full disk, a bad copy, an edit), would otherwise be used as is: wrong weights or all-zero token
blocks, and no error. So each folder carries `checksums.json`, written last while it is built: the size,
modification time and SHA-256 of every file. On use, a file whose size differs, or which is missing, makes the
folder damaged; a file whose size and modification time are those recorded is taken as it was built (a stat, no
read: the cheap check), and any other file is hashed and compared. A damaged folder is moved aside and rebuilt,
and the reason printed. A change that keeps both size and modification time (bit rot under the file system) is
not seen by the cheap check; a model that runs train from is read whole on every use (`verified_digest`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

CHECKSUMS = "checksums.json"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != CHECKSUMS)


def content_digest(file_hashes: dict[str, str]) -> str:
    """A folder's content digest from {relative name: SHA-256 of its bytes}: equal exactly when the names and the
    bytes of its files are (sizes and modification times play no part)."""
    digest = hashlib.sha256()
    for name in sorted(file_hashes):
        digest.update(f"{name}\0{file_hashes[name]}\0".encode())
    return "content " + digest.hexdigest()[:16]


def folder_file_hashes(folder: Path) -> dict[str, str]:
    """{relative name: SHA-256} of every file of a folder, each read whole (its `checksums.json` left out)."""
    return {p.relative_to(folder).as_posix(): file_sha256(p) for p in _files(Path(folder))}


def write_checksums(folder: Path) -> None:
    """Record every file of ``folder`` (size, mtime, SHA-256) in its `checksums.json`; call it once it is complete."""
    folder = Path(folder)
    record = {}
    for path in _files(folder):
        stat = path.stat()
        record[path.relative_to(folder).as_posix()] = {
            "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(path),
        }  # fmt: skip
    (folder / CHECKSUMS).write_text(json.dumps({"files": record}, indent=1, sort_keys=True))


def folder_problem(folder: Path, whole: bool = False) -> str | None:
    """Why the cache folder cannot be used as it is (half-built, a file missing, changed or damaged); None if sound.
    ``whole``: every file is read and compared with its recorded SHA-256, whatever its size and modification time
    say (a model that runs train from: bytes zeroed with both restored are caught)."""
    folder = Path(folder)
    try:
        record = json.loads((folder / CHECKSUMS).read_text())["files"]
    except FileNotFoundError:
        return f"it has no {CHECKSUMS} (half-built, or built before caches were checked)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its {CHECKSUMS} is unreadable ({type(err).__name__})"
    if not isinstance(record, dict) or not record:
        return f"its {CHECKSUMS} lists no file"
    for name, entry in sorted(record.items()):
        path = folder / name
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != entry.get("size"):
            return f"{name} has {stat.st_size} bytes, {entry.get('size')} when built"
        if (whole or stat.st_mtime_ns != entry.get("mtime_ns")) and file_sha256(path) != entry.get("sha256"):
            return f"{name} changed since it was built (SHA-256 differs)"
    return None


def verified_digest(folder: Path) -> tuple[str | None, str | None]:
    """(content digest, None) of a folder built with checksums, every file read whole against them; (None, the
    problem) when it is not as built. The digest is `content_digest` of its files: the one a run's provenance
    records for it (`study.provenance.model_folder_digest`)."""
    folder = Path(folder)
    if problem := folder_problem(folder, whole=True):
        return None, problem
    record = json.loads((folder / CHECKSUMS).read_text())["files"]
    extra = sorted(p.relative_to(folder).as_posix() for p in _files(folder) if p.relative_to(folder).as_posix()
                   not in record)
    if extra:  # a file added since it was built would be read by the run, and is in no checksum
        return None, f"{extra[0]} was added since it was built"
    return content_digest({name: entry["sha256"] for name, entry in record.items()}), None


def usable(folder: Path) -> bool:
    """True if ``folder`` is a sound cache entry; a damaged one is moved aside (and the reason printed): False."""
    folder = Path(folder)
    if not folder.exists():
        return False
    problem = folder_problem(folder)
    if problem is None:
        return True
    print(f"study: cache {folder} is damaged ({problem}): rebuilding it", file=sys.stderr, flush=True)
    discard(folder)
    return False


def discard(folder: Path) -> None:
    """Remove a cache folder: renamed aside first (one atomic step, so no reader sees it half-deleted)."""
    trash = folder.with_name(f".{folder.name}.damaged.{os.getpid()}")
    try:
        folder.rename(trash)
    except FileNotFoundError:  # another process moved it first
        return
    shutil.rmtree(trash, ignore_errors=True)


def build_atomically(build: Callable[[Path], None], target: Path) -> None:
    """Run ``build(tmp)`` in a temporary folder beside ``target``, record its checksums and rename it into place.

    Two processes that build at once both succeed: the second rename fails on the first one's (identical, sound)
    folder and is dropped. A target that is there but damaged is moved aside first.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        build(tmp)
        write_checksums(tmp)
        if target.exists() and folder_problem(target) is not None:
            discard(target)
        try:
            tmp.rename(target)
        except OSError:  # another process renamed its copy first: a non-empty target refuses the rename
            if folder_problem(target) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
