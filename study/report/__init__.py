"""`study report <sweep dir>`: read a sweep's TensorBoard event files back and write report.md plus figures.

    study report logs/default            # -> logs/default/report/report.md and *.png beside it

Reads `plan.json` (or every run folder with a status.json), each run's events (TensorBoard's EventAccumulator,
which also drops the steps a resumed run logged twice), and the runs' status files. Every tag it reads is in
`study.report.tags`. Missing tags are reported as "not logged"; numbers in the report are logged values or
statistics of them, never filled in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from study.report.build import build_report
from study.report.read import load_sweep

__all__ = ["build_report", "load_sweep", "main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="study report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("sweep_dir", help="a sweep folder, e.g. logs/default")
    p.add_argument("--out", default=None, help="output folder (default: <sweep_dir>/report)")
    args = p.parse_args(argv)
    if not Path(args.sweep_dir).is_dir():
        print(f"study report: {args.sweep_dir} is not a folder", file=sys.stderr)
        return 2
    path = build_report(args.sweep_dir, out_dir=args.out)
    print(f"report: {path}")
    return 0
