"""`study bench`: training-step time and peak memory of each attention path, with and without monitors.

    study bench [--quick] [--out DIR] [--models small,gpt2-vocab] [--peak-flops 989e12]
    python scripts/bench.py ...   (the same)

What is measured, in ONE process:

- Step time of a REAL Lightning training step (`GPT2Module.training_step` + backward + gradient clipping + AdamW
  step + the callbacks' hooks), from ``on_train_batch_start`` (first callback) to ``on_train_batch_end`` (last
  callback). Data loading is not timed. Each variant runs its own `Trainer.fit` in its own thread, but only one
  thread runs at a time: a baton passes round-robin after every ``chunk`` steps, so variants are INTERLEAVED
  (drift and noise from other jobs on the machine hit every variant alike). Time per variant = median over the
  timed steps after ``warmup`` steps.
- Monitors logging every N steps: their tap opens on steps with ``global_step % N == 0``. The amortised step time
  is ``((N - 1) * median(non-logging steps) + median(logging steps)) / N``; when the run is too short to hold a
  timed logging step of that variant, the logging-step median of the every-step variant (same monitors, same
  work) stands in (the JSON says which).
- Peak memory, in a separate pass after the timing (so profiling never slows the timed steps): on a GPU,
  ``torch.cuda.max_memory_allocated`` over one steady-state step (third step, AdamW state allocated). On a CPU,
  torch has no allocator statistics and tracemalloc / RSS do not see torch's allocations reliably; we run one
  steady-state step under ``torch.profiler`` with ``profile_memory=True`` and take the peak of the running sum of
  its allocation/free events (the most tensor memory live at once during the step, above what was live before
  it), plus the bytes that live across steps (parameters, buffers, AdamW state). Monitor variants are profiled on
  a logging step (their peak).
- Analysis speed: `study.analysis.run.benchmark_against_oracle` (vectorised Theorem-1 statistics vs the per-row
  loop oracle), repeated, median.
- On a GPU also tokens/s (always reported) and model FLOPs utilisation: ``6 * params * tokens/s / peak_flops``
  (all parameters, embeddings included; attention's own L^2 FLOPs are left out, as in the usual 6ND estimate).
  ``--peak-flops`` defaults to 989e12, the dense bf16 peak of an H100/H200 SXM.

Budgets (CPU, ratios on the same model): temperature only <= 1.03 x stock SDPA; top-k <= 1.3 x stock eager;
monitors every 50 steps <= 1.05 x no monitors; every step <= 1.5 x; peak memory with monitors <= 1.1 x.
The result is written as ``bench.json`` and ``bench.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

MONITOR_NAMES = ("AttentionEntropyMonitor", "SelectionUniformityMonitor", "GradientNormMonitor", "AttentionMapMonitor")
H100_BF16_PEAK_FLOPS = 989e12


@dataclass(frozen=True)
class Shape:
    name: str
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    vocab_size: int = 8192
    batch_size: int = 8
    seq_len: int = 128


SHAPES = {
    "small": Shape("small"),
    "gpt2-vocab": Shape("gpt2-vocab", vocab_size=50257),
    "gpt2-124m": Shape("gpt2-124m", n_layer=12, n_head=12, n_embd=768, vocab_size=50257),
}


@dataclass
class Variant:
    name: str
    group: str  # stock | temperature | top_k | normalizer | monitors
    implementation: str  # sdpa | eager | study
    spec: dict = field(default_factory=dict)  # AttentionSpec keywords
    monitor_every: int | None = None


@dataclass
class Settings:
    shapes: list[Shape]
    rounds: int = 8
    chunk: int = 4
    warmup: int = 4
    top_ks: tuple[int, ...] = (4, 16, 64)
    normalizers: tuple[str, ...] = ("sparsemax", "entmax15", "entmax", "ssmax", "self_adjust")
    temperature: float = 0.5
    monitor_every: tuple[int, ...] = (1, 50)
    # Shapes with a 50257-token vocabulary (4-6x slower steps) run this fraction of the rounds and chunk.
    large_vocab_fraction: float = 0.5
    analysis_lengths: tuple[int, ...] = (512,)
    analysis_repeats: int = 3
    analysis_oracle_rows: int | None = 64
    peak_flops: float = H100_BF16_PEAK_FLOPS
    device: str = "cpu"
    precision: str = "32-true"


def variants(settings: Settings, monitors_available: bool) -> list[Variant]:
    out = [
        Variant("stock sdpa", "stock", "sdpa"),
        Variant("stock eager", "stock", "eager"),
        Variant(f"temperature T={settings.temperature}", "temperature", "study", {"temperature": settings.temperature}),
    ]
    out += [Variant(f"top-k k={k}", "top_k", "study", {"top_k": k}) for k in settings.top_ks]
    out += [Variant(f"{name}", "normalizer", "study", {"normalizer": name}) for name in settings.normalizers]
    if monitors_available:
        out += [
            Variant(f"T={settings.temperature} + monitors every {n}", "monitors", "study",
                    {"temperature": settings.temperature}, monitor_every=n)
            for n in settings.monitor_every
        ]
    return out


def monitor_classes() -> tuple[list[type], str | None]:
    """The monitor callbacks `study.callbacks` has now, and a note naming any that are missing."""
    try:
        import study.callbacks as callbacks
    except ImportError as error:  # pragma: no cover - the package always exists
        return [], f"study.callbacks not importable ({error})"
    found = [getattr(callbacks, name) for name in MONITOR_NAMES if hasattr(callbacks, name)]
    missing = [name for name in MONITOR_NAMES if not hasattr(callbacks, name)]
    note = None
    if missing:
        note = f"study.callbacks lacks {', '.join(missing)}: " + ("monitor rows skipped" if not found else "measured without them")
    return found, note


# ----- timing -------------------------------------------------------------------------------------------------


class Baton:
    """Round-robin turns between threads: exactly one variant's steps run at any time."""

    def __init__(self, names: list[str]) -> None:
        self.order = list(names)
        self.arrived: set[str] = set()
        self.turn: int | None = None  # None until every thread is ready (set-up never overlaps timed steps)
        self.cv = threading.Condition()

    def _current(self) -> str | None:
        return None if self.turn is None or not self.order else self.order[self.turn]

    def wait(self, name: str) -> None:
        with self.cv:
            self.arrived.add(name)
            if self.turn is None and self.arrived >= set(self.order):
                self.turn = 0
                self.cv.notify_all()
            self.cv.wait_for(lambda: self._current() == name)

    def pass_on(self, name: str, done: bool = False) -> None:
        with self.cv:
            if name not in self.order:
                return
            i = self.order.index(name)
            if done:
                self.order.pop(i)
                self.arrived.discard(name)
                if self.turn is not None:
                    self.turn = i % len(self.order) if self.order else 0
                if self.turn is None and self.order and self.arrived >= set(self.order):
                    self.turn = 0
            elif self.turn is not None:
                self.turn = (i + 1) % len(self.order)
            self.cv.notify_all()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _make_callbacks(name: str, baton: Baton | None, warmup: int, chunk: int, device: str, record: list,
                    monitor_every: int | None):
    from lightning.pytorch.callbacks import Callback

    class Start(Callback):
        def __init__(self) -> None:
            self.count = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if baton is not None:
                if self.count == 0:
                    baton.wait(name)
                elif self.count >= warmup and (self.count - warmup) % chunk == 0:
                    baton.pass_on(name)
                    baton.wait(name)
            self.count += 1
            self.logging = monitor_every is not None and trainer.global_step % monitor_every == 0
            _sync(device)
            self.t0 = time.perf_counter()

    start = Start()

    class Stop(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            _sync(device)
            record.append((time.perf_counter() - start.t0, start.logging))

    return start, Stop()


def _module(shape: Shape, variant: Variant, seed: int = 0):
    from study.attention import AttentionSpec
    from study.model import GPT2Module

    torch.manual_seed(seed)
    module = GPT2Module(
        AttentionSpec(**variant.spec), n_layer=shape.n_layer, n_head=shape.n_head, n_embd=shape.n_embd,
        n_positions=max(shape.seq_len, 64), vocab_size=shape.vocab_size, block_size=shape.seq_len, warmup_steps=1,
    )
    if variant.implementation != "study":
        module.model.set_attn_implementation(variant.implementation)
    return module


def _loader(shape: Shape, steps: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(shape.vocab_size, (steps * shape.batch_size, shape.seq_len), generator=gen)
    data = [{"input_ids": row} for row in ids]
    return torch.utils.data.DataLoader(data, batch_size=shape.batch_size, shuffle=False)


def _trainer(settings: Settings, steps: int, callbacks: list, log_dir: str):
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    accelerator = "gpu" if settings.device.startswith("cuda") else "cpu"
    return L.Trainer(
        accelerator=accelerator, devices=1, precision=settings.precision, max_steps=steps, max_epochs=-1,
        logger=TensorBoardLogger(log_dir, name="bench", version=0), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0, num_sanity_val_steps=0,
        limit_val_batches=0, callbacks=callbacks,
    )


def _monitors(classes: list[type], every: int | None) -> list:
    return [] if every is None else [cls(every_n_steps=every) for cls in classes]


def time_variants(shape: Shape, vs: list[Variant], settings: Settings, classes: list[type], log_root: str) -> dict:
    """Interleaved Lightning fits, one thread per variant; returns per-variant step records (seconds, logging)."""
    steps = settings.warmup + settings.rounds * settings.chunk
    baton = Baton([v.name for v in vs])
    records: dict[str, list] = {v.name: [] for v in vs}
    errors: dict[str, str] = {}

    def run(variant: Variant) -> None:
        try:
            module = _module(shape, variant)
            start, stop = _make_callbacks(variant.name, baton, settings.warmup, settings.chunk, settings.device,
                                          records[variant.name], variant.monitor_every)
            log_dir = os.path.join(log_root, f"{shape.name}-{len(records)}-{abs(hash(variant.name))}")
            trainer = _trainer(settings, steps, [start, *_monitors(classes, variant.monitor_every), stop], log_dir)
            trainer.fit(module, train_dataloaders=_loader(shape, steps))
        except BaseException:  # a failing variant must not hang the others
            errors[variant.name] = traceback.format_exc(limit=4)
        finally:
            baton.pass_on(variant.name, done=True)

    # The first chunk is the warm-up: the baton rotates after `warmup` steps, then every `chunk`.
    threads = [threading.Thread(target=run, args=(v,), name=f"bench-{v.name}") for v in vs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"records": records, "errors": errors}


def summarise_times(records: list, warmup: int, every: int | None, fallback_log: float | None) -> dict:
    timed = records[warmup:]
    if not timed:
        return {"step_s": None, "steps": 0}
    all_s = [t for t, _ in timed]
    out = {"steps": len(timed), "median_all_s": statistics.median(all_s)}
    if every is None or every == 1:
        out["step_s"] = out["median_all_s"]
        return out
    plain = [t for t, logging in timed if not logging]
    logged = [t for t, logging in timed if logging]
    log_s, source = (statistics.median(logged), "own") if logged else (fallback_log, "every-step variant")
    plain_s = statistics.median(plain) if plain else log_s
    out.update(non_logging_step_s=plain_s, logging_step_s=log_s, logging_step_source=source)
    out["step_s"] = None if log_s is None else ((every - 1) * plain_s + log_s) / every
    return out


# ----- memory -------------------------------------------------------------------------------------------------


def _resident_bytes(module, trainer) -> int:
    seen, total = set(), 0
    tensors = list(module.parameters()) + list(module.buffers())
    for optimizer in trainer.optimizers:
        for state in optimizer.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v)]
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def measure_memory(shape: Shape, variant: Variant, settings: Settings, classes: list[type], log_dir: str) -> dict:
    """Peak bytes of one steady-state step (the third; a logging step for monitor variants)."""
    from lightning.pytorch.callbacks import Callback

    device = settings.device
    result: dict = {}

    class Probe(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if trainer.global_step != 2:
                return
            _sync(device)
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
                self.before = torch.cuda.memory_allocated()
            else:
                self.resident = _resident_bytes(pl_module, trainer)
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
                self.prof.__enter__()

    class ProbeEnd(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step != 3:  # incremented by the optimizer step
                return
            _sync(device)
            if device.startswith("cuda"):
                result.update(peak_bytes=torch.cuda.max_memory_allocated(), method="torch.cuda.max_memory_allocated")
                return
            probe.prof.__exit__(None, None, None)
            events = [e for e in probe.prof.profiler.kineto_results.events()
                      if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
            live = peak = 0
            for e in sorted(events, key=lambda e: e.start_ns()):
                live += e.nbytes()
                peak = max(peak, live)
            result.update(step_peak_bytes=peak, resident_bytes=probe.resident, peak_bytes=probe.resident + peak,
                          method="torch.profiler memory events: resident (params, buffers, AdamW state) + step peak")

    probe = Probe()
    module = _module(shape, variant)
    every = None if variant.monitor_every is None else 1  # tap on the profiled step
    trainer = _trainer(settings, 3, [probe, *_monitors(classes, every), ProbeEnd()], log_dir)
    trainer.fit(module, train_dataloaders=_loader(shape, 3))
    return result


# ----- analysis -----------------------------------------------------------------------------------------------


def analysis_speed(settings: Settings) -> list[dict]:
    from study.analysis.run import benchmark_against_oracle

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


# ----- budgets, report ----------------------------------------------------------------------------------------

BUDGETS = (
    ("temperature only / stock sdpa", 1.03),
    ("top-k / stock eager", 1.3),
    ("monitors every 50 / no monitors", 1.05),
    ("monitors every step / no monitors", 1.5),
    ("peak memory with monitors / without", 1.1),
)


def _ratio(a, b):
    return None if a is None or b is None or b <= 0 else a / b


def budgets(rows: list[dict], settings: Settings) -> list[dict]:
    by = {r["name"]: r for r in rows}
    step = {name: r["time"].get("step_s") for name, r in by.items()}
    mem = {name: r.get("memory", {}).get("peak_bytes") for name, r in by.items()}
    temp = f"temperature T={settings.temperature}"
    out = [{"budget": BUDGETS[0][0], "variant": temp, "ratio": _ratio(step.get(temp), step.get("stock sdpa")),
            "limit": BUDGETS[0][1]}]
    for k in settings.top_ks:
        name = f"top-k k={k}"
        out.append({"budget": BUDGETS[1][0], "variant": name, "ratio": _ratio(step.get(name), step.get("stock eager")),
                    "limit": BUDGETS[1][1]})
    for n in settings.monitor_every:
        name = f"T={settings.temperature} + monitors every {n}"
        if name not in by:
            continue
        if n == 1:
            limit = BUDGETS[3]
        elif n == 50:
            limit = BUDGETS[2]
        else:
            limit = (f"monitors every {n} / no monitors", None)
        out.append({"budget": limit[0], "variant": name, "ratio": _ratio(step.get(name), step.get(temp)),
                    "limit": limit[1]})
        out.append({"budget": BUDGETS[4][0], "variant": name, "ratio": _ratio(mem.get(name), mem.get(temp)),
                    "limit": BUDGETS[4][1]})
    for b in out:
        b["verdict"] = ("n/a" if b["ratio"] is None or b["limit"] is None
                        else "PASS" if b["ratio"] <= b["limit"] else "MISS")
    # Memory rows of every-50 and every-step monitors are the same measurement (a logging step): keep one.
    seen, unique = set(), []
    for b in out:
        key = (b["budget"], b["ratio"]) if b["budget"] == BUDGETS[4][0] else id(b)
        if key not in seen:
            seen.add(key)
            unique.append(b)
    return unique


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


def run_benchmark(settings: Settings, progress=print, on_model=None) -> dict:
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
            progress(f"[bench] {shape.name}: {len(vs)} variants x {settings.warmup}+{settings.rounds}x{settings.chunk} "
                     "steps, interleaved")
            t0 = time.perf_counter()
            timed = time_variants(shape, vs, settings, classes, log_root)
            params = sum(p.numel() for p in _module(shape, vs[0]).parameters())
            every_step = next((v.name for v in vs if v.monitor_every == 1), None)
            fallback = None
            if every_step and timed["records"][every_step][settings.warmup:]:
                fallback = statistics.median(t for t, _ in timed["records"][every_step][settings.warmup:])
            rows = []
            for v in vs:
                row = {"name": v.name, "group": v.group, "implementation": v.implementation, "spec": v.spec,
                       "monitor_every": v.monitor_every,
                       "time": summarise_times(timed["records"][v.name], settings.warmup, v.monitor_every, fallback)}
                if v.name in timed["errors"]:
                    row["error"] = timed["errors"][v.name]
                rows.append(row)
            progress(f"[bench] {shape.name}: timing {time.perf_counter() - t0:.1f}s; memory pass")
            for v, row in zip(vs, rows):
                if "error" in row:
                    continue
                try:
                    row["memory"] = measure_memory(shape, v, settings, classes, os.path.join(log_root, "memory"))
                except Exception:  # noqa: BLE001 - reported, not fatal
                    row["memory_error"] = traceback.format_exc(limit=4)
            base = {r["name"]: r for r in rows}
            sdpa, eager = base["stock sdpa"]["time"].get("step_s"), base["stock eager"]["time"].get("step_s")
            tokens = shape.batch_size * shape.seq_len
            for row in rows:
                step = row["time"].get("step_s")
                row["ratio_vs_sdpa"] = _ratio(step, sdpa)
                row["ratio_vs_eager"] = _ratio(step, eager)
                row["tokens_per_s"] = None if not step else tokens / step
                if gpu and step:
                    row["mfu"] = 6 * params * row["tokens_per_s"] / settings.peak_flops
            result["models"].append({"shape": asdict(shape), "params": params, "rows": rows,
                                     "steps": {"warmup": settings.warmup, "rounds": settings.rounds,
                                               "chunk": settings.chunk},
                                     "budgets": budgets(rows, settings)})
            if on_model is not None:  # partial results survive an interrupted long run
                on_model(result)
        settings = base_settings
    progress("[bench] analysis vs loop oracle")
    result["analysis"] = analysis_speed(settings)
    return result


def _fmt(value, spec=".3f"):
    return "-" if value is None else format(value, spec)


def to_markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads), torch {m['torch']}"
             + (f", {m['gpu']}" if "gpu" in m else "")]
    s = result["settings"]
    lines.append("Protocol: real Lightning training steps (forward + backward + grad clipping + AdamW + callbacks), "
                 f"variants round-robin in one process, median step time after warm-up. Precision {s['precision']}.")
    for note in result["notes"]:
        lines.append(f"Note: {note}")
    gpu = str(s["device"]).startswith("cuda")
    for model in result["models"]:
        sh = model["shape"]
        lines += ["", f"### {sh['name']}: GPT-2 {sh['n_layer']} layers x {sh['n_embd']}, {sh['n_head']} heads, "
                  f"vocab {sh['vocab_size']}, batch {sh['batch_size']} x {sh['seq_len']} ({model['params'] / 1e6:.1f} M params); "
                  f"{model['steps']['warmup']} warm-up + {model['steps']['rounds']} x {model['steps']['chunk']} steps",
                  ""]
        header = "| variant | path | step ms | x sdpa | x eager | tokens/s | peak MB | x mem |"
        rule = "|---|---|---:|---:|---:|---:|---:|---:|"
        if gpu:
            header, rule = header + " MFU |", rule + "---:|"
        lines += [header, rule]
        mem0 = next((r.get("memory", {}).get("peak_bytes") for r in model["rows"] if r["name"] == "stock sdpa"), None)
        for r in model["rows"]:
            step = r["time"].get("step_s")
            peak = r.get("memory", {}).get("peak_bytes")
            path = r["implementation"] if r["implementation"] != "study" else (
                "study fast (SDPA)" if r["group"] in ("temperature", "monitors") else "study explicit fp32")
            if r["group"] == "monitors":
                path += ", taps on logging steps"
            cells = [r["name"] + (" (FAILED)" if "error" in r else ""), path, _fmt(step and step * 1e3, ".1f"),
                     _fmt(r["ratio_vs_sdpa"]), _fmt(r["ratio_vs_eager"]), _fmt(r["tokens_per_s"], ".0f"),
                     _fmt(peak and peak / 2**20, ".1f"), _fmt(_ratio(peak, mem0))]
            if gpu:
                cells.append(_fmt(r.get("mfu"), ".1%"))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "| budget | variant | ratio | limit | verdict |", "|---|---|---:|---:|---|"]
        for b in model["budgets"]:
            lines.append(f"| {b['budget']} | {b['variant']} | {_fmt(b['ratio'])} | {_fmt(b['limit'], '.2f')} | "
                         f"{b['verdict']} |")
    if result["analysis"]:
        lines += ["", "### Analysis (Theorem 1 statistics, one causal head) vs the loop oracle", "",
                  "| L | vectorised s | loop s | speed-up | oracle rows |", "|---:|---:|---:|---:|---:|"]
        for a in result["analysis"]:
            lines.append(f"| {a['L']} | {a['vectorised_s']:.4f} | {a['loop_s']:.3f} | {a['speedup']:.0f}x | "
                         f"{a['oracle_rows']} |")
    return "\n".join(lines) + "\n"


