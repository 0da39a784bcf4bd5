"""Running a sweep's plan: skip finished runs, resume interrupted ones, record failures, report progress."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from study import tags
from study.checkpoints import checkpoint_step
from study.errors import one_line
from study.progress import format_seconds
from study.report.read import dotted_get, read_json
from study.sweep.spec import Plan, Run

STATUS_FILE = "status.json"
FINAL_STATES = ("finished", "diverged")  # never rerun; "failed" and "running" (interrupted) are resumed


# ---- status files ---------------------------------------------------------------------------------------------
def is_rank_zero() -> bool:
    """True unless this process is a non-zero rank of a DDP / SLURM / torchrun job."""
    return all(os.environ.get(var, "0") == "0" for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK"))


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's status, or None when it has none or it is damaged (not JSON, not text, not an object): the run
    is then treated as not done, and the report names the damaged file."""
    path = Path(run_dir) / STATUS_FILE
    return read_json(path, []) if path.is_file() else None


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Write status.json atomically; on a full disk, overwrite the old file in place with a compact record.

    A full disk is one of the ways a run ends, and its status must still say so: the in-place record (no args,
    no metrics) is shorter than the `running` status it replaces, so it needs no new disk blocks.
    """
    if not is_rank_zero():
        return
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{STATUS_FILE}.tmp"
    try:
        tmp.write_text(json.dumps(status, indent=2, default=str))
        tmp.replace(run_dir / STATUS_FILE)
    except OSError:
        tmp.unlink(missing_ok=True)
        compact = {k: status.get(k) for k in ("name", "index", "fingerprint", "state", "reason", "attempts")}
        data = json.dumps(compact, default=str).encode()
        with open(run_dir / STATUS_FILE, "r+b") as f:  # the file exists: `running` was written at the start
            f.write(data)
            f.truncate(len(data))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def resume_point(ckpt_dir: Path) -> tuple[Path | None, int | None, list[str]]:
    """The checkpoint to resume from, its step, and notes on what was wrong.

    last.ckpt if it loads. A checkpoint that does not load (a kill or a full disk during its write) is renamed
    `<name>.corrupt` on rank zero, so that no rerun trips over it again, and the readable checkpoint with the most
    steps (the best-model one, say) is used instead; with none, the run starts over.
    """
    last = ckpt_dir / "last.ckpt"
    candidates = ([last] if last.is_file() else []) + sorted(p for p in ckpt_dir.glob("*.ckpt") if p != last)
    notes, good = [], []
    for path in candidates:
        step = checkpoint_step(path)
        if step is None:
            notes.append(f"{path} does not load: renamed {path.name}.corrupt")
            if is_rank_zero():
                path.replace(path.with_name(path.name + ".corrupt"))
            continue
        good.append((step, path))
        if path == last:
            break  # the normal case: nothing else to read
    if not good:
        return None, None, notes + (["no readable checkpoint: starting over"] if notes else [])
    step, path = max(good, key=lambda sp: sp[0])
    if notes:
        notes.append(f"resuming from {path.name} (step {step})")
    return path, step, notes


def _max_steps(run: Run) -> int | None:
    """The run's `trainer.max_steps` (None: no step limit)."""
    try:
        value = int(dotted_get(run.resolved, "trainer.max_steps"))
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None  # -1: no step limit


# ---- one run, in this process ---------------------------------------------------------------------------------
def _numeric_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _new_status(run: Run, previous: dict[str, Any], resume: Path | None, step: int | None, notes: list[str]):
    if (
        previous.get("state") == "running"
    ):  # the last attempt never wrote its end: killed, or the machine died
        notes = [f"attempt {previous.get('attempts', '?')} ended without a word (killed?)", *notes]
    return {
        "name": run.name,
        "index": run.index,
        "params": run.params,
        "fingerprint": run.fingerprint,
        "state": "running",
        "reason": None,
        "started": _now(),
        "attempts": int(previous.get("attempts", 0)) + 1,
        "resumed_from": str(resume) if resume else None,
        "resumed_from_step": step,
        "notes": notes,
        "args": run.args,
    }


