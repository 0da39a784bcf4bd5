"""`study sweep` command line: parse, check the plan and the options, dispatch to one run or to the pool of
runs (with the frozen-model steps beside them when there are several slots), then those steps and the report.
The usage is the package's docstring (`study.sweep`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from study.atomic import write_text_atomically
from study.hparams import HPARAMS_METRICS, write_experiment
from study.progress import format_seconds
from study.sweep import spec_identity
from study.sweep.config import Plan, Run, SweepConfigError, build_plan
from study.sweep.frozen_steps import frozen_steps, refused_frozen_args, run_step_here
from study.sweep.identity import changed_dependencies
from study.sweep.lock import busy
from study.sweep.pool import (
    WORKER_DONE,
    WORKER_RUN_FAILED,
    WORKER_SOURCE_CHANGED,
    Stopped,
    SweepProgress,
    needs_subprocess,
    pretrain,
    run_in_process,
    run_pool,
    run_workers,
    stopped_by_signals,
    wait_for_pretraining,
)
from study.sweep.run import (
    FINAL_STATES,
    done,
    is_rank_zero,
    links_out_of,
    never_stepped,
    pretrain_done,
    pretrained_model,
    pretrained_problem,
    read_status,
    recorded_settings,
    run_index_refused,
    run_one,
)
from study.sweep.source import SPEC_AFTER, SourceChanged, SourceWatch, done_elsewhere
from study.sweep.spec_identity import spec_change
from study.sweep.view import command_line, main_arm

PASSTHROUGH_PREFIXES = ("--trainer.", "--model.", "--data.", "--seed_everything")


def _parser() -> argparse.ArgumentParser:
    import study.sweep

    p = argparse.ArgumentParser(
        prog="study sweep", description=study.sweep.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
        "--workers", type=int, default=1,
        help="processes that each train runs one after another (start-up paid once per worker, not per run; "
        "for many short single-device runs); default 1: this process",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one of --workers' processes
    # a run process of a sweep: the spec's digest when the sweep started (study.sweep.spec_identity)
    p.add_argument("--spec-digest", default=None, help=argparse.SUPPRESS)
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
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show each run's full output live (default: one line per run here, the rest in <run>/sweep.log)",
    )
    p.add_argument("--dry-run", action="store_true", help="validate, print the plan and exit")
    p.add_argument("--no-report", action="store_true", help="do not build the report at the end")
    p.add_argument(
        "--no-estimate", action="store_true", help="skip timing a few steps (no up-front time estimate)"
    )
    return p


def _check_stale(plan: Plan) -> list[Run]:
    """Refuse a plan whose runs on disk were made with other settings, or with other content of what they read
    (base config, data, model): resuming or pooling them would mix two settings under one name. A run folder whose
    run failed before its first step holds no result to mix: it is returned, to be replaced (`_replace_unstarted`)."""
    runs = ([plan.pretrain] if plan.pretrain else []) + plan.runs
    # the sweep's own pretrained model: compared once it exists (a run recorded before runs recorded it is not)
    own_model = f"model {plan.pretrain.dir / 'hf'}" if plan.pretrain else None
    replaced = []
    for run in runs:
        status = recorded_settings(run.dir)  # status.json, else settings.json when status.json is damaged
        recorded = (status or {}).get("depends")
        now = run.depends
        if isinstance(recorded, dict) and (own_model not in recorded or own_model not in now):
            recorded, now = ({k: v for k, v in d.items() if k != own_model} for d in (recorded, now))
        changes = changed_dependencies(recorded, now) if isinstance(recorded, dict) else []
        other = bool(status) and status.get("fingerprint") not in (None, run.fingerprint)
        if (other or changes) and never_stepped(run.dir):
            replaced.append(run)
            continue
        if other:
            raise SweepConfigError(
                f"{run.dir} was made with other settings (fingerprint {status.get('fingerprint')} != {run.fingerprint}); "
                "delete it or give the sweep another name"
            )
        if changes:
            raise SweepConfigError(
                f"run {run.name} was trained with other inputs than this sweep would use now: {'; '.join(changes)}. "
                f"Restore them, or delete {run.dir} (and any other such run) to redo it, or give the sweep another "
                "name; runs made with different inputs are never pooled"
            )
    return replaced


def _replace_unstarted(runs: list[Run]) -> None:
    """Remove the folders of runs that failed before their first step under other settings (a bad value fixed
    since), each said in one line; a folder another process holds is left to it."""
    for run in runs:
        if busy(run.dir) is not None or not never_stepped(run.dir):
            continue
        shutil.rmtree(run.dir)
        print(f"study sweep: {run.dir} failed before its first step under other settings: replaced by this "
              "sweep's run", file=sys.stderr, flush=True)


def _check_pretrained(plan: Plan) -> str | None:
    """After the pretraining: the sweep's pretrained model read whole against its checksums, its content digest
    given to every run, and the runs on disk checked against it (`_check_stale`); why the sweep cannot go on, or
    None."""
    hf = plan.pretrain.dir / "hf"
    digest, problem = pretrained_model(hf, plan.pretrain.dir)
    if problem:
        return problem
    for run in plan.runs:
        run.depends = {**run.depends, f"model {hf}": digest}
    try:
        _replace_unstarted(_check_stale(plan))
    except SweepConfigError as err:
        return str(err)
    return None


def _refused_args(plan: Plan, run_index: str | None) -> str | None:
    """Parse and check (`study.fit.preflight`) the `study fit` arguments of every run of the plan still to train (or
    of the one run asked for), before any starts; a finished run trains nothing, and its settings are its
    fingerprint's (`_check_stale`)."""
    from study.fit import check_fit_args

    runs = ([plan.pretrain] if plan.pretrain else []) + plan.runs
    if run_index is not None:
        runs = [r for r in runs if str(r.index) == str(run_index)]
    for run in runs:
        if done(run):
            continue
        message = check_fit_args(run.args)
        if message:
            return f"run {run.name}: `study fit` refuses its arguments: {message}"
    return None


