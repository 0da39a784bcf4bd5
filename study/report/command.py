"""`study report` command line: parse, check the sweep folder, build the report. The usage is the package's
docstring (`study.report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from study.report.build import build_report
from study.report.origin import ALLOW_OPTION, MixedSources


def is_sweep_folder(folder: Path) -> bool:
    """True if ``folder`` holds a sweep: its plan.json, or at least one run folder with a status.json."""
    return (folder / "plan.json").is_file() or any((d / "status.json").is_file() for d in folder.iterdir() if d.is_dir())


def is_sweep_folder_path(folder: Path) -> bool:
    return folder.is_dir() and is_sweep_folder(folder)


def main(argv: list[str] | None = None) -> int:
    import study.report

    p = argparse.ArgumentParser(
        prog="study report", description=study.report.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("sweep_dir", help="a sweep folder, e.g. logs/default")
    p.add_argument("--out", default=None, help="output folder (default: <sweep_dir>/report)")
    p.add_argument("--numerics-check", default=None, metavar="OTHER_SWEEP_DIR",
                   help="the same sweep run on another numerics path (e.g. MKL_CBWR=COMPATIBLE, another thread count): "
                        "a claim whose verdict differs between the two is labelled numerically fragile")
    p.add_argument(ALLOW_OPTION, action="store_true",
                   help="pool runs that recorded different source hashes (refused by default); every finding row "
                   "they feed says so")
    args = p.parse_args(argv)
    if not Path(args.sweep_dir).is_dir():
        print(f"study report: {args.sweep_dir} is not a folder", file=sys.stderr)
        return 2
    if not is_sweep_folder(Path(args.sweep_dir)):  # before report/ is written into a folder that is not a sweep
        print(
            f"study report: {args.sweep_dir} is not a sweep folder (no plan.json and no run folder with a "
            "status.json); nothing written",
            file=sys.stderr,
        )
        return 2
    if args.numerics_check is not None and not is_sweep_folder_path(Path(args.numerics_check)):
        print(f"study report: --numerics-check {args.numerics_check} is not a sweep folder; nothing written",
              file=sys.stderr)
        return 2
    try:
        path = build_report(args.sweep_dir, out_dir=args.out, allow_mixed_sources=args.allow_mixed_sources,
                            numerics_check=args.numerics_check)
    except MixedSources as err:
        print(f"study report: refused, nothing written: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
