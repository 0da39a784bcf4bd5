"""Where a report's runs come from: the source hash each run recorded (`study.provenance`) and its machine; a
sweep's pretraining run counts as one of them (the fine-tuning runs start from its weights).

The report lists both in its header and in report.json (`origin`), and refuses to pool runs of different source
hashes (`MixedSources`, one line naming the hashes and their run counts) unless `--allow-mixed-sources` is given;
then every finding row those runs feed carries `mixed_note` in its value and `mixed_sources` (the hashes) in
report.json. Runs that recorded no provenance (logs made before it) count as "unrecorded": listed, never refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from study import provenance
from study.errors import ConfigError
from study.report.read import RESULT_STATES, RunData

ALLOW_OPTION = "--allow-mixed-sources"


class MixedSources(ConfigError):
    """The runs to pool were made by different versions of the code (one line, naming the hashes)."""


class MixedModels(MixedSources):
    """The runs to pool trained from different models (one line, naming their content digests); never allowed."""


@dataclass
class Origin:
    sources: dict[str, int]  # source hash (or "unrecorded") -> runs
    machines: dict[str, int]  # `provenance.machine_line` -> runs
    commits: dict[str, int]  # commit (+ " (dirty source)") -> runs, for the runs that recorded one
    dirty: int  # runs whose package source or configs differed from their commit
    models: dict[str, int] = field(default_factory=dict)  # the model each run loaded (`recorded_model`) -> runs

    @property
    def recorded(self) -> list[str]:
        return sorted(h for h in self.sources if h != provenance.UNRECORDED)

    @property
    def mixed(self) -> bool:
        return len(self.recorded) > 1

    def counts(self) -> str:
        return ", ".join(f"{h}: {n} run{'s' if n != 1 else ''}" for h, n in sorted(self.sources.items()))


def recorded_model(status: dict[str, Any]) -> str:
    """The model a run loaded and its content digest as the run recorded them (its `depends`, else its provenance
    record's inputs; ``model <path>: <digest>``), or `provenance.UNRECORDED` (a run from scratch, or one recorded
    before the model's content was)."""
    for record in (status.get("depends"), (status.get("provenance") or {}).get("inputs")
                   if isinstance(status.get("provenance"), dict) else None):
        if isinstance(record, dict):
            models = sorted(f"{key}: {value}" for key, value in record.items() if str(key).startswith("model "))
            if models:
                return "; ".join(models)
    return provenance.UNRECORDED


def origin(runs: Sequence[RunData], pretrain: dict[str, Any] | None = None) -> Origin:
    """The source hashes, machines and commits of the runs whose outcome is a result (the runs findings pool), and
    of the sweep's pretraining run (status ``pretrain``), whose weights every fine-tuning run starts from."""
    sources: Counter[str] = Counter()
    machines: Counter[str] = Counter()
    commits: Counter[str] = Counter()
    dirty = 0
    statuses = [run.status for run in runs if run.state in RESULT_STATES]
    models = Counter(recorded_model(status) for status in statuses)  # the pretraining run loads no model
    if isinstance(pretrain, dict) and pretrain.get("state") in RESULT_STATES:
        statuses.append(pretrain)
    for status in statuses:
        record = status.get("provenance")
        sources[provenance.recorded_source(status)] += 1
        machines[provenance.machine_line(record)] += 1
        git = (record or {}).get("git") if isinstance(record, dict) else None
        if isinstance(git, dict) and git.get("commit"):
            commits[str(git["commit"])[:12] + (" (dirty source)" if git.get("source_dirty") else "")] += 1
            dirty += bool(git.get("source_dirty"))
    return Origin(dict(sources), dict(machines), dict(commits), dirty, dict(models))


def check(found: Origin, allow_mixed: bool) -> None:
    """Raise `MixedModels` when the runs trained from more than one model (content digest), whatever
    ``allow_mixed`` says, and `MixedSources` when they recorded more than one source hash and pooling them was not
    allowed."""
    models = sorted(m for m in found.models if m != provenance.UNRECORDED)
    if len(models) > 1:
        counts = ", ".join(f"{m} ({found.models[m]} run{'s' if found.models[m] != 1 else ''})" for m in models)
        raise MixedModels(f"the runs trained from {len(models)} models ({counts}): seeds of two models are not "
                          "replicates of one; delete the runs of the model you do not want (or the sweep's "
                          "pretrain/ and every run) and rerun")
    if found.mixed and not allow_mixed:
        raise MixedSources(f"the runs come from {len(found.recorded)} source hashes ({found.counts()}): their "
                           f"findings would pool two versions of the code; rerun them from one, or pass "
                           f"{ALLOW_OPTION} to pool them with every row they feed marked")


def mixed_note(found: Origin) -> str:
    """What a finding row fed by runs of several source hashes says after its value ("" when one hash)."""
    return f" (pools runs of {len(found.recorded)} source hashes: {', '.join(found.recorded)})" if found.mixed else ""


def header_lines(found: Origin) -> list[str]:
    """The report header's lines on the runs' source hashes, commits and machines."""
    lines = [f"Source hashes of the runs (the package source and its configs, `study.provenance`): {found.counts()}"
             + (f"; pooled with {ALLOW_OPTION}: every row they feed says so" if found.mixed else "")
             + ("" if found.sources else "none (no run has a result)") + "."]
    if provenance.UNRECORDED in found.sources:
        lines.append(f"{found.sources[provenance.UNRECORDED]} run(s) recorded no provenance (made before runs "
                     "recorded it): their code and machine are unknown.")
    if found.commits:
        lines.append("Commits: " + ", ".join(f"`{c}` ({n})" for c, n in sorted(found.commits.items()))
                     + (f"; {found.dirty} run(s) ran with a source that differs from its commit." if found.dirty
                        else "."))
    lines.append("Machines: " + "; ".join(f"{m} ({n} run{'s' if n != 1 else ''})"
                                          for m, n in sorted(found.machines.items())) + ".")
    return lines


def origin_json(found: Origin) -> dict[str, Any]:
    return {"sources": found.sources, "mixed": found.mixed, "commits": found.commits, "dirty_source_runs": found.dirty,
            "machines": found.machines}
