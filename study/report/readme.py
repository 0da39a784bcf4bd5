"""The README's scorecard, written from a report's JSON so that its numbers are the code's.

    python scripts/readme_results.py            # docs/results/main.json -> the block between the markers in README.md
    python scripts/readme_results.py --check    # exit 1 when README.md and the JSON differ (tests/test_report_readme.py)

The README's from-scratch sentence is the pooled page's opening (`study report --pool`), written between
`POOLED_BEGIN` and `POOLED_END` from docs/results/scratch-pooled/pooled.json by the same script.

The main job's report.json (`make demo` writes logs/default/report/report.json) is committed as
docs/results/main.json; this module replaces what lies between `BEGIN` and `END` in README.md with the opening of
report.md in plain words rendered from it by the same code (`study.report.markdown.plain_summary`). The README is a
front door: its block stops there. A results page (`--readme docs/results/<study>.md`) also gets the scorecard's
table (`study.report.scorecard.scorecard_markdown`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from study.atomic import write_text_atomically
from study.report.lrcurves import lr_tables
from study.report.markdown import plain_summary
from study.report.scorecard import SCHEMA, scorecard_markdown

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "main.json"
README = ROOT / "README.md"
MARKER = "<!-- scorecard: written by scripts/readme_results.py from "  # then the source JSON, then MARKER_END
MARKER_END = "; do not edit by hand -->"
BEGIN = f"{MARKER}docs/results/main.json{MARKER_END}"  # the README's: the main job's report
END = "<!-- /scorecard -->"
POOLED = ROOT / "docs" / "results" / "scratch-pooled" / "pooled.json"
POOLED_BEGIN = ("<!-- pooled: written by scripts/readme_results.py from docs/results/scratch-pooled/pooled.json; do not "
                "edit by hand -->")
POOLED_END = "<!-- /pooled -->"
REQUIRED = ("schema", "title", "runs", "family", "scorecard")


class ReadmeError(ValueError):
    """A results file or README that cannot be used; the message names the file and what is wrong."""


def load_results(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReadmeError(f"{path}: no such file (copy the main job's <sweep>/report/report.json there)") from None
    except json.JSONDecodeError as err:
        raise ReadmeError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ReadmeError(f"{path}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ReadmeError(f"{path}: lacks {', '.join(missing)} (is it a study report.json?)")
    if data["schema"] != SCHEMA:
        raise ReadmeError(f"{path}: schema={data['schema']!r}, this code writes schema {SCHEMA}; rebuild the report")
    return data


def render(data: dict[str, Any], source: str = "docs/results/main.json", table: bool = True) -> str:
    """The block between the markers: where the numbers come from, the report's opening in plain words (the effect
    of T, what the verdicts were checked against, each claim under its verdict), then the scorecard's table, unless
    ``table`` is false (the README, a front door, links the results page that carries it)."""
    runs = ", ".join(f"{n} {state}" for state, n in data["runs"].items())
    model = f", model {data['model']}" if data.get("model") else ""
    lines = [f"Sweep `{data['title']}` ({runs}{model}), from `{source}`. In plain words (the opening of its "
             "report.md):", "", plain_summary(data), ""]
    if not table:
        return "\n".join(lines[:-1])
    if data.get("lr_curves"):  # a learning-rate sweep: its own findings lead (the scorecard's rows are about T alone)
        lines += ["#### Learning-rate curves (from scratch)", "", *lr_tables(data["lr_curves"]),
                  "#### The paper's claims on the same runs", ""]  # fmt: skip
    return "\n".join([*lines, scorecard_markdown(data["scorecard"], data["family"])])


def begin_marker(source: str) -> str:
    """The opening marker line naming the JSON the block below it is rendered from."""
    return f"{MARKER}{source}{MARKER_END}"


def splice(text: str, block: str, name: str = "README.md", source: str = "docs/results/main.json") -> str:
    """`text` with the lines between the opening marker (whatever JSON it named) and END replaced by `block`, under
    a marker that names `source`, the JSON the block now comes from."""
    lines = text.split("\n")
    begins = [i for i, line in enumerate(lines) if line.startswith(MARKER) and line.endswith(MARKER_END)]
    ends = [i for i, line in enumerate(lines) if line == END]
    if len(begins) != 1 or len(ends) != 1:
        raise ReadmeError(f"{name}: needs exactly one {BEGIN!r} and one {END!r} line (found {len(begins)} and "
                          f"{len(ends)})")  # fmt: skip
    if ends[0] < begins[0]:
        raise ReadmeError(f"{name}: {END!r} comes before {BEGIN!r}")
    head, tail = lines[: begins[0]], lines[ends[0] + 1 :]
    return "\n".join([*head, begin_marker(source), block, END, *tail])


def pooled_opening(path: Path = POOLED) -> str:
    """The pooled from-scratch page's opening paragraph, as `study.report.pooled` wrote it into its JSON."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ReadmeError(f"{path}: not a readable pooled JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("opening"), str):
        raise ReadmeError(f"{path}: has no 'opening' text (written by `study report --pool`)")
    return data["opening"]


def splice_pooled(text: str, opening: str, name: str = "README.md") -> str:
    """`text` with the lines between `POOLED_BEGIN` and `POOLED_END` replaced by ``opening``; unchanged when the page
    has no such block."""
    lines = text.split("\n")
    if POOLED_BEGIN not in lines and POOLED_END not in lines:
        return text
    if lines.count(POOLED_BEGIN) != 1 or lines.count(POOLED_END) != 1:
        raise ReadmeError(f"{name}: needs exactly one {POOLED_BEGIN!r} and one {POOLED_END!r} line")
    begin, end = lines.index(POOLED_BEGIN), lines.index(POOLED_END)
    if end < begin:
        raise ReadmeError(f"{name}: {POOLED_END!r} comes before {POOLED_BEGIN!r}")
    return "\n".join([*lines[: begin + 1], opening, *lines[end:]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="readme_results.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", type=Path, default=RESULTS, help="a report.json (default: docs/results/main.json)")
    p.add_argument("--readme", type=Path, default=README, help="the page to write (default: README.md)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page differs from the JSON")
    args = p.parse_args(argv)
    try:
        data = load_results(args.json)
        text = args.readme.read_text()
        resolved = args.json.resolve()
        source = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(args.json)
        front_door = args.readme.resolve() == README.resolve()  # the README links the full table instead
        new = splice(text, render(data, source, table=not front_door), args.readme.name, source)
        if POOLED.is_file():
            new = splice_pooled(new, pooled_opening(POOLED), args.readme.name)
    except (ReadmeError, OSError) as err:
        print(f"readme_results: {err}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"readme_results: {args.readme} differs from {args.json}; run scripts/readme_results.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        write_text_atomically(args.readme, new)
    print(f"readme_results: {args.readme} {'updated' if new != text else 'already up to date'} from {args.json}")
    return 0
