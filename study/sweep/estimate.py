"""The sweep's up-front time estimate: a few timed training steps of one run, scaled to the runs still to do, and
the probe and the analysis timed by their own `--estimate` (each kind of unit timed once, scaled to their counts);
the total schedules them as the sweep will (`--parallel` slots, the frozen-model steps first)."""

from __future__ import annotations

import gc
import heapq
import json
import subprocess
import sys
import threading
import time
from typing import Any

from study.callbacks.steptime import StepTimer
from study.progress import format_seconds
from study.report.read import dotted_get
from study.sweep.config import Plan, Run
from study.sweep.frozen_steps import frozen_steps
from study.sweep.run import run_console


def _resolved(run: Run, key: str, default: Any) -> Any:
    return dotted_get(run.resolved, key, default)


def measure_step_time(run: Run, steps: int = 6) -> dict[str, float]:
    """Time `steps` optimizer steps of `run` (nothing written to its directory): setup and per-step seconds."""
    from study.fit import lightning_main

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
    cli = lightning_main(args, run=False, timing=True, save_config_callback=None)
    cli.datamodule.prepare_data()  # caches the tokenizer and blocks: a one-off cost, not a per-run one
    t_prepared = time.perf_counter()
    timer = StepTimer()
    cli.trainer.callbacks = timer.around(cli.trainer.callbacks)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    t_end = time.perf_counter()
    warm = sorted(timer.times[2:] or timer.times)
    step_s = warm[len(warm) // 2]
    # setup = building the CLI (without the cache) + Lightning's fit overhead around the steps
    setup_s = (t_prepared - t0) * 0.5 + (t_end - t_prepared - sum(timer.times))
    del cli
    gc.collect()
    return {"step_s": step_s, "setup_s": max(setup_s, 0.5), "prepare_s": t_prepared - t0}


# What a run's subprocess does before its first step besides what `measure_step_time` times in this process (whose
# imports are already loaded): a fresh interpreter importing the training stack. It prints its own import time.
_STARTUP_CODE = "import time; t = time.perf_counter(); import study.fit; print(time.perf_counter() - t)"


def start_startup_probe() -> subprocess.Popen:
    """A fresh interpreter importing `study.fit`, started now so that it runs beside the step timing."""
    return subprocess.Popen([sys.executable, "-c", _STARTUP_CODE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def startup_seconds(probe: subprocess.Popen, timeout: float = 120.0) -> float:
    """The import time the probe printed (0 if it failed: the estimate then leaves start-up out, as before)."""
    try:
        out, _ = probe.communicate(timeout=timeout)
        return max(float(out.strip().splitlines()[-1]), 0.0) if probe.returncode == 0 else 0.0
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        probe.kill()
        probe.communicate()
        return 0.0


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


def makespan(jobs: list[float], slots: int) -> float:
    """Wall time of ``jobs`` (seconds each) started in order, each in the first slot free, as the sweep's pool
    starts its jobs."""
    free = [0.0] * max(slots, 1)
    for seconds in jobs:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free)


def plan_estimate(
    plan: Plan, todo: list[Run], pretrain_todo: bool, timing: dict[str, float], parallel: int,
    steps: dict[str, float] | None = None,
) -> float:
    """The sweep's wall time: pretraining, then the runs and the frozen-model ``steps`` ({label: seconds}) in
    ``parallel`` slots, the steps first (`study.sweep.pool.run_pool`); one at a time, the steps after the runs."""
    runs = [estimate_run(r, timing["step_s"], timing["setup_s"]) for r in todo]
    frozen = list((steps or {}).values())
    total = makespan(frozen + runs, parallel) if parallel > 1 else sum(runs) + sum(frozen)
    if pretrain_todo and plan.pretrain is not None:
        total += estimate_run(plan.pretrain, timing["step_s"], timing["setup_s"])
    return total


def read_estimate(proc: subprocess.Popen, started: float) -> float | str:
    """Seconds from a finished `--estimate` process, or why there are none."""
    out, err = proc.communicate()
    try:
        found = json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 else None
        seconds = float(found["seconds"])
    except (ValueError, IndexError, KeyError, TypeError):
        return f"exit code {proc.returncode}: {(err.strip().splitlines() or ['no output'])[-1]}"
    # a fresh process's start-up and imports are the pool's too; what timing took beyond the estimate's is not
    return seconds + max(time.perf_counter() - started - float(found.get("timed_s", 0.0)), 0.0)


class StepEstimates:
    """The probe's and the analysis' own `--estimate`s (each in a fresh process, as the pool runs them; those not
    cached), ``slots`` at a time, as the pool runs them beside each other. Started after the step timing: beside
    it they and the timed steps would slow each other and both estimates would be too long. `result()` waits for
    them; `stop()` ends them."""

    def __init__(self, plan: Plan, pretrain_todo: bool, slots: int = 1) -> None:
        steps = [step for step in frozen_steps(plan) if not step.cached()]
        unmade = str(plan.pretrain.dir / "hf") if pretrain_todo and plan.pretrain is not None else None
        # a step on the model pretraining will make cannot be timed before it
        self.found: dict[str, float | str] = {
            step.label: "its model is the one pretraining makes" for step in steps if unmade in step.argv}
        self.steps = [step for step in steps if step.label not in self.found]
        self.slots = max(slots, 1)
        self._procs: list[subprocess.Popen] = []
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for first in range(0, len(self.steps), self.slots):
            group = self.steps[first:first + self.slots]
            with self._lock:
                if self._stopped:
                    return
                started = time.perf_counter()
                self._procs = [subprocess.Popen([*step.command(), "--estimate"], stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True) for step in group]
            # one reader per process, so that each one's wall time ends when it does, not when the one before it does
            readers = [threading.Thread(target=self._read, args=(step.label, proc, started), daemon=True)
                       for step, proc in zip(group, self._procs)]  # fmt: skip
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()

    def _read(self, label: str, proc: subprocess.Popen, started: float) -> None:
        self.found[label] = read_estimate(proc, started)

    def start(self) -> StepEstimates:
        if self.steps:
            self._thread.start()
        return self

    def result(self) -> dict[str, float | str]:
        if self._thread.ident is not None:
            self._thread.join()
        return self.found

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
        self.result()


def estimate_time(
    plan: Plan, todo: list[Run], pretrain_todo: bool, parallel: int, quiet: bool = True, subprocesses: bool = False
) -> float | None:
    """Print the sweep's estimated wall time: the runs to do from a few timed steps of one of them, the probe and
    the analysis from their own `--estimate` (`StepEstimates`), scheduled as the sweep runs them (`plan_estimate`).
    Returns the runs' part (pretraining included), the progress lines' ETA; None if timing the steps fails.

    With ``subprocesses`` (each run a fresh process: `--parallel` or DDP) every run also pays an interpreter's
    start-up and imports, measured by a fresh interpreter started beside the step timing (so it sees the same
    contention the slots will).
    """
    timed_run = next((r for r in todo if r.params.get("top_k") is not None), (todo or plan.runs)[0])
    # Before pretraining, time a model of the same size from scratch (null, not the base config's model: that
    # may be another model altogether, e.g. SmolLM2 under the small GPT-2 quick pipeline).
    args = [
        "--model.model_name_or_path=null" if (a.startswith("--model.model_name_or_path=") and pretrain_todo) else a
        for a in timed_run.args
    ]
    timed_run = Run(
        timed_run.index, timed_run.name, timed_run.dir, timed_run.params, args, timed_run.resolved
    )
    probe = start_startup_probe() if subprocesses else None
    try:
        with run_console(plan.sweep_dir / "estimate.log", quiet):
            timing = measure_step_time(timed_run)
    except Exception as err:  # noqa: BLE001 - the runs will report the same problem with its context
        if probe is not None:
            probe.kill()
            probe.communicate()
        print(f"no time estimate: timing its first steps failed ({type(err).__name__}: {err})", flush=True)
        return None
    startup_s = startup_seconds(probe) if probe is not None else 0.0
    estimates = StepEstimates(plan, pretrain_todo, slots=parallel).start()
    try:
        found = estimates.result()
    finally:  # interrupted (Ctrl-C): no estimate process is left loading the model
        estimates.stop()
    steps = {label: s for label, s in found.items() if isinstance(s, float)}
    timing = {**timing, "setup_s": timing["setup_s"] + startup_s}
    seconds = plan_estimate(plan, todo, pretrain_todo, timing, parallel, steps)
    nouns = {"probe": "the probe", "analyze": "the analysis"}
    timed = [f"{nouns[label]} {format_seconds(s)}" for label, s in steps.items()]
    failed = [f"{nouns[label]} not timed ({s})" for label, s in found.items() if not isinstance(s, float)]
    print(
        f"Estimated time: about {format_seconds(seconds)} for {len(todo)} runs"
        + (" + pretraining" if pretrain_todo else "")
        + "".join(f" + {nouns[label]}" for label in steps)
        + (f", {parallel} at a time" if parallel > 1 else "")
        + f", from a measured {timing['step_s'] * 1000:.0f} ms/step and {timing['setup_s']:.1f} s setup per run"
        + (f", {startup_s:.1f} s of it a fresh process's start-up" if startup_s else "")
        + f" (timed on {timed_run.name}; the monitors' logging steps not counted)"
        + (f"; {', '.join(timed)} by their own --estimate" if timed else "")
        + (f"; {'; '.join(failed)}" if failed else "")
        + ".",
        flush=True,
    )
    # the progress lines' ETA counts the runs (and pretraining), as their own durations later do
    return plan_estimate(plan, todo, pretrain_todo, timing, parallel)
