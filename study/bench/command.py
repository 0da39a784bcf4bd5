"""`study bench` command line: arguments -> `Settings`, run, write bench.json / bench.md."""

from __future__ import annotations

import argparse
import os
import sys

import torch

from study.atomic import write_text_atomically
from study.bench.markdown import to_markdown, write
from study.bench.shapes import GPU_SUITE, H100_BF16_PEAK_FLOPS, SHAPES, Settings
from study.bench.suite import run_benchmark
from study.errors import BadValue, check_int, check_number


def parse_args(argv: list[str]) -> argparse.Namespace:
    import study.bench

    parser = argparse.ArgumentParser(prog="study bench", description=study.bench.__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke test: small model only, few steps (< 2 min)")
    parser.add_argument("--out", default="logs/bench", help="folder for bench.json and bench.md")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated shapes from {sorted(SHAPES)} (default small,gpt2-vocab; quick: small)")
    parser.add_argument("--rounds", type=int, default=None, help="round-robin rounds (default 8; quick 2)")
    parser.add_argument("--chunk", type=int, default=None, help="steps per variant per round (default 4; quick 1)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per variant first (default 4; quick 1)")
    parser.add_argument("--top-k", default="4,16,64", help="comma-separated k values")
    parser.add_argument("--peak-flops", type=float, default=H100_BF16_PEAK_FLOPS,
                        help="accelerator peak FLOP/s for MFU (default 989e12: H100/H200 SXM dense bf16)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: bf16-mixed on GPU, 32-true on CPU)")
    parser.add_argument("--gpu-suite", action="store_true",
                        help="the prepared GPU command: GPT-2 124M (random init) at L = 512, 1024, 2048, bf16, "
                             "parity of every path, fused and explicit step time, peak memory, MFU (about 6 min "
                             "on one H100/H200); with --device cpu and --models it checks the structure")
    parser.add_argument("--parity", action="store_true", help="also check every path against stock (on by "
                        "default with --gpu-suite)")
    parser.add_argument("--per-monitor", action="store_true",
                        help="also time each monitor alone, logging every step (one variant each): what each adds "
                             "to a logging step")
    parser.add_argument("--quiet", action="store_true", help="no progress report (a bar on a terminal, else a "
                        "line per timing round and per variant's memory pass, with the time left)")
    parser.add_argument("--analysis-length", default=None, help="comma-separated L for the oracle comparison (default 512; quick 256)")
    parser.add_argument("--lengths", default=None,
                        help="instead of the training suite: the length sweep, comma-separated L (e.g. "
                             "512,1024,2048,4096,8192): peak memory and time of stock SDPA, the dense and the "
                             "blockwise explicit path on SmolLM2's attention shape and one SmolLM2 layer "
                             "(writes lengths.json and lengths.md)")
    parser.add_argument("--dense-max-length", type=int, default=4096,
                        help="length sweep: skip the dense explicit path above this L (default 4096)")
    parser.add_argument("--in-process", action="store_true",
                        help="measure memory in this process (the profiler's figures only, no peak resident memory "
                             "of a fresh process per measurement; faster)")
    parser.add_argument("--units", default="call,layer",
                        help="length sweep: what is measured, comma-separated from call (one attention call), layer "
                             "(one SmolLM2 layer), model (the whole SmolLM2-135M with its loss; default call,layer)")
    parser.add_argument("--checkpointing", action="store_true",
                        help="length sweep: activation checkpointing of the layer and model rows")
    parser.add_argument("--specs", default=None,
                        help="length sweep: comma-separated from 'top-k k=8', sparsemax (default both)")
    parser.add_argument("--paths", default=None,
                        help="length sweep: comma-separated from 'dense explicit', blockwise, gathered (softmax "
                             "top-k with no tap: an unlogged step's path); default the first two; stock SDPA always "
                             "runs")
    parser.add_argument("--fused-stats", default=None, metavar="LENGTHS",
                        help="instead of the training suite: the row statistics' cost (a logged call against an "
                             "unlogged one) at the comma-separated L (e.g. 512,2048,8192) and top-k = 8 at L = 4096 "
                             "against stock SDPA, on SmolLM2's attention shape (writes fused.json and fused.md)")
    parser.add_argument("--top-k-length", type=int, default=4096,
                        help="--fused-stats: the L of the top-k = 8 call (default 4096)")
    parser.add_argument("--main-job", nargs="?", const="configs/sweeps/default.yaml", default=None, metavar="SPEC",
                        help="instead of the training suite: the main job's steps (the probe, the analysis, one "
                             "fine-tuning run) each as its own process at the spec's settings (default "
                             "configs/sweeps/default.yaml), their peak resident memory against --budget-gb")
    parser.add_argument("--budget-gb", type=float, default=4.0,
                        help="--main-job: the peak resident memory each step must stay under (default 4 GB)")
    parser.add_argument("--run-index", type=int, default=0, help="--main-job: which of the spec's runs (default 0)")
    parser.add_argument("--interception", action="store_true",
                        help="instead of the training suite: the SDPA interception's own cost on an unlogged step "
                             "(LitGPT unpatched vs under T = 1 without top-k, tiny and small shapes, in one process; "
                             "writes interception.json and interception.md; --rounds, --chunk, --warmup apply)")
    return parser.parse_args(argv)


def run_lengths(args: argparse.Namespace) -> int:
    """`study bench --lengths ...`: the length sweep alone, written as lengths.json and lengths.md."""
    import json
    from pathlib import Path

    from study.bench.lengths import LengthSettings, lengths_markdown, run_length_sweep, total_units
    from study.bench.suite import machine
    from study.progress import Progress

    try:
        lengths = tuple(int(n) for n in args.lengths.split(","))
        extra = {}
        if args.specs:
            defaults = LengthSettings().specs
            unknown = [name for name in args.specs.split(",") if name not in defaults]
            if unknown:
                raise ValueError(f"--specs {unknown}: choose from {sorted(defaults)}")
            extra["specs"] = {name: defaults[name] for name in args.specs.split(",")}
            extra["layer_specs"] = tuple(name for name in extra["specs"] if name in LengthSettings().layer_specs) or tuple(extra["specs"])[:1]
        if args.paths:
            extra["paths"] = tuple(args.paths.split(","))
        settings = LengthSettings(lengths=lengths, dense_max_length=args.dense_max_length, device=args.device,
                                  units=tuple(args.units.split(",")), checkpointing=args.checkpointing,
                                  fresh_process=not args.in_process, **extra)  # fmt: skip
    except ValueError as error:
        raise SystemExit(f"--lengths {args.lengths!r}: {error}") from None
    with Progress("bench lengths", total=total_units(settings), unit="measurement", enabled=not args.quiet) as bar:
        result = run_length_sweep(settings, tick=bar.advance)
    result["machine"] = machine()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = lengths_markdown(result)
    write_text_atomically(out / "lengths.json", json.dumps(result, indent=1) + "\n")
    write_text_atomically(out / "lengths.md", markdown + "\n")
    print(markdown)
    print(f"[bench] wrote {out / 'lengths.json'} and {out / 'lengths.md'}")
    return 0


def _write_outputs(out_dir: str, stem: str, result: dict, markdown: str) -> int:
    """Write ``stem``.json and ``stem``.md whole into ``out_dir`` and print the table."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / f"{stem}.json", json.dumps(result, indent=1) + "\n")
    write_text_atomically(out / f"{stem}.md", markdown.rstrip("\n") + "\n")
    print(markdown)
    print(f"[bench] wrote {out / f'{stem}.json'} and {out / f'{stem}.md'}")
    return 0


def run_interception_bench(args: argparse.Namespace) -> int:
    """`study bench --interception`: the interception's overhead alone, written as interception.json and .md."""
    from study.bench.interception import interception_markdown, run_interception

    result = run_interception(rounds=args.rounds or 8, chunk=args.chunk or 4, warmup=args.warmup or 3)
    return _write_outputs(args.out, "interception", result, interception_markdown(result))


def run_fused_stats(args: argparse.Namespace) -> int:
    """`study bench --fused-stats ...`: the row statistics and the gathered top-k, written as fused.json and fused.md."""
    from study.bench.fusedstats import fused_markdown, run_fused_bench
    from study.bench.suite import machine

    try:
        lengths = tuple(int(n) for n in args.fused_stats.split(","))
    except ValueError:
        raise SystemExit(f"--fused-stats {args.fused_stats!r}: comma-separated integers expected") from None
    if not lengths or min(lengths) < 2:
        raise SystemExit(f"--fused-stats {args.fused_stats!r}: lengths must be >= 2")
    if args.top_k_length < 16:
        raise SystemExit(f"--top-k-length must be >= 16 (top-k = 8 of fewer keys selects them all), got {args.top_k_length}")
    result = run_fused_bench(lengths, top_k_length=args.top_k_length, device=args.device)
    result["machine"] = machine()
    return _write_outputs(args.out, "fused", result, fused_markdown(result))


def _int_list(key: str, text: str, minimum: int) -> tuple[int, ...]:
    """A comma-separated list of integers, each >= ``minimum``; else `BadValue` naming the option and the entry."""
    values = []
    for entry in str(text).split(","):
        try:
            value = int(entry)
        except ValueError:
            raise BadValue(key, text, "must be comma-separated integers") from None
        values.append(check_int(key, value, minimum=minimum))
    return tuple(values)


def check_args(args: argparse.Namespace) -> None:
    """Every number and name of the bench's options, before anything is built or timed: one line naming the
    option and the value (`study.errors.BadValue`)."""
    for key, value, minimum in (("--rounds", args.rounds, 1), ("--chunk", args.chunk, 1), ("--warmup", args.warmup, 0),
                                ("--dense-max-length", args.dense_max_length, 1), ("--run-index", args.run_index, 0)):
        if value is not None:  # None: the default
            check_int(key, value, minimum=minimum)
    _int_list("--top-k", args.top_k, 1)
    if args.analysis_length is not None:
        _int_list("--analysis-length", args.analysis_length, 1)
    check_number("--peak-flops", args.peak_flops, minimum=0, low_open=True)
    check_number("--budget-gb", args.budget_gb, minimum=0, low_open=True)
    for name in (args.models or "").split(",") if args.models is not None else []:
        if name not in SHAPES:
            raise BadValue("--models", args.models, f"{name!r} is not a model shape; choose from {', '.join(sorted(SHAPES))}")


def settings_from_args(args: argparse.Namespace) -> Settings:
    default = ",".join(GPU_SUITE) if args.gpu_suite else ("small" if args.quick else "small,gpt2-vocab")
    names = (args.models or default).split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown model shape(s) {unknown}; choose from {sorted(SHAPES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available (use --device cpu)")
    lengths = args.analysis_length or ("256" if args.quick else "512")
    return Settings(
        shapes=[SHAPES[n] for n in names],
        rounds=args.rounds if args.rounds is not None else (2 if args.quick else 8),
        chunk=args.chunk if args.chunk is not None else (1 if args.quick else 4),
        warmup=args.warmup if args.warmup is not None else (1 if args.quick else 4),
        top_ks=tuple(int(k) for k in args.top_k.split(",")),
        analysis_lengths=tuple(int(n) for n in lengths.split(",")),
        analysis_repeats=2 if args.quick else 3,
        peak_flops=args.peak_flops,
        device=args.device,
        precision=args.precision or ("bf16-mixed" if args.gpu_suite or args.device.startswith("cuda") else "32-true"),
        parity=args.parity or args.gpu_suite,
        fresh_process=not args.in_process,
        per_monitor=args.per_monitor,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    from study.console import silence_library_notices

    # The bench's Trainers are its own measuring instruments: nothing they report is the user's to act on.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    silence_library_notices()
    check_args(args)
    if args.main_job:  # the sweep's own commands: `study.sweep` builds them (a layer the bench does not import)
        import subprocess

        return subprocess.call([sys.executable, "-m", "study.sweep.budget", args.main_job, "--budget-gb",
                                str(args.budget_gb), "--run-index", str(args.run_index), "--out", args.out])  # fmt: skip
    if args.lengths:
        return run_lengths(args)
    if args.interception:
        return run_interception_bench(args)
    if args.fused_stats:
        return run_fused_stats(args)
    settings = settings_from_args(args)
    result = run_benchmark(settings, on_model=lambda partial: write(partial, args.out), show_progress=not args.quiet)
    json_path, md_path = write(result, args.out)
    print(to_markdown(result))
    print(f"[bench] wrote {json_path} and {md_path}")
    failed = [r["name"] for m in result["models"] for r in m["rows"] if "error" in r]
    if failed:
        print(f"[bench] FAILED variants: {failed}", file=sys.stderr)
        return 1
    missed = [r["path"] for m in result["models"] for r in m.get("parity", []) if r["verdict"] != "PASS"]
    if missed:
        print(f"[bench] parity MISSED: {missed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
