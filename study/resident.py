"""Resident memory as a user sees it: the peak resident set (``ru_maxrss``) of a fresh process per measurement.

The profiler's figure (`study.bench.memory`) counts tensor bytes live at once; what runs out on a machine is the
process's resident memory, which also holds the allocator's free but unreturned pages (fragmentation), the
libraries and everything torch allocates outside its tensors. A process's ``ru_maxrss`` only ever grows, so each
measurement runs in a process of its own:

- `in_fresh_process`: a function (importable by name) in a `multiprocessing` "spawn" child; its peak resident
  memory, and the peak before the function ran (the interpreter, torch and the other imports), come back with
  its result;
- `command_peak`: a module's command line (``python -m ...``) as a subprocess that writes its own peak when it
  exits.

The peak is Linux's ``VmHWM`` of the process (`max_rss_bytes`): what GNU time reports as "maximum resident set
size" for a process started from a small shell. ``ru_maxrss`` would also count the parent's resident set at the
fork, so a child of a large process (a test runner, the bench) would report at least its parent's size.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# ru_maxrss is in kilobytes on Linux, in bytes on macOS
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024


def max_rss_bytes() -> int:
    """The peak resident set of this process so far, in bytes: Linux's ``VmHWM`` (the high-water mark of this
    process's own address space), else ``ru_maxrss``. On Linux ``ru_maxrss`` also keeps the parent's resident set
    at the fork (the address space a process had before its exec counts), so a small child of a large parent
    would report the parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT


def _child(connection, function: Callable, args: tuple, threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
    before = max_rss_bytes()
    try:
        result = function(*args)
        connection.send(("ok", result, before, max_rss_bytes()))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        connection.send(("error", traceback.format_exc(limit=6), before, max_rss_bytes()))
    finally:
        connection.close()


class ChildFailed(RuntimeError):
    """The measured function raised (its traceback is the message) or its process died."""


def in_fresh_process(function: Callable, *args: Any, threads: int | None = None) -> tuple[Any, dict]:
    """``function(*args)`` in a new "spawn" process (``threads`` torch threads, default the caller's): its result
    and ``{"max_rss_bytes": peak resident memory of that process, "base_rss_bytes": the peak before the function
    ran}``. The function and its arguments must pickle (a module-level function, dataclasses)."""
    import torch

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, function, args, threads or torch.get_num_threads()))
    process.start()
    send.close()
    try:
        state, result, before, peak = receive.recv()
    except EOFError:
        process.join()
        raise ChildFailed(f"{getattr(function, '__name__', function)}: its process died (exit code "
                          f"{process.exitcode}; out of memory?)") from None
    finally:
        receive.close()
    process.join()
    if state != "ok":
        raise ChildFailed(result)
    return result, {"max_rss_bytes": peak, "base_rss_bytes": before}


def command_peak(module: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> dict:
    """Run ``python -m module *args`` (output to ``log``) in a process that reports its own peak resident memory
    when it exits (`max_rss_bytes`, this module as its ``__main__``), and wait for it: its exit code, wall and CPU
    seconds and that peak (None when the process died before reporting it, killed for memory for example)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    report = log.with_suffix(".rss")
    report.unlink(missing_ok=True)
    start = time.perf_counter()
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "study.resident", str(report), module, *args], stdout=out,
                                   stderr=subprocess.STDOUT, env=env)  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    peak = int(report.read_text()) if report.is_file() else None
    return {"returncode": process.returncode, "seconds": time.perf_counter() - start, "max_rss_bytes": peak,
            "cpu_seconds": usage.ru_utime + usage.ru_stime}


def _run_module_and_report(report: str, module: str, args: list[str]) -> None:
    """``python -m study.resident REPORT MODULE ARGS...``: run MODULE as ``__main__`` with ARGS, and write this
    process's peak resident bytes to REPORT when it exits, however it exits."""
    import atexit
    import runpy

    atexit.register(lambda: Path(report).write_text(str(max_rss_bytes())))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _run_module_and_report(sys.argv[1], sys.argv[2], sys.argv[3:])


__all__ = ["ChildFailed", "command_peak", "in_fresh_process", "max_rss_bytes"]