def divergences(plan: Plan, states: list[str]) -> str:
    """The closing line's account of diverged runs: those of the arms beside the main grid (planned: an SGD
    bracket is there to find where training breaks) apart from those of the main arm (not planned), by name."""
    diverged = [run.name for run, state in zip(plan.runs, states) if state == "diverged"]
    if not diverged:
        return ""
    main = main_arm((run.name, run.params) for run in plan.runs)
    planned, unplanned = [n for n in diverged if n not in main], [n for n in diverged if n in main]
    parts = [f"{len(planned)} in the arms beside the main grid ({', '.join(planned)})" if planned else "",
             f"{len(unplanned)} in the main arm, not planned ({', '.join(unplanned)})" if unplanned
             else "none in the main arm"]  # fmt: skip
    return "; diverged: " + ", ".join(p for p in parts if p)


def tensorboard_additions(plan: Plan) -> str:
    """What TensorBoard shows beside the runs once they are done: each setting's step-0 validation shared into its
    runs that did not measure it (`shared_baseline`) and the main arm's mean over seeds per T (`seed_means`); the
    report reads neither. Returns "" or the closing line's note of why they were not written (a full disk)."""
    from study.report.read import read_scalars
    from study.sweep.seed_means import write_seed_means
    from study.sweep.shared_baseline import share_step0_validation

    states = {r.name: (read_status(r.dir) or {}).get("state", "missing") for r in plan.runs}
    try:
        scalars = {r.name: read_scalars(r.dir) for r in plan.runs if states[r.name] in FINAL_STATES}
        share_step0_validation(plan.runs, states, scalars)
        write_seed_means(plan.sweep_dir, plan.runs, states, scalars)
    except OSError as err:
        return f"; TensorBoard's shared baselines and means over seeds not written ({type(err).__name__}: {err})"
    return ""