def write(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bench.json", out / "bench.md"
    json_path.write_text(json.dumps(result, indent=2, default=lambda o: None if isinstance(o, float) and not
                                    math.isfinite(o) else str(o)) + "\n")
    md_path.write_text(to_markdown(result))
    return json_path, md_path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="study bench", description=__doc__.split("\n\n")[0],
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
    parser.add_argument("--analysis-length", default=None, help="comma-separated L for the oracle comparison (default 512; quick 256)")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    names = (args.models or ("small" if args.quick else "small,gpt2-vocab")).split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown model shape(s) {unknown}; choose from {sorted(SHAPES)}")
    lengths = args.analysis_length or ("256" if args.quick else "512")
    return Settings(
        shapes=[SHAPES[n] for n in names],
        rounds=args.rounds or (2 if args.quick else 8),
        chunk=args.chunk or (1 if args.quick else 4),
        warmup=args.warmup or (1 if args.quick else 4),
        top_ks=tuple(int(k) for k in args.top_k.split(",")),
        analysis_lengths=tuple(int(n) for n in lengths.split(",")),
        analysis_repeats=2 if args.quick else 3,
        peak_flops=args.peak_flops,
        device=args.device,
        precision=args.precision or ("bf16-mixed" if args.device.startswith("cuda") else "32-true"),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    settings = settings_from_args(args)
    result = run_benchmark(settings, on_model=lambda partial: write(partial, args.out))
    json_path, md_path = write(result, args.out)
    print(to_markdown(result))
    print(f"[bench] wrote {json_path} and {md_path}")
    failed = [r["name"] for m in result["models"] for r in m["rows"] if "error" in r]
    if failed:
        print(f"[bench] FAILED variants: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
