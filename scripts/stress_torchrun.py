"""Run the torchrun test N times beside a CPU hog and count how many pass (issue 32's clean exit; not part of CI).

    python scripts/stress_torchrun.py                 # 10 runs, one busy process per core beside them
    python scripts/stress_torchrun.py --runs 5 --hogs 0

A rank that leaves the default process group to interpreter finalisation can die of SIGABRT after its work is done
("terminate called without an active exception"), most often on a loaded machine; `study.cli.close_process_group`
destroys it when a verb returns. Exits 1 if any run failed, printing the end of its output.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_cli_multiprocess.py::test_study_fit_under_torchrun"


def burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x = (x * 1103515245 + 12345) % 2**31


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy processes beside the runs")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        parser.error(f"--runs must be >= 1 and --hogs >= 0, got {args.runs} and {args.hogs}")
    hogs = [multiprocessing.Process(target=burn, args=(time.time() + 24 * 3600,), daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    failed = 0
    try:
        for i in range(args.runs):
            start = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-m", "slow", TEST],
                                    cwd=ROOT, capture_output=True, text=True)  # fmt: skip
            ok = result.returncode == 0
            failed += not ok
            print(f"run {i + 1}/{args.runs}: {'passed' if ok else 'FAILED'} in {time.perf_counter() - start:.0f} s "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
            if not ok:
                print((result.stdout + result.stderr)[-3000:], flush=True)
    finally:
        for hog in hogs:
            hog.terminate()
    print(f"{args.runs - failed} of {args.runs} passed beside {args.hogs} busy processes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
