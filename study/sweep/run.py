"""One run of a sweep: its status file, its resume point, its fit (`execute_run`) and `--run-index` (`run_one`).

Every way a run ends is written to its status.json; a rerun skips finished and diverged runs and resumes the
others from their last readable checkpoint. The pool of runs is `study.sweep.pool`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from study import tags
from study.atomic import links_out_of, write_text_atomically
from study.checkpoints import checkpoint_step
from study.errors import one_line
from study.report.read import RESULT_STATES, dotted_get, read_json, read_scalars
from study.sweep.config import Plan, Run
from study.sweep.lock import RunBusy, RunLock

STATUS_FILE = "status.json"
FINAL_STATES = RESULT_STATES  # never rerun; "failed" and "running" (interrupted) are resumed


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
    no metrics) is shorter than the `running` status it replaces, so it needs no new disk blocks. When even that
    fails (no status file yet, or no room for the folder), the status is lost, said on stderr, and the sweep goes
    on: one run's record must never stop the others (a run without a status is redone by the next sweep).
    """
    if not is_rank_zero():
        return
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(run_dir / STATUS_FILE, json.dumps(status, indent=2, default=str))
    except OSError as first:
        compact = {k: status.get(k) for k in ("name", "index", "fingerprint", "state", "reason", "attempts")}
        data = json.dumps(compact, default=str).encode()
        try:
            fd = os.open(run_dir / STATUS_FILE, os.O_RDWR | os.O_NOFOLLOW)  # never a planted link's target
            with os.fdopen(fd, "r+b") as f:  # in place: no new disk blocks
                f.write(data)
                f.truncate(len(data))
        except OSError as second:
            say(
                f"study sweep: could not record {status.get('name', run_dir.name)} as {status.get('state')} "
                f"({type(first).__name__}: {first}; in place: {type(second).__name__}: {second}); going on",
            )


def say(line: str) -> None:
    """Print a line on stderr, which may be a run's log on the full disk that made the line necessary: then the line
    is lost, and the sweep goes on (a full disk is one failed item, never a crash)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()


SETTINGS_FILE = "settings.json"


def write_settings(run: Run) -> None:
    """Record what the run trains with (its settings' fingerprint and its inputs' digests) in its folder, apart from
    status.json and before it trains: a damaged status.json must not let it resume under other settings."""
    if not is_rank_zero():
        return
    record = {"name": run.name, "fingerprint": run.fingerprint, "depends": run.depends}
    write_text_atomically(run.dir / SETTINGS_FILE, json.dumps(record, indent=1))


def recorded_settings(run_dir: Path) -> dict[str, Any] | None:
    """What the run folder says its run trained with: status.json's record, else settings.json's; None if neither
    can be read."""
    for name in (STATUS_FILE, SETTINGS_FILE):
        path = Path(run_dir) / name
        record = read_json(path, []) if path.is_file() and not path.is_symlink() else None
        if record and record.get("fingerprint"):
            return record
    return None


def never_stepped(run_dir: Path) -> bool:
    """Whether the run folder holds no training: its run failed (status failed, at step 0 or none recorded), left no
    checkpoint and logged no training loss."""
    status = read_status(run_dir)
    if not status or status.get("state") != "failed" or status.get("global_step") not in (None, 0):
        return False
    if any((Path(run_dir) / "checkpoints").glob("*.ckpt*")):
        return False
    logged = read_scalars(Path(run_dir)) if any(Path(run_dir).glob("events.out.tfevents.*")) else {}
    return not any(logged.get(tag) for tag in (tags.TRAIN_LOSS, tags.pretrain(tags.TRAIN_LOSS)))


def done(run: Run) -> bool:
    return (read_status(run.dir) or {}).get("state") in FINAL_STATES


def pretrain_done(plan: Plan) -> bool:
    return plan.pretrain is None or (
        done(plan.pretrain) and (plan.pretrain.dir / "hf" / "config.json").is_file()
    )


def pretrained_problem(plan: Plan) -> str | None:
    """Why the sweep's own pretrained model (`pretrain/hf`, built with checksums) cannot be used, in one line naming
    it and what to do; None when there is none yet or it is as built (read whole: `pretrained_model`)."""
    if plan.pretrain is None or not (plan.pretrain.dir / "hf").exists():
        return None
    return pretrained_model(plan.pretrain.dir / "hf", plan.pretrain.dir)[1]


def pretrained_model(hf: Path, pretrain_dir: Path) -> tuple[str | None, str | None]:
    """(content digest, None) of the sweep's pretrained model, every file read whole against the checksums it was
    built with (a size and a modification time restored over changed bytes do not hide them); (None, one line
    naming it and what to do) when it is not as built."""
    from study.cachefolder import verified_digest

    digest, problem = verified_digest(hf)
    if problem is None:
        return digest, None
    return None, (f"the sweep's pretrained model {hf} is damaged ({problem}); no run trains from it: delete "
                  f"{pretrain_dir} to pretrain it again")


def utc_now() -> str:
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


def _tag(run: Run, tag: str) -> str:
    return tags.pretrain(tag) if run.index == "pretrain" else tag


def _validates_after(run: Run, step: int) -> bool:
    """True if the run validates right after the optimizer step that brings it to ``step`` (an integer
    `val_check_interval` of training batches, as the sweeps set it)."""
    interval = dotted_get(run.resolved, "trainer.val_check_interval")
    return isinstance(interval, int) and not isinstance(interval, bool) and interval > 0 and step % interval == 0


def _validated_at(run: Run, step: int, logged: dict) -> bool:
    """Whether the validation of the weights after ``step`` optimizer steps is logged: every validation tag is
    logged at `global_step`, the optimizer steps the validated weights have had (study.model)."""
    return any(s == step for s, _ in logged.get(_tag(run, tags.VAL_LOSS), []))


def _logs_lost_before(run: Run, step: int, logged: dict) -> str | None:
    """Why the logs on disk miss something the run logged before resuming at ``step``: the training loss of the
    last logging step before it (logged at the steps s with (s + 1) % log_every_n_steps == 0), or the validation
    that follows the checkpoint's own step; None when nothing is missing."""
    try:
        every = int(dotted_get(run.resolved, "trainer.log_every_n_steps", 50))
    except (TypeError, ValueError):
        every = 0
    if every > 0 and step >= every:
        expected = step // every * every - 1
        tag = _tag(run, tags.TRAIN_LOSS)
        last = max((s for s, _ in logged.get(tag, [])), default=None)
        if last is None or last < expected:
            return f"{tag} logged through step {last}, step {expected} missing"
    if _validates_after(run, step) and not _validated_at(run, step, logged):
        return f"the validation after step {step - 1} is not logged"
    return None


