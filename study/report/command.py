"""`study report` command line: parse, check the sweep folder, build the report. The usage is the package's
docstring (`study.report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from study.report.build import build_report


def main(argv: list[str] | None = None) -> int:
    import study.report

    p = argparse.ArgumentParser(
        prog="study report", description=study.report.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
