"""A sweep's steps on the frozen model: `study probe` (the spec's `probe:` section) and `study analyze` (`analyze:`).

They do not depend on the fine-tuning runs, so with `--parallel` they take pool slots beside the runs (first, being
the longest jobs), as `study <verb>` subprocesses; with one run at a time they run in this process after the runs.
Either way a step is skipped while its result file records the same arguments and its model's digest (in
`model_digest.json` beside the result: a model folder rebuilt under the same path is another model) is the one
the model has now, is held under a lock
(`<sweep>/<label>.lock`) so that several sweep processes never run it twice at once, writes its output to its log,
and prints one line here; a failure is named, and the report goes without that step.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from study.atomic import write_text_atomically
from study.progress import format_seconds
from study.report.read import read_json
from study.sweep.config import Plan
from study.sweep.lock import RunBusy, RunLock
from study.sweep.run import run_console

MODEL_DIGEST = "model_digest.json"  # beside a step's result: the content digest of the model it read


def refused_frozen_args(plan: Plan) -> str | None:
    """Why the spec's `probe:` or `analyze:` section cannot run, checked by the command's own checks of its
    numbers (and, for the analysis, of its lengths against N) before any run trains; None when both can run.
    The checks that need the model (its context, its layers) wait for it: the sweep's own pretrained model does
    not exist before pretraining."""
    import argparse

    from study.errors import ConfigError
    from study.frozen.analysis import command as analysis
    from study.frozen.probe import command as probe

    for section, argv, parser, checks in (
        ("probe", plan.probe, probe.build_parser, (probe.check_numbers,)),
        ("analyze", plan.analyze, analysis.build_parser,
         (analysis.check_numbers, lambda args: analysis.resolve_lengths(args, None))),
    ):
        if argv is None:
            continue
        p = parser()
        p.exit_on_error = False
        try:
            args = p.parse_args(argv)
            for check in checks:
                check(args)
        except (argparse.ArgumentError, ConfigError, ValueError) as err:
            return f"`{section}:` {err}"
    return None


@dataclass(frozen=True)
class FrozenStep:
    """One command on the frozen model, run by a sweep."""

    label: str  # the `study` verb and the console label: "probe" or "analyze"
    noun: str  # "the probe", in messages
    module: str  # the module whose `main(argv)` runs it (study.cli's VERBS entry)
    argv: list[str]
    result: Path  # the file that records the arguments it ran with
    recorded: Callable[[dict], Any]  # those arguments, read from the result
    log: Path
    lock_dir: Path  # the sweep's folder: the lock is <lock_dir>/<label>.lock
    replace: Path | None = None  # a folder removed before a rerun (`study analyze` never writes into one)

    def model_digest(self) -> str | None:
        """The content digest of the model the step reads (`study.provenance.model_identity`); None if none."""
        from study.provenance import model_identity

        model = self.argv[self.argv.index("--model") + 1] if "--model" in self.argv[:-1] else None
        return model_identity(model) if model else None

    def cached(self) -> bool:
        """The result exists and records these arguments and the model as it is now (a damaged or older one, or
        one of another model under the same path, is redone)."""
        if not (self.result.is_file() and self.recorded(read_json(self.result, []) or {}) == self.argv):
            return False
        digest = self.result.parent / MODEL_DIGEST
        recorded = read_json(digest, []) if digest.is_file() and not digest.is_symlink() else None
        return (recorded or {}).get("digest") == self.model_digest()

    def lock(self) -> RunLock:
        return RunLock(self.lock_dir, name=f"{self.label}.lock")

    def prepare(self) -> None:
        if self.replace is not None and self.replace.exists():
            shutil.rmtree(self.replace)
        self.log.parent.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        """The `study <verb>` subprocess (the spec's own `--threads` travels in argv)."""
        return [sys.executable, "-m", "study.cli", self.label, *self.argv]

    def say_cached(self) -> None:
        print(f"{self.label}: cached ({self.result})", flush=True)

    def say_done(self, code: int, seconds: float, digest: str | None) -> bool:
        """Say how the step ended; record the digest of the model it read (``digest``, taken before it started)."""
        if code != 0:
            print(f"study sweep: {self.noun} failed (see {self.log}); the report goes without it", file=sys.stderr,
                  flush=True)
            return False
        write_text_atomically(self.result.parent / MODEL_DIGEST, json.dumps({"digest": digest}))
        print(f"{self.label}: finished in {format_seconds(seconds)} ({self.result})", flush=True)
        return True

    def say_busy(self, held: RunBusy) -> None:
        print(f"{self.label}: being run by another process ({held}); left to it", flush=True)


def frozen_steps(plan: Plan) -> list[FrozenStep]:
    """The sweep's probe and analysis, those its spec enables, longest first."""
    steps = []
    if plan.probe:
        out = plan.sweep_dir / "probe"
        steps.append(FrozenStep("probe", "the probe", "study.frozen.probe.command", plan.probe, out / "probe.json",
                                lambda result: result.get("argv"), log=plan.sweep_dir / "probe.log",
                                lock_dir=plan.sweep_dir))  # fmt: skip
    if plan.analyze:
        out = plan.sweep_dir / "analyze"
        steps.append(FrozenStep("analyze", "the analysis", "study.frozen.analysis.command", plan.analyze,
                                out / "results.json", lambda result: (result.get("source") or {}).get("argv"),
                                log=plan.sweep_dir / "analyze.log", lock_dir=plan.sweep_dir, replace=out))  # fmt: skip
    return steps


def run_step_here(step: FrozenStep, quiet: bool = True) -> bool | None:
    """Run ``step`` here (``quiet``: its output to its log). True: done or cached; False: failed; None: another
    process holds it."""
    if step.cached():
        step.say_cached()
        return True
    try:
        with step.lock():
            if step.cached():  # finished by another process meanwhile
                step.say_cached()
                return True
            step.prepare()
            t0, digest = time.perf_counter(), step.model_digest()
            with run_console(step.log, quiet=quiet):
                code = importlib.import_module(step.module).main(list(step.argv))
            return step.say_done(code, time.perf_counter() - t0, digest)
    except RunBusy as held:
        step.say_busy(held)
        return None


class Launched:
    """A step running as a subprocess of the pool, holding its lock until `finish`."""

    def __init__(self, step: FrozenStep, lock: RunLock) -> None:
        self.step, self.lock = step, lock
        step.prepare()
        self.digest = step.model_digest()
        self.log = open(step.log, "ab")  # noqa: SIM115 - closed in finish
        self.proc = subprocess.Popen(step.command(), stdout=self.log, stderr=subprocess.STDOUT)
        self.started = time.perf_counter()

    def poll(self) -> int | None:
        return self.proc.poll()

    def finish(self) -> bool:
        self.log.close()
        self.lock.release()
        return self.step.say_done(self.proc.returncode, time.perf_counter() - self.started, self.digest)


def launch(step: FrozenStep) -> Launched | bool | None:
    """Start ``step`` as a subprocess; True when cached, None when another process holds it."""
    if step.cached():
        step.say_cached()
        return True
    lock = step.lock()
    try:
        lock.acquire()
    except RunBusy as held:
        step.say_busy(held)
        return None
    try:
        return Launched(step, lock)
    except BaseException:
        lock.release()
        raise
