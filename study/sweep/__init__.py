"""`study sweep`: a grid of `study fit` runs (temperature x top_k x normalizer x seed) with resume and a report.

    study sweep --config configs/sweeps/default.yaml            # the embedded main job (CPU, < 15 min)
    study sweep --config configs/sweeps/default.yaml --quick    # its smoke version (< 1 min)
    study sweep --config X --dry-run                            # validate and print the plan, run nothing
    study sweep --config X --parallel 4 [--devices-per-run 2]   # subprocesses, each pinned to its GPUs
    study sweep --config X --trainer.devices=2 --trainer.strategy=ddp   # each run on 2 devices (DDP)
    study sweep --config X --run-index 7                        # one run of the plan (SLURM / torchrun arrays)
    study sweep --config X --run-index pretrain                 # the shared pretraining run

Layout under `<save_dir>/<name>/` (name = the YAML's `name`, `-quick` appended with --quick):

    plan.json                    every run, its parameters, its `study fit` arguments and resolved settings
    pretrain/                    the pretraining run (if the sweep has one); pretrain/hf = save_pretrained model
    T0.1_k4_softmax_s0/          one run: TensorBoard events, config.yaml, hparams, checkpoints/, status.json
    probe/probe.json             `study probe` on the frozen model (the spec's `probe:` section; + figure, events)
    report/report.md             `study report` output (figures beside it)

A run's `status.json` says running / finished / failed / diverged, with the reason. Rerunning the sweep skips
finished and diverged runs and resumes the others from their `checkpoints/last.ckpt`. Extra `--trainer.*`,
`--model.*`, `--data.*` arguments are passed to every run (they are part of its settings).

Spec format: see `configs/sweeps/default.yaml` (every key commented) and `study.sweep.spec`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from study.sweep.runner import (
    FINAL_STATES,
    Progress,
    execute_run,
    finish_subprocess,
    fmt_duration,
    is_rank_zero,
    launch_subprocess,
    plan_estimate,
    probe,
    read_status,
    run_command,
)
from study.sweep.spec import Plan, Run, SweepSpecError, build_plan

__all__ = ["SweepSpecError", "build_plan", "main"]

PASSTHROUGH_PREFIXES = ("--trainer.", "--model.", "--data.", "--seed_everything")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="study sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", required=True, help="sweep YAML (configs/sweeps/<name>.yaml)")
    p.add_argument(
        "--quick", action="store_true", help="apply the spec's `quick` section (fewer runs and steps)"
    )
    p.add_argument(
        "--run-index", default=None, help="run only this run of the plan (an index, or 'pretrain')"
    )
    p.add_argument(
        "--parallel", type=int, default=1, help="runs at once, as subprocesses (default 1: in-process)"
    )
    p.add_argument(
        "--devices-per-run",
        type=int,
        default=1,
        help="GPUs pinned to each parallel run (CUDA_VISIBLE_DEVICES)",
    )
    p.add_argument(
        "--save-dir", default=None, help="root folder of sweeps (default: the spec's save_dir or logs)"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads per run (default: the spec's `threads`)"
    )
    p.add_argument("--dry-run", action="store_true", help="validate, print the plan and exit")
    p.add_argument("--no-report", action="store_true", help="do not build the report at the end")
    p.add_argument(
        "--no-estimate", action="store_true", help="skip the timing probe (no up-front time estimate)"
    )
    return p


def _done(run: Run) -> bool:
    return (read_status(run.dir) or {}).get("state") in FINAL_STATES


def _pretrain_done(plan: Plan) -> bool:
    return plan.pretrain is None or (
        _done(plan.pretrain) and (plan.pretrain.dir / "hf" / "config.json").is_file()
    )


def _check_stale(plan: Plan) -> None:
    runs = ([plan.pretrain] if plan.pretrain else []) + plan.runs
    for run in runs:
        status = read_status(run.dir)
        if status and status.get("fingerprint") not in (None, run.fingerprint):
            raise SweepSpecError(
                f"{run.dir} was made with other settings (fingerprint {status.get('fingerprint')} != {run.fingerprint}); "
                "delete it or give the sweep another name"
            )


def _needs_subprocess(plan: Plan, passthrough: list[str]) -> bool:
    """DDP inside the sweep process would relaunch the whole sweep per rank: run each such run as a subprocess."""
    run = plan.runs[0]
    trainer = run.resolved.get("trainer") or {}
    devices, strategy = str(trainer.get("devices", "auto")), str(trainer.get("strategy", "auto"))
    for arg in passthrough:
        if arg.startswith("--trainer.devices="):
            devices = arg.split("=", 1)[1]
        if arg.startswith("--trainer.strategy="):
            strategy = arg.split("=", 1)[1]
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


def _run_one(plan: Plan, index: str) -> int:
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
        if not _pretrain_done(plan):
            print(
                f"study sweep: run the pretraining first (--run-index pretrain): {plan.pretrain.dir}",
                file=sys.stderr,
            )
            return 2
    if _done(run):
        print(f"{run.name}: already {read_status(run.dir)['state']}, skipped", flush=True)
        return 0
    status = execute_run(run, is_pretrain=is_pretrain)
    if is_rank_zero():
        print(
            f"{run.name}: {status['state']} in {status.get('duration_s', 0):.1f}s"
            + (f" ({status['reason']})" if status.get("reason") else ""),
            flush=True,
        )
    return 0 if status["state"] in FINAL_STATES else 1


def _run_pool(plan: Plan, todo: list[Run], args, passthrough: list[str], progress: Progress) -> list[dict]:
    slots = _gpu_groups(args.parallel, args.devices_per_run) if args.parallel > 1 else [None]
    pending, active, results = list(todo), {}, []
    while pending or active:
        for slot, gpus in enumerate(slots):
            if slot not in active and pending:
                run = pending.pop(0)
                env = {"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {}
                cmd = run_command(plan.spec_path, run.index, plan.quick, passthrough, args.save_dir)
                active[slot] = (run, launch_subprocess(cmd, run, env), time.perf_counter())
        time.sleep(0.2)
        for slot in list(active):
            run, proc, started = active[slot]
            if proc.poll() is not None:
                del active[slot]
                status = finish_subprocess(proc, run)
                status.setdefault("duration_s", round(time.perf_counter() - started, 2))
                progress.update(run, status)
                results.append(status)
    return results


def main(argv: list[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    bad = [a for a in rest if not a.startswith(PASSTHROUGH_PREFIXES)]
    if bad:
        print(
            f"study sweep: unknown argument(s) {bad}; only --trainer.*, --model.*, --data.* pass through to runs",
            file=sys.stderr,
        )
        return 2
    passthrough = list(rest)
    try:
        plan = build_plan(args.config, quick=args.quick, passthrough=passthrough, save_dir=args.save_dir)
        _check_stale(plan)
    except SweepSpecError as err:
        print(f"study sweep: bad sweep spec {args.config}: {err}", file=sys.stderr)
        return 2
    if args.parallel < 1 or args.devices_per_run < 1:
        print("study sweep: --parallel and --devices-per-run must be >= 1", file=sys.stderr)
        return 2
    threads = args.threads or plan.threads
    if threads:
        import os

        import torch

        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # for run subprocesses
    if args.run_index is not None:
        return _run_one(plan, args.run_index)

    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    (plan.sweep_dir / "plan.json").write_text(json.dumps(plan.as_dict(), indent=2, default=str))
    if args.dry_run:
        for run in plan.runs:
            print(f"{run.index:>3} {run.name}  study fit {' '.join(run.args)}")
        print(f"{len(plan.runs)} runs; plan written to {plan.sweep_dir / 'plan.json'}")
        return 0

    todo = [r for r in plan.runs if not _done(r)]
    pretrain_todo = not _pretrain_done(plan)
    subprocess_mode = args.parallel > 1 or _needs_subprocess(plan, passthrough)
    print(
        f"study sweep {plan.name}: {len(plan.runs)} runs ({len(plan.runs) - len(todo)} already done)"
        + (", pretraining first" if pretrain_todo else (", pretrained model cached" if plan.pretrain else ""))
        + f" -> {plan.sweep_dir}"
        + (f"; {args.parallel} at a time" if args.parallel > 1 else ""),
        flush=True,
    )
    estimate = timing = None
    if (todo or pretrain_todo) and not args.no_estimate:
        probe_run = next((r for r in todo if r.params.get("top_k") is not None), (todo or plan.runs)[0])
        probe_run = Run(
            probe_run.index,
            probe_run.name,
            probe_run.dir,
            probe_run.params,
            [
                a
                for a in probe_run.args
                if not (a.startswith("--model.model_name_or_path=") and pretrain_todo)
            ],
            probe_run.resolved,
        )
        try:
            timing = probe(probe_run)
        except Exception as err:  # noqa: BLE001 - the runs will report the same problem with its context
            timing = None
            print(f"no time estimate: the timing probe failed ({type(err).__name__}: {err})", flush=True)
    if timing is not None:
        estimate = plan_estimate(plan, todo, pretrain_todo, timing, args.parallel)
        print(
            f"Estimated time: about {fmt_duration(estimate)} (min:s) for {len(todo)} runs"
            + (" + pretraining" if pretrain_todo else "")
            + f", from a measured {timing['step_s'] * 1000:.0f} ms/step and {timing['setup_s']:.1f} s setup per run"
            f" (probe on {probe_run.name}).",
            flush=True,
        )
    start = time.perf_counter()
    if pretrain_todo:
        print(f"pretraining -> {plan.pretrain.dir}", flush=True)
        if subprocess_mode:
            proc = launch_subprocess(
                run_command(plan.spec_path, "pretrain", plan.quick, passthrough, args.save_dir), plan.pretrain
            )
            proc.wait()
            status = finish_subprocess(proc, plan.pretrain)
        else:
            status = execute_run(plan.pretrain, is_pretrain=True)
        print(
            f"pretrain: {status['state']} in {fmt_duration(time.perf_counter() - start)}"
            + (f" ({status['reason']})" if status.get("reason") else ""),
            flush=True,
        )
        if status["state"] != "finished":
            print("study sweep: pretraining did not finish; the fine-tuning runs need it", file=sys.stderr)
            return 1
    remaining_estimate = None
    if estimate is not None and todo:
        remaining_estimate = max(estimate - (time.perf_counter() - start), 0.0) * len(plan.runs) / len(todo)
    progress = Progress(len(plan.runs), args.parallel, remaining_estimate)
    for run in plan.runs:
        if run not in todo:
            progress.update(run, read_status(run.dir) or {}, skipped=True)
    if subprocess_mode:
        results = _run_pool(plan, todo, args, passthrough, progress)
    else:
        results = []
        for run in todo:
            results.append(execute_run(run))
            progress.update(run, results[-1])
    states = [(read_status(r.dir) or {}).get("state", "missing") for r in plan.runs]
    counts = {s: states.count(s) for s in sorted(set(states))}
    print(
        f"study sweep {plan.name}: done in {fmt_duration(time.perf_counter() - start)}: {counts}", flush=True
    )
    probe_ok = _run_probe(plan)
    if plan.report and not args.no_report:
        from study.report import build_report

        path = build_report(plan.sweep_dir)
        print(f"report: {path}", flush=True)
    return 0 if all(s in FINAL_STATES for s in states) and probe_ok else 1


def _run_probe(plan: Plan) -> bool:
    """`study probe` with the spec's `probe:` options, unless probe.json from the same arguments exists."""
    if not plan.probe:
        return True
    from study.probe import main as probe_main

    done = plan.sweep_dir / "probe" / "probe.json"
    if done.is_file() and json.loads(done.read_text()).get("argv") == plan.probe:
        print(f"probe: cached ({done})", flush=True)
        return True
    print(f"probe -> {done.parent}", flush=True)
    if probe_main(plan.probe) != 0:
        print("study sweep: the probe failed; the report goes without it", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
