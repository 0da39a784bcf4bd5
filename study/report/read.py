"""Load a sweep's runs: parameters, status and scalar series from the event files.

A damaged file (a truncated plan.json or status.json) is named in `problems` and the other runs are read as
usual; a run whose status cannot be read has the state "unreadable".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a run folder's event files, as (step, value) sorted by step.

    A resumed run's writer starts with `purge_step` = its checkpoint's step (the sweep sets it); EventAccumulator
    then drops the earlier attempt's points from that step on. Each step keeps one value (the latest).
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags().get("scalars", []):
        points = {}
        for event in acc.Scalars(tag):
            points[int(event.step)] = float(event.value)
        out[tag] = sorted(points.items())
    return out


def load_sweep(
    sweep_dir: str | Path, problems: list[str] | None = None
) -> tuple[dict[str, Any], list[RunData]]:
    """The plan and every run of a sweep folder; damaged files are named in `problems` (and printed if it is
    None) and the rest is read."""
    sweep_dir = Path(sweep_dir)
    found: list[str] = []
    plan_path = sweep_dir / "plan.json"
    plan = read_json(plan_path, found) if plan_path.is_file() else None
    plan = plan or {"sweep": sweep_dir.name, "runs": []}
    entries = [e for e in plan.get("runs") or [] if isinstance(e, dict) and e.get("name")]
    if not entries:  # no usable plan: every run folder with a status file
        entries = [{"name": d.name} for d in sorted(sweep_dir.iterdir()) if (d / "status.json").is_file()]
        entries = [e for e in entries if e["name"] != "pretrain"]
    runs = []
    for entry in entries:
        run_dir = sweep_dir / entry["name"]
        status_path = run_dir / "status.json"
        status = {"state": "missing"}
        if status_path.is_file():
            status = read_json(status_path, found) or {"state": "unreadable"}
        scalars = read_scalars(run_dir) if run_dir.is_dir() else {}
        params = entry.get("params") or status.get("params") or {}
        runs.append(RunData(entry["name"], run_dir, params, status, entry.get("resolved", {}), scalars))
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
