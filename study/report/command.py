"""`study report` command line: parse, check the sweep folder, build the report. The usage is the package's
docstring (`study.report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from study.report.build import ReportRefused, build_report
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
    p.add_argument("sweep_dir", nargs="?", help="a sweep folder, e.g. logs/default")
    p.add_argument("--out", default=None, help="output folder (default: <sweep_dir>/report; required with --pool)")
    p.add_argument("--pool", nargs="+", default=None, metavar="PART_JSON",
                   help="instead of a sweep: pool the from-scratch replications' report JSONs (each a stratum) into "
                        "OUT/pooled.json and OUT/pooled.md (study.report.pooled)")
    p.add_argument("--design", choices=("scratch", "wortsman"), default="scratch",
                   help="with --pool: the design the parts were run under: scratch (default: the pooled from-scratch "
                        "rerun's findings 1 and 2) or wortsman (the Wortsman-scale study's registered family, "
                        "study.report.wortsman)")
    p.add_argument("--earlier-looks", type=int, default=None, metavar="N",
                   help="with --pool: analyses of the from-scratch findings before this one (default 3; the "
                        "Wortsman design's is registered, 4)")
    p.add_argument("--numerics-check", default=None, metavar="OTHER_SWEEP_DIR",
                   help="the same sweep run on another numerics path (e.g. MKL_CBWR=COMPATIBLE, another thread count): "
                        "a claim whose verdict differs between the two is labelled numerically fragile")
    p.add_argument(ALLOW_OPTION, action="store_true",
                   help="pool runs that recorded different source hashes (refused by default); every finding row "
                   "they feed says so")
    args = p.parse_args(argv)
    if args.pool is not None:
        return pool_main(args)
    if args.sweep_dir is None:
        p.error("a sweep folder is required (or --pool PART_JSON ... --out DIR)")
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
    except (MixedSources, ReportRefused) as err:
        print(f"study report: refused, nothing written: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk: the file and the system's reason, and the previous report stands
        where = f"{err.filename}: " if err.filename else ""
        print(f"study report: could not write {where}{err.strerror or err}; the previous report is left as it was",
              file=sys.stderr)
        return 1
    print(f"report: {path}")
    return 0


def pool_main(args: argparse.Namespace) -> int:
    """`study report --pool PART.json ... --out DIR`: the pooled from-scratch page, or one line saying why not."""
    from study.report.pooled import PartError
    from study.report.wortsman import write_any_pooled

    if args.sweep_dir is not None or args.out is None:
        print("study report: --pool takes report JSONs and --out DIR, and no sweep folder; nothing written",
              file=sys.stderr)
        return 2
    try:
        path = write_any_pooled(args.pool, args.out, earlier_looks=args.earlier_looks, design=args.design)
    except (PartError, ValueError) as err:
        print(f"study report: refused, nothing written: {err}", file=sys.stderr)
        return 2
    print(f"pooled report: {path}")
    return 0
