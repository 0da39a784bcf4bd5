"""The runs of a sweep's plan: in this process, as a pool of subprocesses (`--parallel`, one process per run) or by
worker processes that each train runs one after another (`--workers`), each run under its run lock, with a
progress line per run and the time left."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from study import tags
from study.progress import format_seconds
from study.sweep.config import Plan, Run
from study.sweep.frozen_steps import FrozenStep, Launched, launch
from study.sweep.lock import RunBusy, RunLock, busy
from study.sweep.run import (
    done,
    execute_run,
    open_log,
    read_status,
    run_console,
    say_taken_over,
    utc_now,
    write_status,
)
from study.sweep.source import SourceChanged, SourceWatch


# ---- one run as a subprocess ---------------------------------------------------------------------------------
def run_command(
    spec_path: Path, index: int | str | None, quick: bool, passthrough: list[str], save_dir: str | None,
    threads: int | None = None, spec_digest: str | None = None,
) -> list[str]:
    """The `study sweep --run-index` command of one run (``index`` None: the `--worker` command that trains every
    run it can lock), with every option of this sweep that the run needs; ``spec_digest``: the spec's digest when
    the sweep started, which the run process refuses to go on without (`study.sweep.spec_identity`)."""
    cmd = [sys.executable, "-m", "study.cli", "sweep", "--config", str(spec_path)]
    cmd += ["--worker"] if index is None else ["--run-index", str(index)]
    if spec_digest:
        cmd += ["--spec-digest", spec_digest]
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
    log = open_log(run.dir / "sweep.log")  # closed by the caller through proc.log
    # its own process group (with any DDP ranks it starts): a signal to the sweep is passed on to the whole group
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def process_end(code: int) -> str:
    """How a subprocess ended, in words: "exited with code 1", or "killed by SIGKILL" for a signal (Popen's
    negative return code)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def finish_subprocess(proc: subprocess.Popen, run: Run, reason: str | None = None) -> dict[str, Any]:
    proc.log.close()  # type: ignore[attr-defined]
    status = read_status(run.dir) or {"name": run.name, "index": run.index, "params": run.params}
    if reason and proc.returncode != 0 and status.get("state") in (None, "running", "failed"):
        status.update(state="failed", reason=reason, ended=utc_now())
        write_status(run.dir, status)
    elif proc.returncode != 0 and status.get("state") in (None, "running"):
        try:
            tail = (run.dir / "sweep.log").read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            tail = []
        killed = proc.returncode < 0  # its last log line is where the signal found it, not why it ended
        status.update(
            state="failed",
            reason=f"run process {process_end(proc.returncode)}" + (f": {tail[-1]}" if tail and not killed else ""),
            ended=utc_now(),
        )
        write_status(run.dir, status)
    return status


