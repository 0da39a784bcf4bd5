"""Load a sweep's runs: parameters, status and scalar series from the event files.

A damaged file (a truncated plan.json or status.json) is named in `problems` and the other runs are read as
usual; a run whose status cannot be read has the state "unreadable".

Event files are verified before a run counts (`event_damage`): every record's masked CRC-32C (TensorBoard's own
record reader checks them, but its event loader takes a failed check for a truncated record and silently stops
there, so a damaged file read as a shorter run), and a run that finished must have logged its final validation (a
file cut short, or deleted, would otherwise report an earlier value, even the step-0 baseline, as the result). A
run that fails either check gets the state "damaged" and is named, never counted. A kill leaves a truncated last
record in that attempt's file; the next attempt writes a new file, so a truncated tail is read up to and not
reported, as long as the run's record of steps is complete.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study import tags

EVENT_FILES = "events.out.tfevents.*"
DAMAGED = "damaged"
# A run's recorded states whose outcome is a result: trained to the end ("finished"), stopped by the non-finite
# guard ("diverged": an instability is a result) or by an entropy-collapse alert with `action: stop` ("collapsed").
# A run still running, killed, failed, missing or unreadable holds a partial log: it is listed apart and never
# counts as a replicate; a sweep never reruns a run in one of these states.
RESULT_STATES = ("finished", "diverged", "collapsed")


def dotted_get(tree: Any, key: str, default: Any = None) -> Any:
    """``tree["a"]["b"]`` for key "a.b" in a resolved config; ``default`` when a part is missing or the value None."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    """The JSON object in `path`, or None with the reason appended to `problems` if it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problems.append(f"{path} is damaged ({type(err).__name__}: {err}); skipped")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path} is not a JSON object; skipped")
        return None
    return data


@dataclass
class RunData:
    name: str
    dir: Path
    params: dict[str, Any]
    status: dict[str, Any]
    resolved: dict[str, Any]
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return self.status.get("state", "missing")

    def series(self, tag: str) -> list[tuple[int, float]] | None:
        return self.scalars.get(tag)

    def setting(self, key: str, default: Any = None) -> Any:
        return dotted_get(self.resolved, key, default)


SHARED_BASELINE_SUFFIX = ".shared_baseline"
"""The name ending of an event file that holds a step-0 validation copied from another run of the same setting
(`study.sweep.shared_baseline`): drawn by TensorBoard, never read as this run's measurement."""


