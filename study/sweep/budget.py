"""`study bench --main-job [SPEC]` (`python -m study.sweep.budget`): the main job's steps, each alone, against a
resident-memory budget.

The probe, the analysis and one fine-tuning run of the sweep spec (default configs/sweeps/default.yaml, the main
job: SmolLM2-135M) run one after the other, each as the same `study` subprocess the sweep launches, at the spec's
settings, into a temporary sweep folder (nothing is written beside the user's sweep). Each one's peak resident
memory is that process's own (`study.resident.command_peak`), with its wall and CPU time; a step over the budget (default 4 GB) or one that fails makes the command exit 1. Writes main_job.json and
main_job.md to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from study.atomic import write_text_atomically
from study.resident import command_peak


def main_job_commands(spec: str, run_index: int, save_dir: str) -> list[tuple[str, list[str]]]:
    """(label, command) of the spec's probe, analysis and run ``run_index``, as `study sweep` launches them."""
    from study.sweep.config import build_plan, load_sweep_config
    from study.sweep.frozen_steps import frozen_steps
    from study.sweep.pool import run_command

    plan = build_plan(spec, save_dir=save_dir)
    if not 0 <= run_index < len(plan.runs):
        raise ValueError(f"--run-index {run_index} is not in 0..{len(plan.runs) - 1}")
    threads = load_sweep_config(spec).get("threads")
    commands = [(step.label, step.command()) for step in frozen_steps(plan)]
    run = plan.runs[run_index]
    commands.append((f"run {run.name}", run_command(Path(spec), run_index, False, [], save_dir, threads)))
    return commands


def run_main_job(spec: str, budget_gb: float, run_index: int, out: str) -> int:
    import os
    import platform

    if not Path(spec).is_file():
        print(f"study bench: --main-job {spec!r}: no such spec file", file=sys.stderr)
        return 2
    if not budget_gb > 0:
        print(f"study bench: --budget-gb must be > 0, got {budget_gb}", file=sys.stderr)
        return 2
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = budget_gb * 1e9
    rows = []
    with tempfile.TemporaryDirectory(prefix="study-main-job-") as save_dir:
        try:
            commands = main_job_commands(spec, run_index, save_dir)
        except Exception as error:  # noqa: BLE001 - a bad spec, named
            print(f"study bench: --main-job {spec}: {error}", file=sys.stderr)
            return 2
        for label, command in commands:
            print(f"[bench] main job: {label} ...", flush=True)
            measured = command_peak(command[2], command[3:], out_dir / "main_job_logs" / f"{label.split()[0]}.log")
            peak = measured["max_rss_bytes"]
            verdict = "FAILED" if measured["returncode"] or peak is None else ("PASS" if peak <= budget else "MISS")
            rows.append({"step": label, **measured, "budget_bytes": budget, "verdict": verdict})
            print(f"[bench] main job: {label}: peak resident {(peak or 0) / 1e9:.2f} GB "
                  f"(budget {budget_gb:g} GB) in {measured['seconds']:.0f} s: {verdict}", flush=True)
    load = os.getloadavg()
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "python": platform.python_version()}
    result = {"spec": spec, "budget_gb": budget_gb, "machine": machine, "load_average": load, "rows": rows}
    write_text_atomically(out_dir / "main_job.json", json.dumps(result, indent=1) + "\n")
    markdown = main_job_markdown(result)
    write_text_atomically(out_dir / "main_job.md", markdown)
    print(markdown)
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


def main_job_markdown(result: dict) -> str:
    lines = [f"Main job's steps ({result['spec']}), each alone; load average at the end "
             f"{result['load_average'][0]:.1f} / {result['load_average'][1]:.1f} / {result['load_average'][2]:.1f}", "",
             "| step | peak resident GB | budget GB | wall s | CPU s | verdict |", "|---|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['step']} | {(r['max_rss_bytes'] or 0) / 1e9:.2f} | {r['budget_bytes'] / 1e9:g} | "
                     f"{r['seconds']:.0f} | {r['cpu_seconds']:.0f} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="study bench --main-job", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", nargs="?", default="configs/sweeps/default.yaml")
    parser.add_argument("--budget-gb", type=float, default=4.0)
    parser.add_argument("--run-index", type=int, default=0)
    parser.add_argument("--out", default="logs/bench")
    args = parser.parse_args(argv)
    return run_main_job(args.spec, args.budget_gb, args.run_index, args.out)


if __name__ == "__main__":
    sys.exit(main())
