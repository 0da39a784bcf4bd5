"""Running a sweep's plan: which runs to do, in this process or as subprocesses, each under its run lock."""

from __future__ import annotations

import sys
import time

from study.sweep.lock import RunBusy, RunLock, busy
from study.sweep.runner import (
    FINAL_STATES,
    Progress,
    execute_run,
    finish_subprocess,
    is_rank_zero,
    launch_subprocess,
    read_status,
    run_command,
    run_console,
)
from study.sweep.spec import Plan, Run


def done(run: Run) -> bool:
    return (read_status(run.dir) or {}).get("state") in FINAL_STATES


def pretrain_done(plan: Plan) -> bool:
    return plan.pretrain is None or (
        done(plan.pretrain) and (plan.pretrain.dir / "hf" / "config.json").is_file()
    )


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


def run_one(plan: Plan, index: str) -> int:
    if index == "pretrain":
        if plan.pretrain is None:
            print("study sweep: this sweep has no pretraining run", file=sys.stderr)
            return 2
        run, is_pretrain = plan.pretrain, True
    else:
        try:
            run, is_pretrain = plan.runs[int(index)], False
        except (ValueError, IndexError):
            print(
                f"study sweep: --run-index {index!r} is not in 0..{len(plan.runs) - 1} or 'pretrain'",
                file=sys.stderr,
            )
            return 2
        if not pretrain_done(plan):
            print(
                f"study sweep: run the pretraining first (--run-index pretrain): {plan.pretrain.dir}",
                file=sys.stderr,
            )
            return 2
    if not is_rank_zero():  # a worker of a multi-process run: rank zero holds the run's lock
        status = execute_run(run, is_pretrain=is_pretrain)
        return 0 if status["state"] in FINAL_STATES else 1
    try:
        with RunLock(run.dir) as lock:
            _say_taken_over(run, lock)
            if done(run):
                print(f"{run.name}: already {read_status(run.dir)['state']}, skipped", flush=True)
                return 0
            status = execute_run(run, is_pretrain=is_pretrain)
    except RunBusy as held:
        print(f"study sweep: {held}; left to it", flush=True)
        return 0
    if is_rank_zero():
        print(
            f"{run.name}: {status['state']} in {status.get('duration_s', 0):.1f}s"
            + (f" ({status['reason']})" if status.get("reason") else ""),
            flush=True,
        )
    return 0 if status["state"] in FINAL_STATES else 1


def _say_taken_over(run: Run, lock: RunLock) -> None:
    if lock.taken_over:
        print(
            f"{run.name}: taking over the lock of pid {lock.taken_over.get('pid')} on {lock.taken_over.get('host')}"
            " (that process is gone)",
            flush=True,
        )


def _left_to_others(run: Run, held: RunBusy, progress: Progress) -> None:
    progress.update(run, {"state": "running elsewhere", "reason": str(held)}, skipped=True)


def run_in_process(todo: list[Run], progress: Progress, quiet: bool = True) -> None:
    """Train each run this process can lock; runs other processes hold are left to them. ``quiet``: each run's
    output goes to ``<run>/sweep.log`` and the console keeps the progress line."""
    for run in todo:
        try:
            with RunLock(run.dir) as lock:
                _say_taken_over(run, lock)
                if done(run):  # finished by another process since the plan was read
                    progress.update(run, read_status(run.dir) or {}, skipped=True)
                    continue
                with run_console(run.dir / "sweep.log", quiet):
                    status = execute_run(run)
                progress.update(run, status)
        except RunBusy as held:
            _left_to_others(run, held, progress)


def run_pool(plan: Plan, todo: list[Run], args, passthrough: list[str], progress: Progress) -> None:
    """Runs as `--run-index` subprocesses (which lock their run), `--parallel` at a time."""
    slots = _gpu_groups(args.parallel, args.devices_per_run) if args.parallel > 1 else [None]
    pending, active = list(todo), {}
    while pending or active:
        for slot, gpus in enumerate(slots):
            if slot not in active and pending:
                run = pending.pop(0)
                held = busy(run.dir)
                if held is not None:
                    _left_to_others(run, held, progress)
                    continue
                env = {"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {}
                cmd = run_command(plan.spec_path, run.index, plan.quick, passthrough, args.save_dir, args.threads)
                active[slot] = (run, launch_subprocess(cmd, run, env), time.perf_counter())
        time.sleep(0.2)
        for slot in list(active):
            run, proc, started = active[slot]
            if proc.poll() is not None:
                del active[slot]
                status = finish_subprocess(proc, run)
                status.setdefault("duration_s", round(time.perf_counter() - started, 2))
                progress.update(run, status)


def wait_for_pretraining(plan: Plan) -> None:
    """Another process pretraining the shared model: wait for it (every run of the sweep needs its result)."""
    held = busy(plan.pretrain.dir)
    if held is not None:
        print(f"study sweep: waiting for the pretraining: {held}", flush=True)
    while held is not None:
        time.sleep(5)
        held = busy(plan.pretrain.dir)


def pretrain(plan: Plan, args, passthrough: list[str], subprocess_mode: bool) -> dict:
    """Train the shared base run (its output in pretrain/sweep.log); its status."""
    if subprocess_mode:
        cmd = run_command(plan.spec_path, "pretrain", plan.quick, passthrough, args.save_dir, args.threads)
        proc = launch_subprocess(cmd, plan.pretrain)
        proc.wait()
        return finish_subprocess(proc, plan.pretrain)
    try:
        with RunLock(plan.pretrain.dir) as lock:
            _say_taken_over(plan.pretrain, lock)
            with run_console(plan.pretrain.dir / "sweep.log", not getattr(args, "verbose", False)):
                return execute_run(plan.pretrain, is_pretrain=True)
    except RunBusy:  # another process started it between our check and now
        wait_for_pretraining(plan)
        return read_status(plan.pretrain.dir) or {"state": "missing"}