# ---- signals --------------------------------------------------------------------------------------------------
class Stopped(BaseException):
    """SIGTERM or SIGINT reached the sweep process while it ran subprocesses."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into `Stopped` while the pool runs (the default SIGTERM ended the sweep at once and
    left its runs training, orphaned, holding their locks)."""

    def handler(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _signal_job(proc: subprocess.Popen, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def stop_jobs(
    jobs: list, signum: int, progress: SweepProgress | None, grace_s: float = 60.0, cause: str | None = None,
) -> None:  # fmt: skip
    """Pass ``signum`` on to every running job (a run's whole process group), wait for each to record itself
    (SIGKILL after ``grace_s``), record the runs that could not as interrupted, and say so in one line; ``cause``
    names why when the sweep itself stops them (its source changed), else the signal is the cause."""
    name = cause or signal.Signals(signum).name
    procs = [(job, job.proc if isinstance(job, Launched) else job[1]) for job in jobs]
    for job, proc in procs:
        _signal_job(proc, signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT, not isinstance(job, Launched))
    deadline = time.monotonic() + grace_s
    for job, proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _signal_job(proc, signal.SIGKILL, not isinstance(job, Launched))
            proc.wait()
    names = []
    for job, proc in procs:
        if isinstance(job, Launched):
            job.finish()
            names.append(job.step.label)
            continue
        run = job[0]
        status = finish_subprocess(proc, run, reason=f"interrupted: the sweep was stopped ({name})")
        names.append(run.name)
        if progress is not None:
            progress.update(run, status)
    print(f"study sweep: stopped by {name}; {len(names)} running job(s) stopped and recorded"
          + (f" ({', '.join(names)})" if names else "") + ("" if cause else "; rerun the same command to resume"),
          flush=True)


# ---- progress -------------------------------------------------------------------------------------------------
class SweepProgress:
    """A line per run and an overall ETA from the runs done in this invocation.

    The ETA is the mean slot time of the runs ended so far x the runs left / the slots. A run's slot time is its
    wall time in the pool, from launch to exit (``slot_s``): it includes what a run's own duration leaves out (its
    process's interpreter start-up and imports, the slots' contention), which made an ETA from durations alone
    about half the wait. The sweep's elapsed time is not the rate: the frozen-model steps and the up-front
    estimate hold slots before any run ends, so an elapsed-time rate overstates the wait. Runs in this process (no
    pool) count their own duration. Before any run ends, the up-front estimate.

    While jobs are in flight and nothing has been printed for ``heartbeat_s``, the pool prints a heartbeat line
    (`heartbeat`), so the first ETA comes before the first run ends.
    """

    def __init__(self, total: int, parallel: int = 1, estimate_s: float | None = None,
                 heartbeat_s: float = 60.0) -> None:  # fmt: skip
        self.total, self.parallel, self.estimate_s = total, max(parallel, 1), estimate_s
        self.done = 0
        self.start = time.perf_counter()
        self.last_line = self.start
        self.heartbeat_s = heartbeat_s
        self.durations: list[float] = []

    def eta(self) -> float | None:
        remaining = self.total - self.done
        if self.durations:
            return sum(self.durations) / len(self.durations) * remaining / self.parallel
        if self.estimate_s is not None:
            return self.estimate_s * remaining / max(self.total, 1)
        return None

    def update(self, run: Run, status: dict[str, Any], skipped: bool = False, slot_s: float | None = None) -> str:
        self.done += 1
        if not skipped and (slot_s is not None or status.get("duration_s") is not None):
            self.durations.append(float(slot_s if slot_s is not None else status["duration_s"]))
        state = status.get("state", "?")
        detail = (
            "skipped (already " + state + ")" if skipped else f"{state} in {status.get('duration_s', 0):.1f}s"
        )
        extra = []
        reason = status.get("reason") if state != "finished" else None
        # one step number per event: a reason that names its step ("... at step 3") stands for the run's step count
        # (the guard's step was not applied, yet Lightning counted it: "step 4 ... at step 3" read as two events)
        if status.get("global_step") is not None and not (reason and " at step " in reason):
            extra.append(f"step {status['global_step']}")
        ppl = (status.get("metrics") or {}).get(tags.VAL_PPL)
        if ppl is not None:
            extra.append(f"{tags.VAL_PPL} {ppl:.4g}")
        if not skipped and status.get("max_rss_bytes"):  # its process's peak resident memory (`execute_run`)
            extra.append(f"peak {status['max_rss_bytes'] / 1e9:.1f} GB")
        if reason:
            extra.append(reason)
        eta = self.eta()
        line = (
            f"[{self.done}/{self.total}] {run.name}: {detail}"
            + (f" ({'; '.join(extra)})" if extra else "")
            + f" | elapsed {format_seconds(time.perf_counter() - self.start)}"
            + (f" | ETA {format_seconds(eta)}" if eta is not None else "")
        )
        print(line, flush=True)
        self.last_line = time.perf_counter()
        return line

    def heartbeat(self, in_flight: Sequence[str]) -> str | None:
        """A line naming the jobs in flight, with the elapsed time and the ETA, when nothing was printed for
        ``heartbeat_s``; None otherwise (or when nothing is in flight). Before any run ended the ETA is the
        estimate less the time since the runs began: the runs in flight have used that much of it."""
        now = time.perf_counter()
        if not in_flight or now - self.last_line < self.heartbeat_s:
            return None
        eta = self.eta()
        if eta is not None and not self.durations:
            eta -= now - self.start
        line = (
            f"[{self.done}/{self.total}] in flight: {', '.join(in_flight)}"
            + f" | elapsed {format_seconds(now - self.start)}"
            + ("" if eta is None else f" | ETA {format_seconds(eta)}" if eta > 0 else " | ETA: past the estimate")
        )
        print(line, flush=True)
        self.last_line = now
        return line



# ---- the pool ------------------------------------------------------------------------------------------------
def needs_subprocess(plan: Plan) -> bool:
    """DDP inside the sweep process would relaunch the whole sweep per rank: run each such run as a subprocess."""
    trainer = plan.runs[0].resolved.get("trainer") or {}
    devices, strategy = str(trainer.get("devices", "auto")), str(trainer.get("strategy", "auto"))
    if "ddp" in strategy or devices.strip('"') not in ("1", "auto", "[0]"):
        return True
    if devices.strip('"') == "auto":
        import torch

        return torch.cuda.device_count() > 1
    return False


def _gpu_groups(parallel: int, per_run: int) -> list[str | None]:
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return [None] * parallel
    groups = [",".join(str(g * per_run + i) for i in range(per_run)) for g in range(count // per_run)]
    if len(groups) < parallel:
        print(
            f"study sweep: only {count} GPUs for {parallel} x {per_run}; running {len(groups)} at once",
            flush=True,
        )
    return groups[:parallel] or [None]


def _left_to_others(run: Run, held: RunBusy, progress: SweepProgress) -> None:
    progress.update(run, {"state": "running elsewhere", "reason": str(held)}, skipped=True)


def run_in_process(
    todo: list[Run], progress: SweepProgress, quiet: bool = True, watch: SourceWatch | None = None,
) -> None:  # fmt: skip
    """Train each run this process can lock; runs other processes hold are left to them. ``quiet``: each run's
    output goes to ``<run>/sweep.log`` and the console keeps the progress line. ``watch``: the source hash is
    checked before and after each run (`SourceChanged` stops the sweep)."""
    for run in todo:
        try:
            with RunLock(run.dir) as lock:
                say_taken_over(run, lock)
                if done(run):  # finished by another process since the plan was read
                    progress.update(run, read_status(run.dir) or {}, skipped=True)
                    continue
                if watch is not None:
                    watch.check(f"before launching run {run.name}")
                try:
                    with run_console(run.dir / "sweep.log", quiet):
                        status = execute_run(run)
                except OSError as err:  # a full disk before or after the run could record itself: one failed run
                    status = failed_by(run, err)
                progress.update(run, status)
                if watch is not None:
                    watch.check_run(run.name, status)
                    watch.check(f"after run {run.name} ended")
        except RunBusy as held:
            _left_to_others(run, held, progress)
        except OSError as err:  # the lock or the folder cannot even be made: the run fails, the sweep goes on
            progress.update(run, failed_by(run, err))


def failed_by(run: Run, err: OSError) -> dict[str, Any]:
    """The status of a run that an OS error (a full disk) stopped outside its fit, recorded if it can be."""
    previous = read_status(run.dir) or {}
    status = {**{k: previous.get(k) for k in ("name", "index", "fingerprint", "attempts")}, "name": run.name,
              "index": run.index, "state": "failed", "reason": f"{type(err).__name__}: {err}", "ended": utc_now()}
    write_status(run.dir, status)
    return status


def run_workers(
    plan: Plan, todo: list[Run], args, passthrough: list[str], progress: SweepProgress,
    watch: SourceWatch | None = None, poll_s: float = 1.0,
) -> None:  # fmt: skip
    """`--workers N`: N processes, each training the runs it can lock one after another in its own interpreter
    (`run_in_process`), so the interpreter's start-up and imports are paid once per worker instead of once per
    run. This process reports each run as its status file records its end, and stops the workers on a signal or a
    change of the source. A worker's own output is ``<sweep>/workers/worker-<i>.log``."""
    folder = plan.sweep_dir / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    cmd = run_command(plan.spec_path, None, plan.quick, passthrough, args.save_dir, args.threads,
                      spec_digest=plan.spec_digest)
    launched_at = time.time()
    jobs: list[subprocess.Popen] = []
    pending = list(todo)
    try:
        with stopped_by_signals():  # from the first launch: a signal while they start stops the ones started
            for i in range(args.workers):
                log = open_log(folder / f"worker-{i}.log")
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                proc.log = log  # type: ignore[attr-defined]
                jobs.append(proc)
            while pending:
                time.sleep(poll_s)
                pending = [run for run in pending if not _reported_end(run, launched_at, progress, watch)]
                progress.heartbeat([f"worker {i}" for i, proc in enumerate(jobs) if proc.poll() is None])
                if all(proc.poll() is not None for proc in jobs):
                    pending = [run for run in pending if not _reported_end(run, launched_at, progress, watch)]
                    break
                if watch is not None:
                    watch.check("while the workers train")
    except (Stopped, SourceChanged) as stop:
        signum = stop.signum if isinstance(stop, Stopped) else signal.SIGTERM
        for proc in jobs:
            _signal_job(proc, signum, group=True)
        for proc in jobs:
            proc.wait()
        why = "its source changed" if isinstance(stop, SourceChanged) else signal.Signals(signum).name
        print(f"study sweep: stopped the {len(jobs)} workers ({why}); each recorded the run it was training as "
              "interrupted; rerun the same command to resume", flush=True)
        if isinstance(stop, SourceChanged):
            raise
        raise SystemExit(128 + signum) from None
    finally:
        for proc in jobs:
            proc.wait()
            proc.log.close()  # type: ignore[attr-defined]
    stopped = [i for i, proc in enumerate(jobs) if proc.returncode not in WORKER_EXITS]
    if stopped:  # anything but its own codes: the worker itself crashed or was killed
        logs = ", ".join(str(folder / f"worker-{i}.log") for i in stopped)
        ends = "; ".join(f"worker {i} {process_end(jobs[i].returncode)}" for i in stopped)
        print(f"study sweep: {ends} (see {logs}); {len(pending)} run(s) left untrained", flush=True)


WORKER_DONE, WORKER_RUN_FAILED, WORKER_SOURCE_CHANGED = 0, 3, 4
"""A `--workers` process's exit codes: every run it trained ended in a final state; a run of its own failed (recorded
in the run's status); the source changed under it. Any other code (1 from an uncaught error, -9 from a kill) means
the worker itself stopped."""
WORKER_EXITS = (WORKER_DONE, WORKER_RUN_FAILED, WORKER_SOURCE_CHANGED)


def _reported_end(run: Run, since: float, progress: SweepProgress, watch: SourceWatch | None) -> bool:
    """Whether a worker has ended ``run`` since ``since`` (its status file says so); if it has, report it."""
    path = run.dir / "status.json"
    try:
        if path.stat().st_mtime < since:
            return False
    except OSError:
        return False
    status = read_status(run.dir) or {}
    if status.get("state") in (None, "running"):
        return False
    progress.update(run, status)
    if watch is not None:
        watch.check_run(run.name, status)
    return True


def run_pool(
    plan: Plan, todo: list[Run], args, passthrough: list[str], progress: SweepProgress,
    steps: Sequence[FrozenStep] = (), watch: SourceWatch | None = None,
) -> dict[str, bool | None]:  # fmt: skip
    """Runs as `--run-index` subprocesses (which lock their run), `--parallel` at a time; the frozen-model
    ``steps`` (`study.sweep.frozen_steps`) take the first slots, as the longest jobs. Returns each step's
    outcome (True: done or cached, False: failed, None: held by another process). ``watch``: the source hash is
    checked before each launch and after each run ends, with the hash the run recorded; a change stops the
    running jobs and raises `SourceChanged`."""
    slots = _gpu_groups(args.parallel, args.devices_per_run) if args.parallel > 1 else [None]
    pending_steps, pending, active = list(steps), list(todo), {}
    outcomes: dict[str, bool | None] = {}
    try:
        with stopped_by_signals():
            _pool_loop(plan, args, passthrough, progress, slots, pending_steps, pending, active, outcomes, watch)
    except Stopped as stop:
        stop_jobs(list(active.values()), stop.signum, progress)
        raise SystemExit(128 + stop.signum) from None
    except SourceChanged:
        stop_jobs(list(active.values()), signal.SIGTERM, progress, cause="its source changing")
        raise
    return outcomes


def _pool_loop(plan, args, passthrough, progress, slots, pending_steps, pending, active, outcomes, watch) -> None:
    while pending_steps or pending or active:
        for slot, gpus in enumerate(slots):
            while slot not in active and pending_steps:
                step = pending_steps.pop(0)
                if watch is not None:
                    watch.check(f"before launching {step.label}")
                launched = launch(step)
                if isinstance(launched, Launched):
                    active[slot] = launched
                else:
                    outcomes[step.label] = launched
            if slot not in active and pending:
                run = pending.pop(0)
                held = busy(run.dir)
                if held is not None:
                    _left_to_others(run, held, progress)
                    continue
                if watch is not None:
                    watch.check(f"before launching run {run.name}")
                env = {"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {}
                cmd = run_command(plan.spec_path, run.index, plan.quick, passthrough, args.save_dir, args.threads,
                                  spec_digest=plan.spec_digest)
                try:
                    active[slot] = (run, launch_subprocess(cmd, run, env), time.perf_counter())
                except OSError as err:  # its log cannot be opened (a full disk): one failed run
                    progress.update(run, failed_by(run, err))
        time.sleep(0.2)
        progress.heartbeat([job.step.label if isinstance(job, Launched) else job[0].name for job in active.values()])
        for slot in list(active):
            job = active[slot]
            if isinstance(job, Launched):
                if job.poll() is not None:
                    del active[slot]
                    outcomes[job.step.label] = job.finish()
                continue
            run, proc, started = job
            if proc.poll() is not None:
                del active[slot]
                status = finish_subprocess(proc, run)
                slot_s = time.perf_counter() - started
                status.setdefault("duration_s", round(slot_s, 2))
                progress.update(run, status, slot_s=slot_s)
                if watch is not None:
                    watch.check_run(run.name, status)
                    watch.check(f"after run {run.name} ended")


def wait_for_pretraining(plan: Plan) -> None:
    """Another process pretraining the shared model: wait for it (every run of the sweep needs its result)."""
    held = busy(plan.pretrain.dir)
    if held is not None:
        print(f"study sweep: waiting for the pretraining: {held}", flush=True)
    while held is not None:
        time.sleep(5)
        held = busy(plan.pretrain.dir)


def pretrain(
    plan: Plan, args, passthrough: list[str], subprocess_mode: bool, watch: SourceWatch | None = None,
) -> dict:  # fmt: skip
    """Train the shared base run (its output in pretrain/sweep.log); its status. ``watch``: the source hash is
    checked before and after it (`SourceChanged`)."""
    if watch is not None:
        watch.check("before launching the pretraining")
    status = _pretrain(plan, args, passthrough, subprocess_mode)
    if watch is not None:
        watch.check_run("pretrain", status)
        watch.check("after the pretraining ended")
    return status


def _pretrain(plan: Plan, args, passthrough: list[str], subprocess_mode: bool) -> dict:
    if subprocess_mode:
        cmd = run_command(plan.spec_path, "pretrain", plan.quick, passthrough, args.save_dir, args.threads,
                          spec_digest=plan.spec_digest)
        proc = launch_subprocess(cmd, plan.pretrain)
        try:
            with stopped_by_signals():
                proc.wait()
        except Stopped as stop:
            stop_jobs([(plan.pretrain, proc, 0.0)], stop.signum, None)
            raise SystemExit(128 + stop.signum) from None
        return finish_subprocess(proc, plan.pretrain)
    try:
        with RunLock(plan.pretrain.dir) as lock:
            say_taken_over(plan.pretrain, lock)
            with run_console(plan.pretrain.dir / "sweep.log", not getattr(args, "verbose", False)):
                return execute_run(plan.pretrain, is_pretrain=True)
    except RunBusy:  # another process started it between our check and now
        wait_for_pretraining(plan)
        return read_status(plan.pretrain.dir) or {"state": "missing"}