def _outcome(cli, guard, is_pretrain: bool, run: Run) -> dict[str, Any]:
    """State and reason of a fit that returned."""
    metrics = _numeric_metrics(cli.trainer.callback_metrics)
    out: dict[str, Any] = {"global_step": cli.trainer.global_step, "metrics": metrics}
    if guard is not None:
        out["skipped_steps"] = guard.skipped_steps
    train_loss = metrics.get(tags.TRAIN_LOSS)
    if guard is not None and guard.diverged:
        return {**out, "state": "diverged", "reason": guard.diverged["reason"]}
    if train_loss is not None and not math.isfinite(train_loss):
        return {
            **out,
            "state": "diverged",
            "reason": f"training loss is {train_loss} at the end (no guard stopped it)",
        }
    if cli.trainer.interrupted:
        return {**out, "state": "failed", "reason": "interrupted (KeyboardInterrupt or a signal)"}
    if is_pretrain and is_rank_zero():
        hf = run.dir / "hf"
        cli.model.model.save_pretrained(hf)
        cli.datamodule.tokenizer.save_pretrained(hf)
    return {**out, "state": "finished"}


@contextlib.contextmanager
def run_console(log: Path, quiet: bool = True) -> Iterator[None]:
    """Send everything a run prints to ``log`` (appended), so that a sweep's console keeps one line per run.

    Redirected at the file-descriptor level, so Lightning's and transformers' log handlers, warnings, progress
    bars and C libraries land in the file too (as they do for `--parallel` runs, which are subprocesses writing to
    the same file). ``quiet=False`` (``study sweep --verbose``) changes nothing.
    """
    if not quiet:
        yield
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(log, "ab") as sink, contextlib.redirect_stdout(sys.__stdout__), contextlib.redirect_stderr(
            sys.__stderr__
        ):
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def execute_run(run: Run, is_pretrain: bool = False) -> dict[str, Any]:
    """Fit one run exactly as `study fit <run.args>` would, resuming from its last good checkpoint.

    Every way the fit ends is written to status.json with its reason: finished, diverged, an exception (failed,
    traceback in error.txt), Ctrl-C or SIGTERM (failed, then re-raised), a full disk (failed, written in place).
    A resumed run's TensorBoard writer purges the steps logged after the checkpoint (`purge_step`), so each
    step keeps one value.
    """
    from study.callbacks.nonfinite import NonFiniteGuard
    from study.fit import lightning_main

    run.dir.mkdir(parents=True, exist_ok=True)
    resume, step, notes = resume_point(run.dir / "checkpoints")
    max_steps = _max_steps(run)
    if resume is not None and max_steps is not None and step >= max_steps:
        # Killed after its final checkpoint but before the end of the run: Lightning logs a step's metrics after
        # that step's checkpoint, and the last validation and status come later still. Resuming would train
        # nothing and log nothing, so those would be missing for good; the run is seeded, so starting over
        # rebuilds it exactly (tests/test_sweep_fault_injection.py).
        notes = [*notes, f"{resume.name} holds the whole training (step {step}) but the run was stopped before it "
                 "logged and recorded its end: starting over"]
        resume, step = None, None
    status = _new_status(run, read_status(run.dir) or {}, resume, step, notes)
    for note in status["notes"]:
        if is_rank_zero():
            print(f"{run.name}: {note}", flush=True)
    write_status(run.dir, status)
    start = time.perf_counter()
    # steps logged after the checkpoint (or by an attempt with no usable checkpoint) are dropped from TensorBoard
    purge = step if resume else (0 if list(run.dir.glob("events.out.tfevents.*")) else None)
    args = list(run.args) + ([f"--trainer.logger.init_args.purge_step={purge}"] if purge is not None else [])
    cli = None
    try:
        cli = lightning_main(args, run=False, save_config_kwargs={"overwrite": True})
        guard = next((c for c in cli.trainer.callbacks if isinstance(c, NonFiniteGuard)), None)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(resume) if resume else None)
        status.update(_outcome(cli, guard, is_pretrain, run))
    except Exception as err:  # noqa: BLE001 - a failed run is recorded and does not stop the sweep
        status.update(state="failed", reason=f"{type(err).__name__}: {one_line(err)}")  # one line in the console
        if is_rank_zero():
            try:
                (run.dir / "error.txt").write_text(traceback.format_exc())
            except OSError:  # a full disk: the status (written in place) still says why
                pass
    except BaseException as err:  # Ctrl-C (Lightning turns it into SystemExit(1)), SIGTERM: record, then stop
        cause = err.__context__ if isinstance(err, SystemExit) and err.__context__ else err
        status.update(state="failed", reason=f"interrupted: {type(cause).__name__} {cause}".strip())
        if isinstance(err, SystemExit) and not err.code:  # Lightning's SIGTERMException exits 0: it must not
            raise SystemExit(128 + 15 if "SIGTERM" in type(err).__name__ else 1) from err
        raise
    finally:
        status.update(ended=_now(), duration_s=round(time.perf_counter() - start, 2))
        write_status(run.dir, status)
        del cli
        gc.collect()
    return status


