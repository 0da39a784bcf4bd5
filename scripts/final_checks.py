"""The final checks on a fresh clone, recorded, and the README's lines about them written from that record.

    python scripts/final_checks.py run [--steps setup,demo,test,quick] [--clone DIR]
        clones this repository's HEAD into DIR (a new temporary folder by default), runs each `make` step there
        under GNU time, one after the other (`setup` first, so that `make demo`'s time is the study's, not pip's;
        on a fresh clone a user's first `make demo` pays both), and writes docs/results/checks.json: the commit, the machine, the load
        average before and after each step, its wall time, the largest resident memory of any process it ran (GNU
        time's maximum resident set size covers the step's whole process tree), its exit code and, for the test
        steps, pytest's closing counts; then rewrites the README's block
    python scripts/final_checks.py readme [--check]
        rewrites (or, with --check, compares) the block between the markers in README.md from docs/results/checks.json

Nothing here is typed by hand: the README's times and test counts are this record's (tests/test_final_checks.py
checks that the two agree).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "results" / "checks.json"
README = ROOT / "README.md"
BEGIN = "<!-- checks: written by scripts/final_checks.py from docs/results/checks.json; do not edit by hand -->"
END = "<!-- /checks -->"
STEPS = ("setup", "demo", "test", "test-all", "quick")
WHAT = {
    "setup": "the virtual environment: pip installs, not the study",
    "demo": "the main job",
    "test": "unit and fast integration tests",
    "test-all": "every test (what CI runs)",
    "quick": "the small GPT-2 pipeline and the from-scratch study's tiny version",
}
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal")))
    except (OSError, StopIteration, ValueError):
        mem_kb = 0
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem_kb / 2**20, 1), "python": platform.python_version()}


def parse_gnu_time(text: str) -> dict:
    """Wall seconds and the largest resident set (KiB) from `/usr/bin/time -v`'s report."""
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if not (wall and rss):
        raise ValueError("no GNU time report in the step's output")
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return {"wall_s": round(seconds, 1), "max_rss_kib": int(rss.group(1))}


def parse_pytest(text: str) -> dict | None:
    """pytest's closing counts (the last line that has them), e.g. {'passed': 869, 'skipped': 2}."""
    for line in reversed(text.splitlines()):
        if " in " in line and PYTEST_COUNTS.search(line):
            return {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                    for n, kind in PYTEST_COUNTS.findall(line)}
    return None


def run_step(clone: Path, step: str, logs: Path) -> dict:
    load_before = os.getloadavg()[0]
    log = logs / f"{step}.log"
    with log.open("w") as out:
        done = subprocess.run(["/usr/bin/time", "-v", "make", step], cwd=clone, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = log.read_text(errors="replace")
    result = {"step": step, "rc": done.returncode, "load_before": round(load_before, 2),
              "load_after": round(os.getloadavg()[0], 2), "log": str(log), **parse_gnu_time(text)}
    counts = parse_pytest(text) if step.startswith("test") else None
    if counts is not None:
        result["pytest"] = counts
    return result


def run(steps: list[str], clone: Path | None) -> dict:
    clone = clone or Path(tempfile.mkdtemp(prefix="study-checks-")) / "study"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True, capture_output=True,
                            text=True).stdout.strip()
    logs = clone.parent / "check-logs"
    logs.mkdir(exist_ok=True)
    record = {"commit": commit, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(), "clone": str(clone), "steps": []}
    for step in steps:
        started = time.time()
        print(f"[checks] make {step} in {clone} ...", flush=True)
        result = run_step(clone, step, logs)
        record["steps"].append(result)
        print(f"[checks] make {step}: rc {result['rc']}, {clock(result['wall_s'])} wall, largest process "
              f"{result['max_rss_kib'] / 2**20:.2f} GiB ({time.time() - started:.0f} s)", flush=True)
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
    return record


def clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def render(record: dict) -> str:
    m = record["machine"]
    lines = [f"Measured on a fresh clone of commit {record['commit']}, {record['date']}, on a {m['cores']}-core "
             f"{m['cpu']} with {m['memory_gib']} GiB (load average before and after each step in brackets):", ""]
    for s in record["steps"]:
        what = f"`make {s['step']}` ({WHAT.get(s['step'], s['step'])})"
        counts = s.get("pytest")
        tests = (", " + ", ".join(f"{n} {kind}" for kind, n in counts.items())) if counts else ""
        status = "" if s["rc"] == 0 else f", exit code {s['rc']}"
        lines.append(f"- {what}: {clock(s['wall_s'])} wall{tests}{status}; largest process "
                     f"{s['max_rss_kib'] / 2**20:.2f} GiB resident [load {s['load_before']} -> {s['load_after']}]")
    return "\n".join(lines)


def rewrite_readme(record: dict, check: bool) -> int:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        print(f"{README}: no block between {BEGIN!r} and {END!r}", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{render(record)}\n{END}{tail}"
    if check:
        if new != text:
            print("README.md's checks block differs from docs/results/checks.json: run "
                  "`python scripts/final_checks.py readme`", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run the steps on a fresh clone and record them")
    run_p.add_argument("--steps", default="setup,demo,test,quick")
    run_p.add_argument("--clone", type=Path, default=None)
    readme_p = sub.add_parser("readme", help="write the README's block from the record")
    readme_p.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run":
        steps = args.steps.split(",")
        unknown = [s for s in steps if s not in STEPS]
        if unknown:
            parser.error(f"--steps: unknown step(s) {unknown}; choose from {list(STEPS)}")
        record = run(steps, args.clone)
        return rewrite_readme(record, check=False)
    return rewrite_readme(json.loads(RECORD.read_text()), check=args.check)


if __name__ == "__main__":
    sys.exit(main())
