"""`study bench --fused-stats`: what the row statistics and the gathered top-k cost, on SmolLM2's attention shape.

One process, forward and backward of one attention call (`study.attention.attend` on random q, k, v: 9 query and
3 key-value heads, head size 64, causal, batch 1, fp32), each timed as `study.bench.lengths` times it (CPU time of
the process on a CPU, the median of a few repeats) and its tensor memory taken as the peak above what lived before:

- row statistics: T = 0.5 untapped (the unlogged step) against the same call with a tap that asks for the entropy
  and the first-key weight (the fused call alone) or for every row statistic the softmax monitors read together
  (`study.attention.rowstats.STATISTICS`, the 16 largest weights: the key-block pass): the logged step's extra
  time and extra peak memory, at each length;
- top-k = 8 at one length: stock SDPA (plain softmax, the reference cost), the gathered top-k path
  (`study.attention.topk`) and the explicit blockwise path it replaces (forced by a tap that takes row blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack

import torch

from study.attention import AttentionSpec, attend, blockwise_settings, tapping
from study.attention.rowstats import FUSED_ONLY, STATISTICS
from study.bench.lengths import HEAD_DIM, HEADS, KV_HEADS, peak_bytes, seconds

TOP_K = 8
TOP_K_PATHS = ("stock sdpa", "gathered top-k", "blockwise explicit top-k")


NEEDS = {"entropy + first key (fused call)": FUSED_ONLY, "every statistic (key blocks)": STATISTICS}
"""What a logged call computes: the entropy and sink monitors alone, or every softmax monitor together."""


class StatisticsTap:
    """Asks for the row statistics ``needs`` (with the 16 largest weights); it keeps nothing."""

    fused_output = True
    row_blocks = True
    row_top_k = 16

    def __init__(self, needs: frozenset[str] = STATISTICS) -> None:
        self.row_statistics = needs

    def observe(self, layer, weights, allowed, spec) -> None:
        """Not called while every open tap takes row statistics."""

    def observe_rows(self, layer, rows, spec) -> None:
        """The statistics are computed for this call; a monitor would sum them here."""


class WeightsTap:
    """A tap that reads weights a block of rows at a time: the explicit blockwise path runs under it."""

    row_blocks = True

    def observe(self, layer, weights, allowed, spec) -> None:
        """It keeps nothing."""


def _call(length: int, spec: AttentionSpec, device: str, *contexts) -> Callable[[], None]:
    generator = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, heads, length, HEAD_DIM, generator=generator).to(device).requires_grad_(True)
               for heads in (HEADS, KV_HEADS, KV_HEADS))

    def step() -> None:
        with ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context())
            out = attend(q, k, v, spec)
        out.sum().backward()
        for tensor in (q, k, v):
            tensor.grad = None

    return step


def statistics_row(length: int, needs: str, device: str, repeats: int) -> dict:
    """An unlogged call and one logged with the statistics ``needs`` (a key of `NEEDS`) at ``length``: their times
    and tensor peaks, and the ratios."""
    spec = AttentionSpec(temperature=0.5)
    unlogged = _call(length, spec, device)
    logged = _call(length, spec, device, lambda: tapping(StatisticsTap(NEEDS[needs])))
    row = {"length": length, "statistics": needs}
    for name, step in (("unlogged", unlogged), ("logged", logged)):
        step()  # warm-up
        row[f"{name}_s"] = seconds(step, device, repeats)
        row[f"{name}_peak_bytes"] = peak_bytes(step, device)
    row["time_ratio"] = row["logged_s"] / row["unlogged_s"]
    row["extra_peak_bytes"] = row["logged_peak_bytes"] - row["unlogged_peak_bytes"]
    return row


def top_k_rows(length: int, device: str, repeats: int) -> list[dict]:
    """Stock SDPA, the gathered top-k and the explicit blockwise top-k on one call at ``length``."""
    top_k = AttentionSpec(top_k=TOP_K)
    steps = {
        "stock sdpa": _call(length, AttentionSpec(), device),
        "gathered top-k": _call(length, top_k, device, lambda: blockwise_settings(gather_keys_per_pick=1)),
        "blockwise explicit top-k": _call(length, top_k, device, lambda: blockwise_settings(min_scores=0),
                                          lambda: tapping(WeightsTap())),
    }
    rows = []
    for name in TOP_K_PATHS:
        steps[name]()  # warm-up
        rows.append({"path": name, "length": length, "seconds": seconds(steps[name], device, repeats),
                     "peak_bytes": peak_bytes(steps[name], device)})
    stock = rows[0]["seconds"]
    for row in rows:
        row["ratio_to_stock"] = row["seconds"] / stock
    return rows


def run_fused_bench(lengths: tuple[int, ...] = (512, 2048, 8192), top_k_length: int = 4096, device: str = "cpu",
                    repeats: int = 3, key_blocks_max_length: int = 2048) -> dict:
    """Both statistics sets at every length (the key-block pass only up to ``key_blocks_max_length``: above it one
    CPU call takes minutes), and the top-k paths at ``top_k_length``."""
    rows = [statistics_row(n, needs, device, repeats if n < 4096 else 1) for n in lengths for needs in NEEDS
            if NEEDS[needs] == FUSED_ONLY or n <= key_blocks_max_length]
    return {"statistics": rows, "top_k": top_k_rows(top_k_length, device, repeats if top_k_length < 4096 else 1)}


def fused_markdown(result: dict) -> str:
    mib = 2**20
    lines = ["| L | logged call computes | unlogged (s) | logged (s) | ratio | extra peak (MiB) |",
             "|---:|---|---:|---:|---:|---:|"]
    for row in result["statistics"]:
        lines.append(f"| {row['length']} | {row['statistics']} | {row['unlogged_s']:.3f} | {row['logged_s']:.3f} | "
                     f"{row['time_ratio']:.2f}x | {row['extra_peak_bytes'] / mib:.1f} |")
    lines += ["", f"| path (top-k = {TOP_K}, L = {result['top_k'][0]['length']}) | seconds | / stock SDPA | "
              "peak (MiB) |", "|---|---:|---:|---:|"]
    for row in result["top_k"]:
        lines.append(f"| {row['path']} | {row['seconds']:.3f} | {row['ratio_to_stock']:.2f}x | "
                     f"{row['peak_bytes'] / mib:.1f} |")
    return "\n".join(lines)


__all__ = ["NEEDS", "StatisticsTap", "fused_markdown", "run_fused_bench", "statistics_row", "top_k_rows"]
