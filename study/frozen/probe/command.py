"""`study probe`: how a frozen causal LM's attention-logit gradients respond to the temperature T.

    study probe --model <name | folder | .ckpt | hub name> --text <file | folder | shakespeare>
                [--temperatures 0.001 0.003 0.01 0.03 0.1 0.3 1 3 10] [--windows 20 --seq-len 128]
                [--single-layers 0 15 29] [--fp64-windows 2 --fp64-temperatures 0.001 0.01]
                [--hessian-iterations 10 --hessian-temperatures ...] [--quiet] --out logs/probe

No training. The replicates are independent text windows (`study.frozen.windows`: windows of --seq-len tokens
spread across the held-out plays or documents in proportion to their length, batch size 1), the same windows at
every T. For each T:

* T in every layer: the loss; the gradient norms of W_q and W_k (the parameters of the attention logits; GPT-2's
  fused c_attn split into its q/k/v blocks) per layer, beside the controls W_v, W_o, the MLP, the embeddings and
  the residual stream entering each layer; the attention Jacobian d alpha / d l on sampled rows (spectral norm
  distribution, the saturated fraction, and Corollary 3 entrywise: the largest |J_ij| against 1/(4T)); the
  spectral norm and largest eigenvalue of the loss Hessian restricted to W_q and W_k (power iteration on
  Hessian-vector products, normalised without overflow), on the first window;
* T in one layer only (each of --single-layers, stock attention elsewhere): that layer's own W_q/W_k gradient
  norm and the Jacobian of its rows. This is the paper's per-layer claim: with T lowered everywhere, a layer's
  gradient also crosses every low-T layer above it, which compounds with depth.
* an fp64 reference: the first --fp64-windows windows again with the model in float64, at --fp64-temperatures
  (default: the grid's T <= 0.01), for the W_q/W_k gradient norms of both kinds and the Hessian.

`study report` turns `<sweep>/probe/probe.json` into findings (docs/findings.md). Writes `<out>/probe.json`,
`<out>/probe.png` and (unless ``--no-tensorboard``, as a sweep runs it) TensorBoard scalars under `<out>/tensorboard` (step = index of T in the sorted grid):
`probe/...` for T in every layer, `probe/layer_<l>/<kind>` per layer, `probe/single_layer_<l>/...`.
These are built in a folder beside `<out>` and swapped in whole, so a kill leaves the previous output or none, and
a rerun into the same `<out>` replaces its event file (saying so when the settings differ) instead of adding a
second one beside it; an `<out>` that holds anything else is refused.

Progress: a bar with the time left on a terminal, else one line per step on stderr; ``--quiet`` turns it off.
Bad input (T <= 0, a missing model or text, a binary or empty text, a --seq-len beyond the model's context, a
layer the model does not have) fails before the model runs, naming the value.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from study.atomic import build_folder_whole, links_refused, replaced_folder_refused, write_text_atomically
from study.errors import ConfigError

# What an --out folder holds (the probe writes nothing else; `probe.log` is where older sweeps kept its log)
PROBE_FILES = ("probe.json", "probe.png", "probe.log", "tensorboard/", ".*.tmp*")
DEFAULT_TEMPERATURES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
FP64_BELOW = 0.01  # the fp64 reference's default temperatures: the grid's T at or below this


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="study probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an embedded model (smollm2-135m), a Hugging Face folder, a .gguf, "
                   "a study fit .ckpt or a hub name")  # fmt: skip
    p.add_argument("--text", default="shakespeare",
                   help="a text file, a folder of .txt files, or 'shakespeare' (the embedded held-out plays)")
    p.add_argument("--temperatures", type=float, nargs="+", default=list(DEFAULT_TEMPERATURES), help="the grid of T (> 0)")
    p.add_argument("--windows", dest="windows", type=int, default=20,
                   help="independent text windows = the replicates (batch size 1)")
    p.add_argument("--batch-size", type=int, default=1, help="must be 1: each window is one replicate")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per window")
    p.add_argument("--single-layers", type=int, nargs="*", default=None,
                   help="layers to lower T in one at a time (default: first, middle, last; none: no single-layer test)")
    p.add_argument("--jacobian-rows", type=int, default=32, help="attention rows sampled per layer and window")
    p.add_argument("--hessian-iterations", type=int, default=10, help="power iterations per phase (0: no Hessian)")
    p.add_argument("--hessian-temperatures", type=float, nargs="+", default=None,
                   help="the T (of the grid) at which the Hessian is measured (default: every T)")
    p.add_argument("--fp64-windows", type=int, default=2, help="windows repeated in float64 (0: no fp64 reference)")
    p.add_argument("--fp64-temperatures", type=float, nargs="+", default=None,
                   help=f"the T (of the grid) of the fp64 reference (default: the grid's T <= {FP64_BELOW:g})")
    p.add_argument("--seed", type=int, default=0, help="seed of the windows, the row sampler and the power iteration")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for this probe (default: as set; a sweep passes its `probe.threads`)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-tensorboard", action="store_true",
                   help="no TensorBoard events (a sweep's probe: its folder would show as a run beside the sweep's runs)")
    p.add_argument("--quiet", action="store_true", help="no progress report (a bar on a terminal, else a line per step)")
    p.add_argument("--estimate", action="store_true",
                   help="time each kind of step once on a few windows and print the probe's estimated seconds as JSON "
                        "(what `study sweep` prints up front); measures nothing else and writes nothing")
    return p


def check_numbers(args: argparse.Namespace) -> None:
    bad_t = [t for t in args.temperatures if not (math.isfinite(t) and t > 0)]
    if bad_t:
        raise ConfigError(f"--temperatures must all be > 0, got {bad_t}")
    for flag, value, low in (("--windows", args.windows, 1), ("--seq-len", args.seq_len, 2),
                             ("--jacobian-rows", args.jacobian_rows, 1), ("--hessian-iterations", args.hessian_iterations, 0),
                             ("--fp64-windows", args.fp64_windows, 0), ("--threads", 1 if args.threads is None else args.threads, 1)):  # fmt: skip
        if value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    if args.batch_size != 1:
        raise ConfigError(f"--batch-size must be 1 (each window is one replicate), got {args.batch_size}")
    if args.fp64_windows > args.windows:
        raise ConfigError(f"--fp64-windows {args.fp64_windows} exceeds --windows {args.windows}")
    grid = set(args.temperatures)
    for flag, values in (("--hessian-temperatures", args.hessian_temperatures), ("--fp64-temperatures", args.fp64_temperatures)):
        outside = sorted(set(values or []) - grid)
        if outside:
            raise ConfigError(f"{flag} {outside} not in --temperatures {sorted(grid)}")
    bad_layers = [i for i in args.single_layers or [] if i < 0]
    if bad_layers:
        raise ConfigError(f"--single-layers must be >= 0, got {bad_layers}")


def check_args(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Everything that can be checked without the weights; returns the text's documents."""
    from study.frozen.load import check_seq_len, config_context, model_kind
    from study.frozen.text import documents

    check_numbers(args)
    kind = model_kind(args.model)
    docs = documents(args.text)
    check_seq_len(args.seq_len, config_context(args.model, kind), args.model)
    return docs