def _pretrained_model_problem(run: Run) -> str | None:
    """The run's model, when it is its sweep's own pretrained model (`<sweep>/pretrain/hf`), read whole against its
    checksums before the run reads it; its content digest goes into the run's dependencies (what its status and
    settings record), so a run of another pretrained model is never resumed or pooled as this one."""
    model = dotted_get(run.resolved, "model.model_name_or_path")
    hf = Path(str(model)) if model else None
    if hf is None or hf.name != "hf" or hf.parent.name != "pretrain" or hf.parent.parent != run.dir.parent:
        return None
    digest, problem = pretrained_model(hf, hf.parent)
    if digest is not None:
        run.depends = {**run.depends, f"model {model}": digest}
    return problem


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
        "depends": run.depends,  # what it trains with beyond its arguments: a later change is refused
        "state": "running",
        "reason": None,
        "started": utc_now(),
        "attempts": int(previous.get("attempts", 0)) + 1,
        "resumed_from": str(resume) if resume else None,
        "resumed_from_step": step,
        "notes": notes,
        "args": run.args,
    }


def _collapse_events(cli, out: dict[str, Any]) -> str | None:
    """Record the entropy-collapse alerts' events in ``out`` (``collapse_events``); the reason the run stopped when an
    alert with ``action: stop`` ended it, else None."""
    from study.callbacks.collapse import EntropyCollapseAlert

    alerts = [c for c in cli.trainer.callbacks if isinstance(c, EntropyCollapseAlert)]
    events = [event for alert in alerts for event in alert.status_events()]
    if events:
        out["collapse_events"] = events
    stop = next((alert.events[0] for alert in alerts if alert.action == "stop" and alert.events), None)
    if stop is None:
        return None
    return (f"attention entropy collapse in layer {stop['layer']} at step {stop['step']} (H/log n {stop['value']:.3g}, "
            f"{stop['rule']} from {stop['reference']:.3g}); stopped by EntropyCollapseAlert")


