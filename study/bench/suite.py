"""`run_benchmark`: every shape's timing, memory, budgets (and parity), then the analysis speed."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import torch

from study.bench.budgets import budgets, ratio_or_none
from study.bench.memory import measure_memory
from study.bench.parity import check_parity
from study.bench.shapes import Settings, monitor_classes, variants
from study.bench.timing import (
    build_module,
    chosen_monitors,
    summarise_times,
    time_one_at_a_time,
    time_variants,
)
from study.progress import Progress
from study.resident import in_fresh_process


def analysis_speed(settings: Settings) -> list[dict]:
    from study.frozen.analysis.protocol import benchmark_against_oracle

    rows = []
    for L in settings.analysis_lengths:
        runs = [benchmark_against_oracle(L, oracle_rows=settings.analysis_oracle_rows)
                for _ in range(settings.analysis_repeats)]
        vec = statistics.median(r["vectorised_s"] for r in runs)
        loop = statistics.median(r["loop_s"] for r in runs)
        rows.append({"L": L, "vectorised_s": vec, "loop_s": loop, "speedup": loop / vec,
                     "oracle_rows": runs[0]["oracle_rows"],
                     "max_relative_difference": max(r["max_relative_difference_fp32_vs_fp64"] for r in runs)})
    return rows


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version()}
    try:
        import lightning
        import transformers

        info.update(lightning=lightning.__version__, transformers=transformers.__version__)
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info



def run_benchmark(settings: Settings, progress=print, on_model=None, show_progress: bool = False) -> dict:
    """Every shape's timing, memory and budgets (and parity), then the analysis speed.

    ``progress`` prints each phase's header; ``show_progress`` also reports the units of the long phases with the
    time left (`study.progress`: a bar on a terminal, else a line each): the timing rounds (interleaved), each
    variant's fit (one at a time), each variant's memory pass.
    """
    classes, note = monitor_classes()
    notes = [note] if note else []
    result = {"machine": machine(), "settings": {**asdict(settings), "shapes": [asdict(s) for s in settings.shapes]},
              "notes": notes, "models": [], "analysis": []}
    gpu = settings.device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="study-bench-") as log_root:
        base_settings = settings
        for shape in base_settings.shapes:
            settings = base_settings
            if shape.vocab_size > 20000 and base_settings.large_vocab_fraction != 1:
                f = base_settings.large_vocab_fraction
                settings = replace(base_settings, rounds=max(1, round(settings.rounds * f)),
                                   chunk=max(1, round(settings.chunk * f)), warmup=max(1, round(settings.warmup * f)))
            vs = variants(settings, bool(classes))
            t0 = time.perf_counter()
            if shape.one_at_a_time:
                settings = replace(settings, rounds=2, warmup=1, chunk=max(2, base_settings.chunk))
                progress(f"[bench] {shape.name}: {len(vs)} variants one at a time, {settings.rounds} rounds of "
                         f"{settings.warmup}+{settings.chunk} steps")
                with Progress(f"bench {shape.name} timing", total=settings.rounds * len(vs), unit="fit",
                              enabled=show_progress) as bar:
                    timed = time_one_at_a_time(shape, vs, settings, classes, log_root, tick=bar.advance)
            else:
                progress(f"[bench] {shape.name}: {len(vs)} variants x {settings.warmup}+{settings.rounds}x"
                         f"{settings.chunk} steps, interleaved")
                with Progress(f"bench {shape.name} timing", total=settings.rounds + 1, unit="round",
                              enabled=show_progress) as bar:
                    timed = time_variants(shape, vs, settings, classes, log_root, tick=bar.advance)
            warmup = 0 if timed.get("warmup_dropped") else settings.warmup
            params = sum(p.numel() for p in build_module(shape, vs[0]).parameters())
            every_step = next((v.name for v in vs if v.monitor_every == 1 and not v.monitors), None)
            fallback = None
            if every_step and timed["records"][every_step][warmup:]:
                fallback = statistics.median(t for t, _ in timed["records"][every_step][warmup:])
            rows = []
            for v in vs:
                row = {"name": v.name, "group": v.group, "implementation": v.implementation, "spec": v.spec,
                       "monitor_every": v.monitor_every,
                       "monitors": [c.__name__ for c in chosen_monitors(classes, v.monitor_every, v.monitors)],
                       "time": summarise_times(timed["records"][v.name], warmup, v.monitor_every, fallback)}
                if v.name in timed["errors"]:
                    row["error"] = timed["errors"][v.name]
                rows.append(row)
            progress(f"[bench] {shape.name}: timing {time.perf_counter() - t0:.1f}s; memory pass")
            with Progress(f"bench {shape.name} memory", total=sum("error" not in r for r in rows), unit="variant",
                          enabled=show_progress) as bar:
                for v, row in zip(vs, rows):
                    if "error" in row:
                        continue
                    log_dir = os.path.join(log_root, "memory")
                    try:  # a process of its own per variant: its peak resident memory, and nothing kept here
                        if settings.fresh_process:
                            memory, resident = in_fresh_process(measure_memory, shape, v, settings, classes, log_dir)
                            row["memory"] = {**memory, **resident}
                        else:
                            row["memory"] = measure_memory(shape, v, settings, classes, log_dir)
                    except Exception:  # noqa: BLE001 - reported, not fatal
                        row["memory_error"] = traceback.format_exc(limit=4)
                    gc.collect()  # the variant's model, optimizer and trainer (cycles) go before the next one
                    bar.advance(v.name)
            base = {r["name"]: r for r in rows}
            sdpa, eager = base["stock sdpa"]["time"].get("step_s"), base["stock eager"]["time"].get("step_s")
            tokens = shape.batch_size * shape.seq_len
            for row in rows:
                step = row["time"].get("step_s")
                row["ratio_vs_sdpa"] = ratio_or_none(step, sdpa)
                row["ratio_vs_eager"] = ratio_or_none(step, eager)
                row["tokens_per_s"] = None if not step else tokens / step
                if gpu and step:
                    row["mfu"] = 6 * params * row["tokens_per_s"] / settings.peak_flops
            model = {"shape": asdict(shape), "params": params, "rows": rows,
                     "steps": {"warmup": settings.warmup, "rounds": settings.rounds, "chunk": settings.chunk,
                               "one_at_a_time": shape.one_at_a_time},
                     "budgets": budgets(rows, settings)}
            if settings.parity:
                progress(f"[bench] {shape.name}: parity of every path against stock ({settings.precision})")
                model["parity"] = check_parity(shape, settings)
            result["models"].append(model)
            if on_model is not None:  # partial results survive an interrupted long run
                on_model(result)
        settings = base_settings
    progress("[bench] analysis vs loop oracle")
    result["analysis"] = analysis_speed(settings)
    return result

