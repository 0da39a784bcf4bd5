"""`study report <sweep dir>`: read a sweep's TensorBoard event files back and write report.md plus figures.

    study report logs/default            # -> logs/default/report/report.md and *.png beside it
    study report --pool a.json b.json --out DIR   # from-scratch replications pooled -> DIR/pooled.{json,md}

Reads `plan.json` (or every run folder with a status.json), each run's events (TensorBoard's EventAccumulator,
which also drops the steps a resumed run logged twice), and the runs' status files. Every tag it reads is in
`study.report.sources`. Missing tags are reported as "not logged"; numbers in the report are logged values or
statistics of them, never filled in.

The header lists the source hashes and machines the runs recorded (`study.provenance`); runs of different source
hashes are refused (exit 2) unless `--allow-mixed-sources` is given, and then every row they feed says so.

`--pool` reads report JSONs instead of a sweep: the from-scratch learning-rate replications pooled, each a stratum
(`study.report.pooled`); parts of different source hashes, grids or model settings are refused.
"""

from __future__ import annotations

from study.report.build import build_report
from study.report.command import main
from study.report.read import load_sweep

__all__ = ["build_report", "load_sweep", "main"]