def _accumulated(path: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags().get("scalars", []):
        points = {}
        for event in acc.Scalars(tag):
            points[int(event.step)] = float(event.value)
        out[tag] = sorted(points.items())
    return out


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a run folder's event files, as (step, value) sorted by step: what the run measured.

    A resumed run's writer starts with `purge_step` = its checkpoint's step (the sweep sets it); EventAccumulator
    then drops the earlier attempt's points from that step on. Each step keeps one value (the latest). The points
    of a shared step-0 baseline (`SHARED_BASELINE_SUFFIX`) are another run's measurement and are left out: the report
    shares that baseline itself, once per setting (`study.report.summary.share_baselines`). A folder read again with
    its own event files unchanged (names, sizes, times) is not parsed again: the sweep reads its runs before its
    report does, in one process.
    """
    folder = Path(run_dir)
    own = tuple((p.name, (st := p.stat()).st_size, st.st_mtime_ns) for p in sorted(folder.glob(EVENT_FILES))
                if not p.name.endswith(SHARED_BASELINE_SUFFIX))  # fmt: skip
    return {tag: list(series) for tag, series in _measured(str(folder.resolve()), own).items()}


@functools.lru_cache(maxsize=256)
def _measured(run_dir: str, own_files: tuple) -> dict[str, list[tuple[int, float]]]:
    """`read_scalars` of a folder whose own event files are ``own_files`` (the cache's key)."""
    out = _accumulated(Path(run_dir))
    for shared in sorted(Path(run_dir).glob(EVENT_FILES + SHARED_BASELINE_SUFFIX)):
        for tag, copied in _accumulated(shared).items():
            steps = {step for step, _ in copied}
            if tag in out and not (kept := [point for point in out[tag] if point[0] not in steps]):
                del out[tag]
            elif tag in out:
                out[tag] = kept
    return out


def _record_damage(path: Path) -> str | None:
    """Why an event file's records are damaged (a failed CRC check), None if every record is sound; a truncated
    last record (a kill during a write) is not damage here."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    try:
        reader = PyRecordReader_New(str(path))
    except (OSError, errors.OpError) as err:
        return f"{path.name} cannot be read ({type(err).__name__})"
    records = 0
    try:
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:
                return None
            except errors.DataLossError as err:
                if "truncated record" in str(err):
                    return None
                return f"{path.name}: record {records + 1} fails its CRC check"
            records += 1
    except OSError as err:
        return f"{path.name} cannot be read ({type(err).__name__}: {err})"


def _same(a: float, b: float) -> bool:
    """Equal as TensorBoard stores a scalar (float32), non-finite values equal to each other."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.isnan(a) == math.isnan(b) and (math.isnan(a) or a == b)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def event_damage(
    run_dir: Path, status: dict[str, Any], scalars: dict[str, list[tuple[int, float]]]
) -> str | None:
    """Why a run's event files cannot be counted (see the module docstring); None if they are sound and complete."""
    files = sorted(Path(run_dir).glob(EVENT_FILES))
    if not files:
        return "no event file"
    for path in files:
        if problem := _record_damage(path):
            return problem
    recorded = (status.get("metrics") or {}).get(tags.VAL_LOSS)
    if isinstance(recorded, (int, float)):  # the run's last validation, as its status recorded it at the end
        logged = scalars.get(tags.VAL_LOSS) or []
        if not logged or not _same(float(logged[-1][1]), float(recorded)):
            last = f"{logged[-1][1]:.6g} at step {logged[-1][0]}" if logged else "none"
            return (f"its final validation ({tags.VAL_LOSS} {float(recorded):.6g}, step {status.get('global_step')}) "
                    f"is not in its event files (last logged: {last})")
    return None


def own_settings(run_dir: Path) -> dict[str, Any]:
    """The settings a run folder's run trained with, as its fit saved them (`config.yaml`, the resolved `study fit`
    config); {} when it has none or it cannot be read."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.is_file() or path.is_symlink():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _fingerprint(run_dir: Path, status: dict[str, Any]) -> str | None:
    """The fingerprint of the settings the folder's run recorded (its status, else its settings.json)."""
    if status.get("fingerprint"):
        return str(status["fingerprint"])
    path = run_dir / "settings.json"
    record = read_json(path, []) if path.is_file() and not path.is_symlink() else None
    return str(record["fingerprint"]) if record and record.get("fingerprint") else None


def run_folders(sweep_dir: Path) -> list[str]:
    """Every run folder of a sweep on disk (a folder with a status or settings record; the pretraining run's is
    the sweep's model, not one of its runs)."""
    return [d.name for d in sorted(sweep_dir.iterdir()) if d.is_dir() and not d.is_symlink() and d.name != "pretrain"
            and ((d / "status.json").is_file() or (d / "settings.json").is_file())]


def _read_run(sweep_dir: Path, name: str, entry: dict[str, Any] | None, found: list[str]) -> RunData:
    """One run folder; ``entry``: its plan entry, whose settings name it (None: its own record does)."""
    run_dir = sweep_dir / name
    status_path = run_dir / "status.json"
    status = {"state": "missing"}
    if status_path.is_file():
        status = read_json(status_path, found) or {"state": "unreadable"}
    scalars = read_scalars(run_dir) if run_dir.is_dir() else {}
    params = (entry or {}).get("params") or status.get("params") or {}
    resolved = entry.get("resolved", {}) if entry is not None else own_settings(run_dir)
    if status.get("state") in RESULT_STATES and (damage := event_damage(run_dir, status, scalars)):
        found.append(f"{run_dir}: {DAMAGED}: not counted ({damage})")
        status = {**status, "state": DAMAGED, "recorded_state": status["state"],
                  "reason": f"{DAMAGED}: not counted ({damage})"}
    return RunData(name, run_dir, params, status, resolved, scalars)


def load_sweep(
    sweep_dir: str | Path, problems: list[str] | None = None
) -> tuple[dict[str, Any], list[RunData]]:
    """The plan and every run of a sweep folder; damaged files are named in `problems` (and printed if it is
    None) and the rest is read.

    Every run folder on disk is read. The runs of the plan's grid are the runs; a folder outside it (not in
    plan.json, or made with other settings than its plan entry: a run added with `--run-index` by a larger grid,
    a grid shrunk since) is read with its own recorded settings and listed apart under the plan's
    ``outside_grid``, in no finding. Without a usable plan.json every run folder is a run, each named by its own
    recorded settings (its status and its `config.yaml`)."""
    sweep_dir = Path(sweep_dir)
    found: list[str] = []
    plan_path = sweep_dir / "plan.json"
    plan = read_json(plan_path, found) if plan_path.is_file() else None
    plan = plan or {"sweep": sweep_dir.name, "runs": []}
    entries = {e["name"]: e for e in plan.get("runs") or [] if isinstance(e, dict) and e.get("name")}
    folders = run_folders(sweep_dir) if sweep_dir.is_dir() else []
    runs, outside = [], []
    for name, entry in entries.items():
        run = _read_run(sweep_dir, name, entry, found)
        recorded = _fingerprint(run.dir, run.status)
        if entry.get("fingerprint") and recorded and recorded != entry["fingerprint"]:
            outside.append(_read_run(sweep_dir, name, None, []))  # the folder holds another run than the plan's
            run = RunData(name, run.dir, entry.get("params") or {}, {"state": "missing"}, entry.get("resolved", {}))
        runs.append(run)
    for name in folders:
        if name not in entries:
            (outside if entries else runs).append(_read_run(sweep_dir, name, None, found))
    if outside:
        found.append(f"{len(outside)} run folder(s) outside the grid of plan.json (added with --run-index by "
                     f"another grid, or left by a grid shrunk since): {', '.join(r.name for r in outside)}; listed "
                     "apart, in no finding")
    plan["outside_grid"] = outside
    if problems is None:
        for line in found:
            print(f"study report: {line}", flush=True)
    else:
        problems.extend(found)
    return plan, runs


def read_optional_json(path: Path) -> dict | None:
    """The JSON object at `path` if the file exists (a sweep's probe.json or analyze/results.json); a damaged one
    is named on the console and left out (None), so the report goes without it."""
    if not path.is_file():
        return None
    problems: list[str] = []
    data = read_json(path, problems)
    for line in problems:
        print(f"study report: {line}", flush=True)
    return data
