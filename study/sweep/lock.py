"""One lock per run folder, so that several sweep processes (or SLURM / torchrun workers) can share one sweep.

A process trains a run only while it holds `<run>/run.lock`, an exclusive `fcntl.flock` on that file. The kernel
releases the lock when its holder exits for any reason (kill -9 included), so a lock left by a dead process is
simply taken over; the file itself only records who holds it (pid, host, since) for the message that names the
holder to a process that finds the run busy.

Only rank zero of a multi-process run takes the lock: the other ranks are that run's own workers.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LOCK_FILE = "run.lock"


class RunBusy(RuntimeError):
    """The run is being trained by another process (named in the message)."""

    def __init__(self, run_dir: Path, holder: dict[str, Any], name: str = LOCK_FILE) -> None:
        self.holder = holder
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        held = run_dir.name if name == LOCK_FILE else name
        super().__init__(f"{held} is held by {who} since {holder.get('since', '?')} ({run_dir / name})")


def _holder(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}


class RunLock:
    """``with RunLock(run_dir):`` holds the run for this process, or raises `RunBusy` naming the holder.

    `taken_over` is the previous holder's record when the lock file was left by a process that no longer holds
    it (it died or was killed), else None. ``name``: another lock file in that folder (a sweep's frozen-model
    steps hold ``<sweep>/probe.lock`` and ``<sweep>/analyze.lock``).
    """

    def __init__(self, run_dir: str | Path, name: str = LOCK_FILE) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / name
        self.taken_over: dict[str, Any] | None = None
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:  # O_NOFOLLOW: a planted link would have its target truncated to this record
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, f"{self.path} is a link: refused (remove it)") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunBusy(self.run_dir, _holder(self.path), self.path.name) from None
        previous = _holder(self.path)
        self.taken_over = previous or None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # an empty file: nobody holds the run
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def busy(run_dir: str | Path, name: str = LOCK_FILE) -> RunBusy | None:
    """Whether another process holds the run right now (peeks: takes and drops the lock if it is free)."""
    try:
        RunLock(run_dir, name).acquire().release()
    except RunBusy as held:
        return held
    return None
