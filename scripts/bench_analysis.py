"""Benchmarks of the paper analyses (study.frozen.analysis) on this machine.

    python scripts/bench_analysis.py oracle [--length 512] [--repeats 5] [--threads 1]
        Theorem 1 for one causal head (d both readings, bound, closed-form E; N = 5, D = 64): the vectorised
        path against the per-row loop oracle (study.frozen.analysis.reference). Prints medians of the repeats and
        their ratio. The oracle is single-threaded numpy, so torch runs with --threads 1 by default (a fair
        comparison; on a shared, loaded 2-core machine two torch threads also slow small ops down by up to 100x).
    python scripts/bench_analysis.py protocol [--length 1024] [--layers 12] [--analyse-layers all] [--threads 1]
        The default `study analyze` protocol on a randomly initialised GPT-2-sized model (12 layers, 12 heads,
        n_embd 768, built from GPT2Config; no hub): total time and seconds per analysis step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def bench_oracle(length: int, repeats: int, oracle_rows: int | None) -> dict:
    from study.frozen.analysis.protocol import benchmark_against_oracle

    runs = [benchmark_against_oracle(length, oracle_rows=oracle_rows, seed=0) for _ in range(repeats)]
    vec = statistics.median(r["vectorised_s"] for r in runs)
    loop = statistics.median(r["loop_s"] for r in runs)
    return {"L": length, "repeats": repeats, "threads": torch.get_num_threads(),
            "oracle_rows": runs[0]["oracle_rows"], "vectorised_median_s": vec, "loop_median_s": loop,
            "speedup_of_medians": loop / vec, "speedups": [r["speedup"] for r in runs],
            "max_relative_difference": max(r["max_relative_difference_fp32_vs_fp64"] for r in runs)}


def bench_protocol(length: int, n_layer: int, analyse_layers: list[int] | None, device: str) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    from study.frozen.analysis import analyze

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_head=12, n_embd=768, n_positions=1024)).eval().to(device)
    ids = torch.randint(0, 50257, (1, length), device=device)
    t0 = time.perf_counter()
    res = analyze(model, ids, layers=analyse_layers)
    total = time.perf_counter() - t0
    per_step = res["seconds_by_step"]
    n = len(res["choices"]["layers"])
    per_layer = (total - per_step["capture"]) / n
    return {"L": length, "model_layers": n_layer, "analysed_layers": n, "threads": torch.get_num_threads(),
            "device": device, "total_s": total, "per_layer_s": per_layer,
            "estimated_all_layers_s": per_step["capture"] + per_layer * n_layer, "seconds_by_step": per_step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("oracle")
    o.add_argument("--length", type=int, default=512)
    o.add_argument("--repeats", type=int, default=5)
    o.add_argument("--oracle-rows", type=int, default=128,
                   help="rows the loop runs on, scaled to all L rows by their cost (0 = every row)")
    o.add_argument("--threads", type=int, default=1)
    f = sub.add_parser("protocol")
    f.add_argument("--length", type=int, default=1024)
    f.add_argument("--layers", type=int, default=12)
    f.add_argument("--analyse-layers", type=int, nargs="+", default=None, help="subset (default: all)")
    f.add_argument("--threads", type=int, default=1)
    f.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.what == "oracle":
        out = bench_oracle(args.length, args.repeats, args.oracle_rows or None)
    else:
        out = bench_protocol(args.length, args.layers, args.analyse_layers, args.device)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