def _outcome(cli, guard, is_pretrain: bool, run: Run) -> dict[str, Any]:
    """State and reason of a fit that returned."""
    from study.fit import trained_nothing

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
    if stopped := _collapse_events(cli, out):
        # its own state: the loss did not diverge (claim 6 counts losses), the attention collapsed and the user's
        # alert ended the run; a result all the same, listed with its reason
        return {**out, "state": "collapsed", "reason": stopped}
    if untrained := trained_nothing(cli.trainer):  # Lightning ends a fit with no step quietly: not a result
        return {**out, "state": "failed", "reason": untrained}
    if is_pretrain and is_rank_zero():
        from study.cachefolder import build_atomically
        from study.trained_tokenizer import write_record

        def save(folder: Path) -> None:
            cli.model.model.save_pretrained(folder)
            cli.datamodule.tokenizer.save_pretrained(folder)
            # the tokenizer it trained with, by content: a run that fine-tunes it on another one is refused
            write_record(folder, cli.datamodule.tokenizer, cli.datamodule.tokenizer_origin())

        # built aside, with checksums, renamed into place: every run that trains from it checks it first
        build_atomically(save, run.dir / "hf")
    return {**out, "state": "finished"}


def open_log(log: Path):
    """A run's log opened for appending, never through a link (a planted `sweep.log` link would have the run append
    to its target outside the sweep folder)."""
    return os.fdopen(os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "ab")


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
        with open_log(log) as sink, contextlib.redirect_stdout(sys.__stdout__), contextlib.redirect_stderr(
            sys.__stderr__
        ):
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(OSError):  # a full disk: what is left unwritten is lost, not fatal
                        stream.flush()
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
    from study.resident import max_rss_bytes

    run.dir.mkdir(parents=True, exist_ok=True)
    problem = None
    if links := links_out_of(run.dir):  # planted since the sweep started: nothing of the run is written
        problem = f"{links[0]} is a link out of the sweep folder: refused (remove it)"
    elif not is_pretrain:
        problem = _pretrained_model_problem(run)
    if problem:
        status = {**_new_status(run, read_status(run.dir) or {}, None, None, []), "state": "failed", "reason": problem}
        write_status(run.dir, status)
        return status
    resume, step, notes = resume_point(run.dir / "checkpoints")
    recorded = (recorded_settings(run.dir) or {}).get("fingerprint")
    if resume is not None and recorded != run.fingerprint:
        # status.json and settings.json both unreadable, or made with other settings: the checkpoint's settings are
        # unknown, and resuming could mix two settings in one run. Seeded, starting over rebuilds it exactly.
        notes = [*notes, f"{resume.name} was made under {'other' if recorded else 'unrecorded'} settings "
                 f"(fingerprint {recorded}, now {run.fingerprint}): starting over"]
        resume, step = None, None
    max_steps = _max_steps(run)
    if resume is not None and max_steps is not None and step >= max_steps:
        # Killed after its final checkpoint but before the end of the run: Lightning logs a step's metrics after
        # that step's checkpoint, and the last validation and status come later still. Resuming would train
        # nothing and log nothing, so those would be missing for good; the run is seeded, so starting over
        # rebuilds it exactly (tests/test_sweep_fault_injection.py).
        notes = [*notes, f"{resume.name} holds the whole training (step {step}) but the run was stopped before it "
                 "logged and recorded its end: starting over"]
        resume, step = None, None
    purge = step
    if resume is not None:
        logged = read_scalars(run.dir)
        if lost := _logs_lost_before(run, step, logged):
            # Lightning logs the step that writes a checkpoint (and runs its validation) after writing it; a kill
            # in between loses those logs, and a resumed attempt starts after them. Seeded, the run starting over
            # rebuilds them exactly.
            notes = [*notes, f"{resume.name} is at step {step} but the logs end before it ({lost}): starting over"]
            resume, step = None, None
        elif _validated_at(run, step, logged):
            # The validation after the checkpoint's step is logged (the monitors' at the checkpoint's step) and the
            # resumed attempt does not run it again: keep step `step`, purge from the next one.
            purge = step + 1
    previous = read_status(run.dir) or {}
    status = _new_status(run, previous, resume, step, notes)
    write_settings(run)
    for note in status["notes"]:
        if is_rank_zero():
            print(f"{run.name}: {note}", flush=True)
    write_status(run.dir, status)
    start = time.perf_counter()
    # steps logged after the checkpoint (or by an attempt with no usable checkpoint) are dropped from TensorBoard
    purge = purge if resume else (0 if list(run.dir.glob("events.out.tfevents.*")) else None)
    args = list(run.args) + ([f"--trainer.logger.init_args.purge_step={purge}"] if purge is not None else [])
    cli = None
    try:
        cli = lightning_main(args, run=False, save_config_kwargs={"overwrite": True})
        # what this attempt runs (code, configs, libraries, machine): the sweep compares its source hash with its own
        status["provenance"] = cli.provenance
        status["attempt_sources"] = attempt_sources(previous, cli.provenance, resumed=resume is not None)
        write_status(run.dir, status)
        guard = next((c for c in cli.trainer.callbacks if isinstance(c, NonFiniteGuard)), None)
        cli.trainer.fit(
            cli.model, datamodule=cli.datamodule, ckpt_path=str(resume) if resume else None, weights_only=True
        )  # weights_only: a checkpoint is unpickled as data only, never as code (study.checkpoints)
        status.update(_outcome(cli, guard, is_pretrain, run))
    except Exception as err:  # noqa: BLE001 - a failed run is recorded and does not stop the sweep
        status.update(state="failed", reason=f"{type(err).__name__}: {one_line(err)}")  # one line in the console
        if is_rank_zero():
            try:
                write_text_atomically(run.dir / "error.txt", traceback.format_exc())
            except OSError:  # a full disk: the status (written in place) still says why
                pass
    except BaseException as err:  # Ctrl-C (Lightning turns it into SystemExit(1)), SIGTERM: record, then stop
        cause = err.__context__ if isinstance(err, SystemExit) and err.__context__ else err
        status.update(state="failed", reason=f"interrupted: {type(cause).__name__} {cause}".strip())
        if isinstance(err, SystemExit) and not err.code:  # Lightning's SIGTERMException exits 0: it must not
            raise SystemExit(128 + 15 if "SIGTERM" in type(err).__name__ else 1) from err
        raise
    finally:
        # the process's peak resident memory: the run's own in a pool subprocess, the sweep's so far in process
        status.update(ended=utc_now(), duration_s=round(time.perf_counter() - start, 2), max_rss_bytes=max_rss_bytes())
        write_status(run.dir, status)
        del cli
        gc.collect()
    return status


