"""Load a sweep's runs: parameters, status and scalar series from the event files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study.sweep.spec import dotted_get


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

    EventAccumulator keeps every point (size guidance 0) and, when a resumed run logs a step again, drops the
    earlier points from that step on (TensorBoard's out-of-order purge), so each step appears once.
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


def load_sweep(sweep_dir: str | Path) -> tuple[dict[str, Any], list[RunData]]:
    sweep_dir = Path(sweep_dir)
    plan_path = sweep_dir / "plan.json"
    plan = json.loads(plan_path.read_text()) if plan_path.is_file() else {"sweep": sweep_dir.name, "runs": []}
    entries = plan.get("runs") or []
    if not entries:  # no plan: every run folder with a status file
        entries = [
            {
                "name": d.name,
                "dir": str(d),
                "params": json.loads((d / "status.json").read_text()).get("params", {}),
            }
            for d in sorted(sweep_dir.iterdir())
            if (d / "status.json").is_file() and d.name != "pretrain"
        ]
    runs = []
    for entry in entries:
        run_dir = sweep_dir / entry["name"]
        status_path = run_dir / "status.json"
        status = json.loads(status_path.read_text()) if status_path.is_file() else {"state": "missing"}
        scalars = read_scalars(run_dir) if run_dir.is_dir() else {}
        runs.append(
            RunData(
                entry["name"], run_dir, entry.get("params", {}), status, entry.get("resolved", {}), scalars
            )
        )
    return plan, runs