# ---- one run, in a subprocess ---------------------------------------------------------------------------------
def run_command(
    spec_path: Path, index: int | str, quick: bool, passthrough: list[str], save_dir: str | None,
    threads: int | None = None,
) -> list[str]:
    """The `study sweep --run-index` command of one run, with every option of this sweep that the run needs."""
    cmd = [sys.executable, "-m", "study.cli", "sweep", "--config", str(spec_path), "--run-index", str(index)]
    if quick:
        cmd.append("--quick")
    if save_dir:
        cmd += ["--save-dir", save_dir]
    if threads:  # the child sets its torch threads from this, not from the inherited OMP_NUM_THREADS
        cmd += ["--threads", str(threads)]
    return cmd + list(passthrough)


def free_port() -> int:
    """A TCP port on the loopback that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_subprocess(cmd: list[str], run: Run, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    run.dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # Runs launched side by side each get their own DDP rendezvous port: left to themselves, two runs starting
    # together can pick the same free port and one fails with EADDRINUSE.
    env["MASTER_PORT"] = str(free_port())
    env.update(env_extra or {})
    log = open(run.dir / "sweep.log", "ab")  # noqa: SIM115 - closed by the caller through proc.log
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def finish_subprocess(proc: subprocess.Popen, run: Run) -> dict[str, Any]:
    proc.log.close()  # type: ignore[attr-defined]
    status = read_status(run.dir) or {"name": run.name, "index": run.index, "params": run.params}
    if proc.returncode != 0 and status.get("state") in (None, "running"):
        tail = (run.dir / "sweep.log").read_text(errors="replace").strip().splitlines()[-5:]
        status.update(
            state="failed",
            reason=f"run process exited with code {proc.returncode}" + (f": {tail[-1]}" if tail else ""),
            ended=_now(),
        )
        write_status(run.dir, status)
    return status


# ---- progress -------------------------------------------------------------------------------------------------
class Progress:
    """A line per run and an overall ETA from the measured durations of the runs done in this invocation."""

    def __init__(self, total: int, parallel: int = 1, estimate_s: float | None = None) -> None:
        self.total, self.parallel, self.estimate_s = total, max(parallel, 1), estimate_s
        self.done = 0
        self.start = time.perf_counter()
        self.durations: list[float] = []

    def eta(self) -> float | None:
        remaining = self.total - self.done
        if self.durations:
            return sum(self.durations) / len(self.durations) * remaining / self.parallel
        if self.estimate_s is not None:
            return self.estimate_s * remaining / max(self.total, 1)
        return None

    def update(self, run: Run, status: dict[str, Any], skipped: bool = False) -> str:
        self.done += 1
        if not skipped and status.get("duration_s") is not None:
            self.durations.append(float(status["duration_s"]))
        state = status.get("state", "?")
        detail = (
            "skipped (already " + state + ")" if skipped else f"{state} in {status.get('duration_s', 0):.1f}s"
        )
        extra = []
        if status.get("global_step") is not None:
            extra.append(f"step {status['global_step']}")
        ppl = (status.get("metrics") or {}).get(tags.VAL_PPL)
        if ppl is not None:
            extra.append(f"{tags.VAL_PPL} {ppl:.4g}")
        if status.get("reason") and state != "finished":
            extra.append(status["reason"])
        eta = self.eta()
        line = (
            f"[{self.done}/{self.total}] {run.name}: {detail}"
            + (f" ({'; '.join(extra)})" if extra else "")
            + f" | elapsed {format_seconds(time.perf_counter() - self.start)}"
            + (f" | ETA {format_seconds(eta)}" if eta is not None else "")
        )
        print(line, flush=True)
        return line


# ---- up-front estimate from measured first steps --------------------------------------------------------------
def _resolved(run: Run, key: str, default: Any) -> Any:
    return dotted_get(run.resolved, key, default)


def probe(run: Run, steps: int = 6) -> dict[str, float]:
    """Time `steps` optimizer steps of `run` (nothing written to its directory): setup and per-step seconds."""
    import lightning as L

    from study.fit import lightning_main

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_train_batch_start(self, *a) -> None:
            self._t = time.perf_counter()

        def on_train_batch_end(self, *a) -> None:
            self.times.append(time.perf_counter() - self._t)

    args = [a for a in run.args if not a.startswith(("--trainer.logger=", "--trainer.callbacks="))]
    args += [
        f"--trainer.max_steps={steps}",
        "--trainer.limit_val_batches=0",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.callbacks=[]",
    ]
    t0 = time.perf_counter()
    cli = lightning_main(args, run=False, save_config_callback=None)
    cli.datamodule.prepare_data()  # caches the tokenizer and blocks: a one-off cost, not a per-run one
    t_prepared = time.perf_counter()
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    t_end = time.perf_counter()
    warm = sorted(timer.times[2:] or timer.times)
    step_s = warm[len(warm) // 2]
    # setup = building the CLI (without the cache) + Lightning's fit overhead around the steps
    setup_s = (t_prepared - t0) * 0.5 + (t_end - t_prepared - sum(timer.times))
    del cli
    gc.collect()
    return {"step_s": step_s, "setup_s": max(setup_s, 0.5), "prepare_s": t_prepared - t0}


def estimate_run(run: Run, step_s: float, setup_s: float) -> float:
    max_steps = int(_resolved(run, "trainer.max_steps", 100))
    if max_steps < 0:
        max_steps = 1000
    interval = _resolved(run, "trainer.val_check_interval", max_steps)
    checks = max_steps // interval if isinstance(interval, int) and interval > 0 else 1
    val_batches = _resolved(run, "trainer.limit_val_batches", 10)
    val_batches = val_batches if isinstance(val_batches, int) else 20
    # a validation batch is a forward pass only: about a third of a training step
    return setup_s + max_steps * step_s + (checks + 1) * val_batches * step_s / 3


def plan_estimate(
    plan: Plan, todo: list[Run], pretrain_todo: bool, timing: dict[str, float], parallel: int
) -> float:
    total = sum(estimate_run(r, timing["step_s"], timing["setup_s"]) for r in todo) / max(parallel, 1)
    if pretrain_todo and plan.pretrain is not None:
        total += estimate_run(plan.pretrain, timing["step_s"], timing["setup_s"])
    return total