def chosen_layers(args: argparse.Namespace, layers: int) -> list[int]:
    if args.single_layers is None:
        return sorted({0, layers // 2, layers - 1})
    missing = [i for i in args.single_layers if i >= layers]
    if missing:
        raise ConfigError(f"--single-layers {missing}: the model has layers 0..{layers - 1}")
    return sorted(set(args.single_layers))


def load_model(name: str):
    """The model (fp32, eval) and its tokenizer, by `study.frozen.load.load_frozen`."""
    from study.frozen.load import load_frozen

    frozen = load_frozen(name, dtype=torch.float32)
    return frozen.model, frozen.tokenizer


@dataclass
class ProbeWork:
    """The loaded model and what the probe will do with it: the steps in order (`run_probe`, `estimate_probe`)."""

    model: torch.nn.Module
    ids: torch.Tensor  # the windows (windows x seq_len), the same at every T
    windows: object  # `study.frozen.windows.TextWindows`: where each window comes from
    layers: list[int]  # the single-layer tests' layers
    grid: list[float]
    hessian_at: set[float]
    fp64_at: set[float]
    steps: list[tuple[object, float]]  # ("all", T), (layer, T), ("fp64", T)


def prepare(args: argparse.Namespace, docs: list[tuple[str, str]]) -> ProbeWork:
    """Load the model and the windows and list the steps: everything the probe does before measuring."""
    from study.frozen.load import check_seq_len, context_of
    from study.frozen.probe import measure
    from study.frozen.windows import text_windows

    model, tokenizer = load_model(args.model)
    check_seq_len(args.seq_len, context_of(model), args.model)  # a checkpoint's context is known only now
    # the documents take turns, so that the fp64 reference's first windows come from different documents
    windows = text_windows(tokenizer, docs, args.windows, args.seq_len, seed=args.seed).taking_turns()
    layers = chosen_layers(args, measure.num_layers(model))
    grid = sorted(set(args.temperatures))
    hessian_at = set(grid if args.hessian_temperatures is None else args.hessian_temperatures)
    hessian_at = hessian_at if args.hessian_iterations else set()
    fp64_at = set(args.fp64_temperatures if args.fp64_temperatures is not None else [t for t in grid if t <= FP64_BELOW])
    fp64_at = fp64_at if args.fp64_windows else set()
    steps = [("all", t) for t in grid] + [(layer, t) for layer in layers for t in grid]
    steps += [("fp64", t) for t in grid if t in fp64_at]
    return ProbeWork(model, windows.ids, windows, layers, grid, hessian_at, fp64_at, steps)


def run_probe(args: argparse.Namespace, docs: list[tuple[str, str]], argv: list[str] | None = None,
              show_progress: bool = False) -> dict:  # fmt: skip
    """Every step in turn (T in every layer, then each single layer, then the fp64 reference); with
    ``show_progress``, one report per step with the time left (`study.progress`)."""
    from study.frozen.probe import measure
    from study.progress import progress

    start = time.perf_counter()
    work = prepare(args, docs)
    model, windows, layers, grid = work.model, work.windows, work.layers, work.grid
    hessian_at, fp64_at, steps = work.hessian_at, work.fp64_at, work.steps
    results = {t: None for t in grid}
    single = {layer: {} for layer in layers}
    ids = work.ids

    def label(step) -> str:
        what, t = step
        return f"{t:g} " + {"all": "(every layer)", "fp64": "(fp64 reference)"}.get(what, f"(layer {what} alone)")

    for what, t in progress(steps, "probe", unit="T", enabled=show_progress, label=label):
        if what == "all":
            result = measure.all_layers(model, ids, t, args.jacobian_rows, args.seed)
            hessian = measure.hessian(model, ids[0], t, args.hessian_iterations, args.seed) if t in hessian_at else (None, None)
            result["hessian_qk_norm"], result["hessian_qk_top"] = hessian
            results[t] = result
        elif what == "fp64":
            model.double()
            reference = {"windows": args.fp64_windows,
                         "grad_attn_qk": measure.qk_gradient(model, ids[: args.fp64_windows], t, None)}  # fmt: skip
            if t in hessian_at:
                reference["hessian_qk_norm"], reference["hessian_qk_top"] = measure.hessian(
                    model, ids[0], t, args.hessian_iterations, args.seed)  # fmt: skip
            results[t]["fp64"] = reference
            for layer in layers:
                single[layer][t]["fp64"] = {"windows": args.fp64_windows,
                                            "grad_attn_qk": measure.qk_gradient(model, ids[: args.fp64_windows], t, layer)}  # fmt: skip
            model.float()
        else:
            single[what][t] = measure.single_layer(model, ids, t, what, args.jacobian_rows, args.seed)
    return {
        "model": args.model, "text": args.text, "windows": args.windows, "seq_len": args.seq_len,
        "window_sources": [list(s) for s in windows.sources], "layers": measure.num_layers(model),
        "jacobian_rows": args.jacobian_rows, "hessian_iterations": args.hessian_iterations,
        "fp64_windows": args.fp64_windows, "fp64_temperatures": sorted(fp64_at), "seed": args.seed,
        "seconds": round(time.perf_counter() - start, 1), "argv": argv, "results": [results[t] for t in grid],
        "single_layer": [{"layer": layer, "results": [single[layer][t] for t in grid]} for layer in layers],
    }  # fmt: skip


# What `estimate_probe` times each kind of step on; the probe's own counts scale it up.
TIMED_WINDOWS = 2  # windows of the every-layer and single-layer steps (a pass runs up to WINDOWS_PER_PASS at once)
TIMED_HESSIAN_ITERATIONS = 2  # power iterations of the Hessian (its cost is about linear in them)


def _seconds(call, *args) -> float:
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started


def _across(layers: list[int], seconds_at) -> float:
    """The summed cost of a single-layer step over ``layers``: a layer's backward pass stops at it, so the cost
    falls with depth; the shallowest and the deepest layer are timed (``seconds_at(layer)``), those between
    interpolated."""
    first, last = seconds_at(layers[0]), (seconds_at(layers[-1]) if len(layers) > 1 else None)
    if last is None:
        return first
    return sum(first + (last - first) * (layer - layers[0]) / (layers[-1] - layers[0]) for layer in layers)


def estimate_probe(args: argparse.Namespace, docs: list[tuple[str, str]]) -> dict:
    """Seconds the probe should take, measured as a sweep measures its runs: the model and windows loaded, then
    each kind of step timed once, after a warm-up, at the grid's lowest T (on `TIMED_WINDOWS` windows, the single-layer step in the
    first and the last chosen layer; the Hessian for `TIMED_HESSIAN_ITERATIONS` iterations; the fp64 reference on
    one window) and scaled to the probe's counts.
    Writes nothing. Returns {"seconds": total, "parts": {part: seconds}, "timed_s": what timing it took}."""
    from study.frozen.probe import measure

    started = time.perf_counter()
    work = prepare(args, docs)
    model, t, layers = work.model, work.grid[0], work.layers
    parts = {"load": time.perf_counter() - started}
    timed = min(TIMED_WINDOWS, len(work.ids))
    ids = work.ids[:timed]
    iterations = min(TIMED_HESSIAN_ITERATIONS, args.hessian_iterations)
    per_iteration = args.hessian_iterations / iterations if iterations else 0.0

    def hessian_s() -> float:
        return _seconds(measure.hessian, model, work.ids[0], t, iterations, args.seed) * per_iteration

    # a fresh process's first backward pass pays one-off set-up (up to 1.4x a step, measured): warm up first
    measure.all_layers(model, work.ids[:1], t, args.jacobian_rows, args.seed)
    every = _seconds(measure.all_layers, model, ids, t, args.jacobian_rows, args.seed) / timed
    parts["every layer"] = len(work.grid) * args.windows * every
    if work.hessian_at:
        parts["hessian"] = len(work.hessian_at) * hessian_s()
    if layers:
        one = _across(layers, lambda layer: _seconds(measure.single_layer, model, ids, t, layer, args.jacobian_rows,
                                                     args.seed) / timed)  # fmt: skip
        parts["single layers"] = len(work.grid) * args.windows * one
    if work.fp64_at:
        model.double()
        per_t = args.fp64_windows * _seconds(measure.qk_gradient, model, work.ids[:1], t, None)
        if layers:
            per_t += args.fp64_windows * _across(layers, lambda layer: _seconds(measure.qk_gradient, model,
                                                                                work.ids[:1], t, layer))  # fmt: skip
        parts["fp64 reference"] = len(work.fp64_at) * per_t
        if work.fp64_at & work.hessian_at:
            parts["fp64 reference"] += len(work.fp64_at & work.hessian_at) * hessian_s()
        model.float()
    return {"seconds": sum(parts.values()), "parts": parts, "timed_s": time.perf_counter() - started}


def _previous_argv(out: Path) -> list[str] | None:
    """The arguments the probe already in ``out`` ran with (None when there is none or it does not read)."""
    try:
        return json.loads((out / "probe.json").read_text()).get("argv")
    except (OSError, ValueError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    from study.console import silence_library_notices
    from study.frozen.probe.writers import console_lines, write_figure, write_tensorboard

    args = build_parser().parse_args(argv)
    out = Path(args.out)
    # before the model is loaded: nothing is written through a link, nothing the probe did not write is deleted
    if refused := links_refused(out) or replaced_folder_refused(out, PROBE_FILES, "probe"):
        print(f"study probe: {refused}", file=sys.stderr)
        return 2
    silence_library_notices()
    threads = torch.get_num_threads()
    try:
        docs = check_args(args)
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.estimate:
            print(json.dumps(estimate_probe(args, docs)))
            return 0
        report = run_probe(args, docs, argv=list(argv) if argv is not None else sys.argv[1:], show_progress=not args.quiet)
    except ConfigError as err:
        print(f"study probe: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)  # --threads is for this probe only (a sweep calls main in its own process)
    if (previous := _previous_argv(out)) is not None and previous != report.get("argv"):
        print(f"study probe: {out} held a probe made with other settings; its probe.json, figure and event file "
              "are replaced whole", flush=True)

    def write(folder: Path) -> None:
        write_text_atomically(folder / "probe.json", json.dumps(report, indent=1))
        write_figure(report, folder)
        if not args.no_tensorboard:
            write_tensorboard(report, folder)

    build_folder_whole(out, write)
    for line in console_lines(report):
        print(line)
    print(f"probe: {out / 'probe.json'} ({report['seconds']} s)")
    return 0
