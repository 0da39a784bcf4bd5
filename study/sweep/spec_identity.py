"""One sweep name, one spec: what a sweep's runs share is held under its name, and the spec file is watched.

Two hashes:

- the *shared hash* (`shared_hash`): the spec's settings that every run shares, its grid's values left out (the
  axes it varies stay in), so that adding a seed or a temperature keeps it, and changing a learning rate in
  `overrides` does not. A sweep folder holds one `spec.<shared hash>.lock` (`claim`): a second spec under a name
  that another spec is running (it holds its lock file, shared, while it runs) or ran (its lock file is there) is
  refused before anything is written, naming both hashes. Two specs started together decide under an exclusive
  lock of the sweep folder itself, so exactly one of them is refused.
- the *spec digest* (`spec_digest`): the bytes of the spec file and of the files it `extends`. The sweep takes it
  when it builds its plan and checks it wherever it checks its source hash (`study.sweep.source`); each run
  process it launches is given it (`--spec-digest`) and refuses a spec that no longer has it: an edit during a
  sweep stops it in one line, instead of runs built from the edited spec under the old plan.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from study.errors import load_yaml

LOCK_PREFIX, LOCK_SUFFIX = "spec.", ".lock"


class SpecConflict(Exception):
    """Another spec runs, or ran, under this sweep's name (a one-line message naming both shared hashes)."""


def _short(data: bytes) -> str:
    return "sha256 " + hashlib.sha256(data).hexdigest()[:16]


def spec_files(spec_path: str | Path) -> list[Path]:
    """The spec file and the files it `extends`, in that order (as `study.sweep.config.load_sweep_config` finds
    them: an unreadable one ends the chain, and the plan's own checks name it)."""
    files, path = [], Path(spec_path)
    while path.is_file() and path.resolve() not in {f.resolve() for f in files}:
        files.append(path)
        try:
            parent = (load_yaml(path) or {}).get("extends")
        except Exception:  # noqa: BLE001 - a broken spec is the plan's to name; its bytes still count
            break
        if not isinstance(parent, str):
            break
        path = Path(parent) if Path(parent).is_file() else path.parent / parent
    return files


def spec_digest(spec_path: str | Path) -> str:
    """The digest of the spec file and of the files it extends (their names and bytes)."""
    digest = hashlib.sha256()
    for path in spec_files(spec_path):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256 " + digest.hexdigest()[:16]


def spec_change(spec_path: str | Path, expected: str) -> str | None:
    """Why the spec no longer has the digest ``expected`` (one clause naming it and both digests), else None."""
    now = spec_digest(spec_path)
    if now == expected:
        return None
    return f"the sweep spec {spec_path} changed (spec digest {expected} -> {now})"


def shared_hash(shared: dict[str, Any]) -> str:
    """The hash of what a sweep's runs share (``shared``: the spec's settings with its grid's values left out, as
    `study.sweep.config.build_plan` gathers them)."""
    return _short(json.dumps(shared, sort_keys=True, default=str).encode())


def lock_name(shared: str) -> str:
    return f"{LOCK_PREFIX}{shared.removeprefix('sha256 ')}{LOCK_SUFFIX}"


def _other_specs(sweep_dir: Path, mine: str) -> list[Path]:
    return sorted(p for p in sweep_dir.glob(f"{LOCK_PREFIX}*{LOCK_SUFFIX}") if p.name != lock_name(mine))


def _held(path: Path) -> bool:
    """Whether a process holds ``path`` now (a running sweep of that spec holds it shared)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _refusal(sweep_dir: Path, other: Path, mine: str, spec_path: Path) -> str:
    theirs = _record(other)
    their_hash = theirs.get("shared_hash") or "sha256 " + other.name[len(LOCK_PREFIX):-len(LOCK_SUFFIX)]
    how = "is running under" if _held(other) else "ran under"
    return (f"sweep folder {sweep_dir}: spec {theirs.get('spec', '?')} (shared hash {their_hash}) {how} this name; "
            f"{spec_path} has other settings (shared hash {mine}): give it another `name`, or delete {other} and "
            "the runs it made to start the name over")


class SpecClaim:
    """This process's claim on a sweep name for its spec: `spec.<hash>.lock` held shared until `release`."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the lock
            self._fd = None


@contextlib.contextmanager
def _folder_locked(sweep_dir: Path) -> Iterator[None]:
    """The sweep folder locked exclusively (a lock on the folder itself: no file to plant) while a spec claims it."""
    fd = os.open(sweep_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def claim(sweep_dir: Path, mine: str, spec_path: Path, write: bool = True) -> SpecClaim:
    """Claim the sweep name in ``sweep_dir`` for the spec of shared hash ``mine``, or raise `SpecConflict` naming
    the spec that runs or ran under it. ``write`` False (a dry run): only check, creating nothing."""
    sweep_dir = Path(sweep_dir)
    if not write:
        if sweep_dir.is_dir() and (others := _other_specs(sweep_dir, mine)):
            raise SpecConflict(_refusal(sweep_dir, others[0], mine, spec_path))
        return SpecClaim(None)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with _folder_locked(sweep_dir):
        if others := _other_specs(sweep_dir, mine):
            raise SpecConflict(_refusal(sweep_dir, others[0], mine, spec_path))
        path = sweep_dir / lock_name(mine)
        try:  # O_NOFOLLOW: a planted link would have its target written
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise SpecConflict(f"{path} is a link: refused (remove it)") from None
            raise
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_size == 0:  # the first process of this spec records it (the others share the lock)
            since = datetime.now(timezone.utc).isoformat(timespec="seconds")
            os.write(fd, json.dumps({"shared_hash": mine, "spec": str(spec_path), "since": since}).encode())
    return SpecClaim(fd)