def attempt_sources(previous: dict[str, Any], record: dict[str, Any] | None, resumed: bool) -> list[str]:
    """The source hashes of the attempts whose training the run's weights carry: the earlier attempts' when this
    one resumes from their checkpoint (a sweep stopped, the code changed, the sweep rerun), then this one's. The
    report reads a run with several as pooling them (`study.provenance.recorded_source`)."""
    from study.provenance import UNRECORDED, recorded_source

    earlier = previous.get("attempt_sources") if resumed else None
    if resumed and not isinstance(earlier, list):  # an attempt recorded before this list existed
        earlier = [] if recorded_source(previous) == UNRECORDED else [recorded_source(previous)]
    return [*(earlier or []), recorded_source({"provenance": record})]


# ---- one run of the plan, under its lock (`study sweep --run-index`) -----------------------------------------
def run_index_refused(plan: Plan, index: str) -> str | None:
    """Why ``--run-index index`` names no run of the plan (one line), or None."""
    if index == "pretrain":
        return "this sweep has no pretraining run" if plan.pretrain is None else None
    try:
        if int(index) < 0:  # a Python index from the end would run another run
            raise IndexError(index)
        plan.runs[int(index)]
    except (ValueError, IndexError):
        return f"--run-index {index!r} is not in 0..{len(plan.runs) - 1} or 'pretrain'"
    return None


def run_one(plan: Plan, index: str) -> int:
    if refused := run_index_refused(plan, index):
        print(f"study sweep: {refused}", file=sys.stderr)
        return 2
    if index == "pretrain":
        run, is_pretrain = plan.pretrain, True
    else:
        run, is_pretrain = plan.runs[int(index)], False
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
            say_taken_over(run, lock)
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


def say_taken_over(run: Run, lock: RunLock) -> None:
    if lock.taken_over:
        print(
            f"{run.name}: taking over the lock of pid {lock.taken_over.get('pid')} on {lock.taken_over.get('host')}"
            " (that process is gone)",
            flush=True,
        )