def _finish(plan: Plan, args, start: float, outcomes: dict[str, bool | None]) -> int:
    """The frozen-model steps the pool did not run (`study.sweep.frozen_steps`), the report (unless other
    processes still hold runs or steps) and the sweep's closing line; the exit code."""
    states = [(read_status(r.dir) or {}).get("state", "missing") for r in plan.runs]
    counts = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
    elsewhere = [r.name for r in plan.runs if busy(r.dir) is not None]
    if not elsewhere:
        for step in frozen_steps(plan):
            if step.label not in outcomes:
                outcomes[step.label] = run_step_here(step, quiet=not args.verbose)
        elsewhere = [label for label, outcome in outcomes.items() if outcome is None]
    if elsewhere:
        print(
            f"study sweep {plan.name}: {counts} in {format_seconds(time.perf_counter() - start)}; "
            f"{len(elsewhere)} run(s) or step(s) are being run by other processes ({', '.join(elsewhere)}): report "
            f"not built here; the last of them builds it (or, then: study report {plan.sweep_dir})",
            flush=True,
        )
        return 0
    additions = tensorboard_additions(plan)
    report, report_failed, then = None, None, "once there is room"
    if plan.report and not args.no_report:
        from study.report import build_report
        from study.report.build import ReportRefused
        from study.report.origin import ALLOW_OPTION, MixedModels, MixedSources

        try:
            report = build_report(plan.sweep_dir)
        except OSError as err:  # a full disk: the report is one failed item; the runs and their logs stand
            report_failed = f"{type(err).__name__}: {err}"
        except MixedModels as err:  # runs of another pretrained model, beside this sweep's: never pooled
            report_failed, then = f"refused: {err}", "once the runs of one model are deleted"
        except MixedSources as err:  # runs done before a change of the code, beside this sweep's
            report_failed, then = f"refused: {err}", f"{ALLOW_OPTION} to pool them anyway"
        except ReportRefused as err:  # a link planted out of the sweep while it ran
            report_failed, then = f"refused: {err}", "once it is removed"
    print(
        f"study sweep {plan.name}: {counts} in {format_seconds(time.perf_counter() - start)}"
        + divergences(plan, states)
        + additions
        + (f"; report: {report}" if report else "")
        + (f"; report not built ({report_failed}): study report {plan.sweep_dir} {then}" if report_failed else "")
        + f"; TensorBoard: {command_line(plan.sweep_dir)}",
        flush=True,
    )
    steps_ok = all(outcome is not False for outcome in outcomes.values())
    return 0 if all(s in FINAL_STATES for s in states) and steps_ok and not report_failed else 1


def _checked_plan(args, rest: list[str]) -> Plan | int:
    """The plan, with the spec, every run's `study fit` arguments and the options checked; else an exit code."""
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
    except SweepConfigError as err:
        print(f"study sweep: bad sweep spec {args.config}: {err}", file=sys.stderr)
        return 2
    if links := links_out_of(plan.sweep_dir):
        print(f"study sweep: {links[0]} is a link out of the sweep folder {plan.sweep_dir}: the sweep writes only "
              f"inside it; remove the link{f' (and {len(links) - 1} more)' if len(links) > 1 else ''}",
              file=sys.stderr)
        return 2
    if damaged := pretrained_problem(plan):  # before the runs are compared with its digest: the damage is named
        print(f"study sweep: {damaged}", file=sys.stderr)
        return 2
    try:
        plan.replace = _check_stale(plan)
    except SweepConfigError as err:
        print(f"study sweep: bad sweep spec {args.config}: {err}", file=sys.stderr)
        return 2
    for note in plan.notes:
        if is_rank_zero():
            print(f"study sweep: {note}", file=sys.stderr, flush=True)
    if refused := _refused_options(args):
        print(f"study sweep: {refused}", file=sys.stderr)
        return 2
    if args.workers > 1 and (args.parallel > 1 or args.run_index is not None or needs_subprocess(plan)):
        print("study sweep: --workers trains runs in its worker processes; it does not combine with --parallel, "
              "--run-index or runs on several devices (DDP), which need one process per run", file=sys.stderr)
        return 2
    if args.devices_per_run > 1 and args.parallel == 1:
        print("study sweep: --devices-per-run pins the GPUs of --parallel runs; with one run at a time use "
              "--trainer.devices=N", file=sys.stderr)
        return 2
    if args.run_index is not None and (refused := run_index_refused(plan, args.run_index)):
        print(f"study sweep: {refused}", file=sys.stderr)
        return 2
    refused = _refused_args(plan, args.run_index) or refused_frozen_args(plan)
    if refused:
        print(f"study sweep: {refused}; nothing was run", file=sys.stderr)
        return 2
    return plan


