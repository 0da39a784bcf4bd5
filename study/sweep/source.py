"""The code a sweep runs stays the code it started with: the source hash (`study.provenance.source_hash`, the
package source and the base config) is taken when the sweep starts and checked before each run is launched and
after each run ends, with the hash each run recorded itself. The package is installed editable, so a commit in
the checkout during a sweep changes the code its later runs import; the sweep stops instead, in one line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from study import provenance
from study.sweep.spec_identity import spec_change


class SourceChanged(Exception):
    """The package source or the config chain is no longer the one the sweep started with (a one-line message)."""


AFTER = ("its runs would mix two versions of the code: restore the source (or commit it) and rerun the same "
         "command; runs already done keep their record, and the report refuses to pool two source hashes")


SPEC_AFTER = ("its runs would be built from the edited spec under the plan of the first: restore the spec (or "
              "save the edited one under another `name`) and rerun the same command; runs already done keep their "
              "record")


class SourceWatch:
    """The sweep's source hash (and, with ``spec``, its spec file's digest: `study.sweep.spec_identity`) at its
    start, and the checks against them (`check`, `check_run`)."""

    def __init__(self, config_files: Sequence[str | Path], spec: tuple[Path, str] | None = None) -> None:
        self.config_files = [str(f) for f in config_files]
        self.expected = provenance.source_hash(self.config_files)
        self.spec = spec

    def check(self, when: str) -> None:
        """Raise `SourceChanged` if the source hash or the spec now differ from the sweep's; ``when`` says at which
        point ("before launching run T1.0_k-all_seed0")."""
        now = provenance.source_hash(self.config_files)
        if now != self.expected:
            raise SourceChanged(f"the package source or its configs changed while the sweep ran (source hash "
                                f"{self.expected} at its start, {now} {when}); {AFTER}")
        if self.spec is not None and self.spec[1] and (changed := spec_change(*self.spec)):
            raise SourceChanged(f"{changed} while the sweep ran (seen {when}); {SPEC_AFTER}")

    def check_run(self, name: str, status: dict[str, Any] | None) -> None:
        """Raise `SourceChanged` if run ``name`` recorded another source hash than the sweep's (a run that recorded
        none, such as one refused before it started, is not checked)."""
        record = (status or {}).get("provenance")  # this attempt's own (earlier attempts are the report's to read)
        recorded = provenance.recorded_source({"provenance": record})
        if recorded not in (provenance.UNRECORDED, self.expected):
            raise SourceChanged(f"run {name} ran under source hash {recorded}, not the sweep's {self.expected} "
                                f"(the package source or its configs changed while the sweep ran); {AFTER}")


def done_elsewhere(statuses: dict[str, dict[str, Any] | None], expected: str) -> str | None:
    """A note on the runs on disk (name -> status) whose recorded source differs from ``expected``: done or
    partly trained by other code, so that the report will refuse to pool them with this sweep's runs; None if none."""
    other = {name: provenance.recorded_source(status) for name, status in statuses.items()}
    other = {name: source for name, source in other.items() if source not in (provenance.UNRECORDED, expected)}
    if not other:
        return None
    sources = sorted(set(other.values()))
    return (f"{len(other)} run(s) on disk ran under other source hashes ({', '.join(sources)}) than this sweep's "
            f"{expected}: the report refuses to pool them with its runs (study report --allow-mixed-sources pools "
            f"them, marked); delete them to redo them")