def _refused_options(args) -> str | None:
    """The one line naming a process option out of what this machine can run (None: all fit): runs and workers at
    once within its cores (or GPUs, for runs pinned to them), torch threads within its cores."""
    from study.errors import BadValue, check_int

    cores = os.cpu_count() or 1
    slots = max(cores, _gpus())
    try:
        if args.threads is not None:  # None: the spec's `threads`
            check_int("--threads", args.threads, 1, cores)
        check_int("--parallel", args.parallel, 1, slots)
        check_int("--workers", args.workers, 1, cores)
        check_int("--devices-per-run", args.devices_per_run, 1)
    except BadValue as err:
        return f"{err} (this machine has {cores} cores" + (f" and {slots} GPUs)" if slots > cores else ")")
    return None


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    if args.spec_digest and (changed := spec_change(args.config, args.spec_digest)):
        # a run process launched by a sweep: its plan would be built from another spec than the sweep's
        print(f"study sweep: refused: {changed} since the sweep launched this run; {SPEC_AFTER}", file=sys.stderr)
        return 2
    plan = _checked_plan(args, rest)
    if isinstance(plan, int):
        return plan
    try:  # before anything is written: one sweep name, one spec
        claim = spec_identity.claim(plan.sweep_dir, plan.shared_hash, plan.spec_path, write=not args.dry_run)
    except spec_identity.SpecConflict as err:
        print(f"study sweep: refused: {err}", file=sys.stderr)
        return 2
    try:
        return _claimed(plan, args, rest)
    finally:
        claim.release()


def _claimed(plan: Plan, args, rest: list[str]) -> int:
    """`main` once the plan is checked and the sweep name claimed for its spec."""
    passthrough = list(rest)
    threads = args.threads or plan.threads
    if threads:
        import torch

        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # for run subprocesses
    if not args.dry_run:
        _replace_unstarted(plan.replace)
    if args.run_index is not None:
        return run_one(plan, args.run_index)

    if args.worker:  # one of --workers' processes: the parent wrote the plan, shows progress and builds the report
        return _work(plan)
    if args.dry_run:  # writes nothing: a smaller grid under an existing sweep's name must not replace its plan
        for run in plan.runs:
            print(f"{run.index:>3} {run.name}  study fit {' '.join(run.args)}")
        print(f"{len(plan.runs)} runs; nothing written (a sweep writes its plan to {plan.sweep_dir / 'plan.json'})")
        return 0
    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    # several workers may write it at once: each whole, under a name of its own
    write_text_atomically(plan.sweep_dir / "plan.json", json.dumps(plan.as_dict(), indent=2, default=str))
    write_experiment(plan.sweep_dir, plan.hparams_domains(), HPARAMS_METRICS, description=f"study sweep {plan.name}")

    try:
        return _sweep(plan, args, passthrough)
    except SourceChanged as changed:
        print(f"study sweep {plan.name}: stopped: {changed}", file=sys.stderr, flush=True)
        return 2


def _work(plan: Plan) -> int:
    """A `--workers` process: train every run it can lock, one after another (`study.sweep.pool.WORKER_EXITS`).
    A signal at any point, inside a run's fit or between runs, is recorded in the run it stops, then ends the
    worker."""
    watch = SourceWatch([plan.base], spec=(plan.spec_path, plan.spec_digest))
    todo = [r for r in plan.runs if not done(r)]
    try:
        with stopped_by_signals():
            run_in_process(todo, SweepProgress(len(todo)), quiet=True, watch=watch)
    except SourceChanged as changed:
        print(f"study sweep {plan.name} (worker): stopped: {changed}", file=sys.stderr, flush=True)
        return WORKER_SOURCE_CHANGED
    except Stopped as stop:
        return 128 + stop.signum
    states = [(read_status(r.dir) or {}).get("state") for r in todo]
    return WORKER_DONE if all(s in FINAL_STATES for s in states if s is not None) else WORKER_RUN_FAILED


def _sweep(plan: Plan, args, passthrough: list[str]) -> int:
    """The pretraining, the runs and the frozen-model steps of a checked plan, then the report; the exit code.
    The source hash is taken here and watched to the end (`study.sweep.source`)."""
    watch = SourceWatch([plan.base], spec=(plan.spec_path, plan.spec_digest))
    if note := done_elsewhere({r.name: read_status(r.dir) for r in plan.runs}, watch.expected):
        print(f"study sweep {plan.name}: {note}", file=sys.stderr, flush=True)
    todo = [r for r in plan.runs if not done(r)]
    pretrain_todo = not pretrain_done(plan)
    subprocess_mode = args.parallel > 1 or needs_subprocess(plan)
    print(
        f"study sweep {plan.name}: {len(plan.runs)} runs ({len(plan.runs) - len(todo)} already done)"
        + (", pretraining first" if pretrain_todo else (", pretrained model cached" if plan.pretrain else ""))
        + f" -> {plan.sweep_dir}"
        + (f"; {args.parallel} at a time" if args.parallel > 1 else "")
        + (f"; {args.workers} worker processes" if args.workers > 1 else ""),
        flush=True,
    )
    estimate = None
    if (todo or pretrain_todo) and not args.no_estimate:
        from study.sweep.estimate import estimate_time

        estimate = estimate_time(plan, todo, pretrain_todo, max(args.parallel, args.workers), quiet=not args.verbose,
                                 subprocesses=subprocess_mode)
    start = time.perf_counter()
    if plan.pretrain is not None:
        wait_for_pretraining(plan)
        pretrain_todo = not pretrain_done(plan)
    if pretrain_todo:
        status = pretrain(plan, args, passthrough, subprocess_mode, watch)
        print(
            f"pretrain: {status['state']} in {format_seconds(time.perf_counter() - start)} ({plan.pretrain.dir})"
            + (f": {status['reason']}" if status.get("reason") else ""),
            flush=True,
        )
        if status["state"] != "finished":
            print("study sweep: pretraining did not finish; the fine-tuning runs need it", file=sys.stderr)
            return 1
    if plan.pretrain is not None and (refused := _check_pretrained(plan)):
        print(f"study sweep {plan.name}: {refused}", file=sys.stderr, flush=True)
        return 2
    remaining_estimate = None
    if estimate is not None and todo:
        remaining_estimate = max(estimate - (time.perf_counter() - start), 0.0) * len(plan.runs) / len(todo)
    progress = SweepProgress(len(plan.runs), max(args.parallel, args.workers), remaining_estimate)
    for run in plan.runs:
        if run not in todo:
            progress.update(run, read_status(run.dir) or {}, skipped=True)
    outcomes: dict[str, bool | None] = {}
    if args.workers > 1:
        run_workers(plan, todo, args, passthrough, progress, watch)
    elif subprocess_mode:
        # With several slots the frozen-model steps (independent of the runs) go first, beside the runs.
        steps = frozen_steps(plan) if args.parallel > 1 else []
        outcomes = run_pool(plan, todo, args, passthrough, progress, steps, watch)
    else:
        run_in_process(todo, progress, quiet=not args.verbose, watch=watch)
    watch.check("before the frozen-model steps and the report")
    return _finish(plan, args, start, outcomes)


if __name__ == "__main__":
    sys.exit(main())
