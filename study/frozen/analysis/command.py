"""`study analyze`: the paper's analyses (Algorithms 1-5, Lemma 1) on a model and a text, from the command line.

    study analyze --model <hub name | smollm2-135m | local HF dir | CausalLMModule .ckpt> --text <file | shakespeare>
                  [--tokenizer gpt2|DIR] [--lengths L ...] [--ns N ...] [--temperatures T ...]
                  [--vectors value|hidden] [--out DIR] [--max-length L] [--layers I ...]
                  [--device cpu|cuda] [--tensorboard] [--no-figures] [--n-fixed N] [--mc-samples K] [--seed S] [--threads N]
                  [--windows K] [--epsilons E ...] [--critical-ns N ...] [--analyses distance|critical|separability|gradient|dilution ...]

Everything cheap is checked first (numbers, files, the text, the model's context from its config) so that a
bad value fails with a message naming it before the model runs. Results go to --out (default
logs/analysis/<model name>/; an existing folder is never overwritten: a suffix -1, -2, ... is added).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from study.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="study analyze", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help="hub name (e.g. gpt2), an embedded model (smollm2-135m, offline), a local Hugging Face model "
                        "directory, or a CausalLMModule .ckpt")
    p.add_argument("--text", required=True, help="a text file, or 'shakespeare' (held-out plays of the embedded corpus)")
    p.add_argument("--tokenizer", default=None,
                   help="'gpt2' or a tokenizer directory (default: the model's own, or one saved beside the checkpoint)")
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="sequence lengths L for Alg. 1 (default: powers of two from 32 to --max-length)")
    p.add_argument("--ns", type=int, nargs="+", default=None, help="top-N sizes for Alg. 2 (default: 1 5 10 20 100)")
    p.add_argument("--critical-ns", type=int, nargs="+", default=None,
                   help="the grid of N that Alg. 3 searches N* on (default: every N up to 16, then 40 log-spaced "
                        "values up to the longest L); its cost grows with the number of values")
    p.add_argument("--n-fixed", type=int, default=5, help="N of Alg. 1 (default: 5)")
    p.add_argument("--temperatures", type=float, nargs="+", default=None,
                   help="temperatures of Alg. 5 (default: 17 values, log-spaced 1e-3 ... 10)")
    p.add_argument("--epsilons", type=float, nargs="+", default=None,
                   help="perturbation sizes eps of Alg. 5 (default: 1e-3 0.1 10)")
    p.add_argument("--windows", type=int, default=None,
                   help="analyse K independent windows of L tokens spread over the text (each held-out play for "
                        "'shakespeare'), the replicates of the per-window results (default: one, the text's start)")
    p.add_argument("--analyses", nargs="+", default=None, metavar="NAME",
                   help="the analyses to run (default: all): distance (Alg. 1-2), critical (Alg. 3), separability "
                        "(Alg. 4), gradient (Alg. 5), dilution (Lemma 1). With critical and dilution alone the "
                        "windows are analysed one at a time, so long contexts (L = 8192) fit in a few GB")
    p.add_argument("--vectors", choices=("value", "hidden"), default="value",
                   help="the x_i of the theorems: per-head value vectors or the block's input hidden states")
    p.add_argument("--out", default=None, help="output folder (default: logs/analysis/<model name>/)")
    p.add_argument("--max-length", type=int, default=None,
                   help="longest L (default: max of --lengths, else min(model context, 1024))")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="layer indices to analyse (default: all)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--mc-samples", type=int, default=4, help="Monte Carlo subsets per row for E (default: 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own); 1 is much faster on a shared, busy machine")
    p.add_argument("--no-figures", dest="figures", action="store_false", help="skip the PNG figures")
    p.add_argument("--estimate", action="store_true",
                   help="analyse the deepest chosen layer only and print the whole analysis's estimated seconds as JSON (what "
                        "`study sweep` prints up front); writes nothing")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard scalars to the output folder")
    return p


# ---------------------------------------------------------------------------------------------------------------
# cheap checks


def check_numbers(args) -> None:
    if args.lengths is not None:
        for n in args.lengths:
            if n < 1:
                raise ConfigError(f"L must be >= 1, got L={n}")
    if args.max_length is not None and args.max_length < 1:
        raise ConfigError(f"--max-length must be >= 1, got L={args.max_length}")
    for n in (args.ns or []) + (args.critical_ns or []) + [args.n_fixed]:
        if n < 1:
            raise ConfigError(f"N must be >= 1, got N={n}")
    if args.temperatures:
        from .rows import check_temperatures

        check_temperatures(args.temperatures)  # the analyses' own check, before the model loads
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    if args.windows is not None and args.windows < 1:
        raise ConfigError(f"--windows must be >= 1, got {args.windows}")
    for e in args.epsilons or []:
        if not e > 0:
            raise ConfigError(f"epsilon must be > 0, got eps={e}")
    if args.mc_samples < 0:
        raise ConfigError(f"--mc-samples must be >= 0, got {args.mc_samples}")
    for i in args.layers or []:
        if i < 0:
            raise ConfigError(f"layer indices must be >= 0, got layer {i}")
    if args.analyses is not None:
        from .registry import check_names

        try:
            check_names(args.analyses)
        except ValueError as err:
            raise ConfigError(f"--analyses: {err}") from err
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ConfigError(f"--device must be cpu or cuda, got {args.device!r}")


def model_name(name: str, kind: str) -> str:
    path = Path(name)
    if kind == "ckpt":
        # runs/<run>/checkpoints/last.ckpt -> <run>-last
        parent = path.parent.parent.name if path.parent.name == "checkpoints" else path.parent.name
        return f"{parent}-{path.stem}" if parent else path.stem
    if kind == "dir":
        return path.resolve().name
    if kind == "gguf":
        return path.stem
    return name.replace("/", "--")


def fresh_dir(path: Path) -> Path:
    """`path` if it does not exist, else path-1, path-2, ... (never overwrite an earlier analysis)."""
    if not path.exists():
        return path
    i = 1
    while Path(f"{path}-{i}").exists():
        i += 1
    return Path(f"{path}-{i}")


# ---------------------------------------------------------------------------------------------------------------
# model and tokenizer


def load_model_and_tokenizer(args, kind: str):
    """(model, tokenizer), by `study.frozen.load.load_frozen`: the model in eval mode on args.device."""
    from study.frozen.load import load_frozen

    frozen = load_frozen(args.model, tokenizer=args.tokenizer, device=args.device)
    return frozen.model, frozen.tokenizer


def resolve_lengths(args, context: int | None) -> tuple[list[int] | None, int]:
    """(lengths or None for the default grid, longest L), checked against the context and N."""
    if args.lengths:
        longest = max(args.lengths)
        if args.max_length is not None and args.max_length < longest:
            raise ConfigError(f"L={longest} exceeds --max-length {args.max_length}")
    else:
        longest = args.max_length or min(context or 1024, 1024)
    if context is not None:
        for n in sorted(set((args.lengths or []) + [longest])):
            if n > context:
                raise ConfigError(f"L={n} exceeds the model's context of {context} positions")
    if args.n_fixed > longest:
        raise ConfigError(f"N={args.n_fixed} exceeds L={longest}")
    if args.lengths and args.n_fixed > min(args.lengths):
        raise ConfigError(f"N={args.n_fixed} exceeds L={min(args.lengths)}")
    for n in (args.ns or []) + (args.critical_ns or []):  # explicit N only: the default grids are filtered to N <= L
        if n > longest:
            raise ConfigError(f"N={n} exceeds L={longest}")
    return (sorted(set(args.lengths)) if args.lengths else None), longest


# ---------------------------------------------------------------------------------------------------------------


def _analyze(args, model, input_ids, lengths, layers) -> dict:
    """Algorithms 1-5 and Lemma 1 with the command's settings on ``layers``."""
    from .grids import PAPER_EPSILONS, PAPER_NS
    from .protocol import analyze

    return analyze(model, input_ids, lengths=lengths, ns=args.ns or PAPER_NS, n_fixed=args.n_fixed,
                   temperatures=args.temperatures, epsilons=args.epsilons or PAPER_EPSILONS, vectors=args.vectors,
                   mc_samples=args.mc_samples, seed=args.seed, layers=layers, analyses=args.analyses,
                   critical_ns=args.critical_ns, show_progress=not args.estimate)


def estimate(args, model, input_ids, lengths, n_layers: int, started: float) -> dict:
    """Seconds the analysis should take, measured as a sweep measures its runs: everything up to the analysis
    done as `run` does it, then the last chosen layer analysed on every window (its capture is the forward pass as
    deep as the whole analysis goes) and the layer's own analysis scaled to the layer count.
    Writing the figures is not timed. Returns {"seconds", "parts", "timed_s"}, as `study probe --estimate`."""
    layers = sorted(set(args.layers)) if args.layers else list(range(n_layers))
    prepared = time.perf_counter()
    results = _analyze(args, model, input_ids, lengths, layers[-1:])
    capture = results["seconds_by_step"]["capture"]
    per_layer = time.perf_counter() - prepared - capture
    parts = {"load": prepared - started, "capture": capture, "layers": len(layers) * per_layer}
    return {"seconds": sum(parts.values()), "parts": parts, "timed_s": time.perf_counter() - started}


def run(args) -> Path | None:
    import torch

    from .outputs import write_outputs, write_tensorboard

    started = time.perf_counter()
    check_numbers(args)
    from study.frozen.load import config_context, is_tokenizer_dir, model_kind
    from study.frozen.text import documents, read_text
    from study.pretrained import EMBEDDED_MODELS, resolve_model

    named = args.model
    if named in EMBEDDED_MODELS or named.endswith(".gguf"):
        args.model = resolve_model(named)  # materialised once into a cached local folder (offline)
    kind = model_kind(args.model)
    if args.tokenizer and args.tokenizer != "gpt2" and not is_tokenizer_dir(args.tokenizer):
        raise ConfigError(f"tokenizer {args.tokenizer!r} is neither 'gpt2' nor a directory holding a saved tokenizer")
    lengths, longest = resolve_lengths(args, config_context(args.model, kind))
    text = read_text(args.text, min_chars=longest * 12)
    docs = documents(args.text) if args.windows else None  # each window inside one document

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(args, kind)
    from .capture import context_length

    context = context_length(model)
    lengths, longest = resolve_lengths(args, context)  # again, now that the model's context is known
    n_layers = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    if args.layers:
        bad = [i for i in args.layers if n_layers is not None and i >= n_layers]
        if bad:
            raise ConfigError(f"layer {bad[0]} not in the model, which has layers 0..{n_layers - 1}")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ConfigError(f"empty text: {args.text} gives no tokens")
    if len(ids) < longest:
        if args.lengths or args.max_length:
            raise ConfigError(f"L={longest} needs {longest} tokens but {args.text} has only {len(ids)}")
        longest = len(ids)
        print(f"note: the text has {len(ids)} tokens; analysing up to L={longest}", file=sys.stderr)
        if args.n_fixed > longest or any(n > longest for n in args.ns or []):
            raise ConfigError(f"N={max([args.n_fixed, *(args.ns or [])])} exceeds L={longest} (the text's token count)")
    input_ids = torch.tensor(ids[:longest], device=args.device)[None]
    origins = [{"text": 0, "start": 0}]
    if args.windows:
        from study.frozen.windows import text_windows

        windows = text_windows(tok, docs, args.windows, longest, seed=args.seed)
        input_ids, origins = windows.ids.to(args.device), windows.origins

    if args.estimate:
        from study.attention.hf import attention_modules

        print(json.dumps(estimate(args, model, input_ids, lengths, n_layers or len(attention_modules(model)), started)))
        return None
    out = Path(args.out) if args.out else Path("logs") / "analysis" / model_name(named, kind if named == args.model else "hub")
    out = fresh_dir(out)
    results = _analyze(args, model, input_ids, lengths, args.layers)
    results["source"] = {"model": named, "model_kind": kind, "text": args.text,
                         "tokenizer": args.tokenizer or "the model's own", "device": args.device,
                         "windows": origins, "argv": getattr(args, "argv", None)}
    paths = write_outputs(results, out, figures=args.figures)
    if args.tensorboard:
        write_tensorboard(results, out)
    print(f"analysed {args.model} ({results['model']['layers']} layers, {results['model']['heads']} heads, "
          f"normalisers {results['model']['normalizers']}) on {input_ids.shape[0]} x {longest} tokens in "
          f"{results['seconds']:.1f} s ({results['cpu_seconds']:.1f} s of CPU)")
    print((out / "claims.md").read_text())
    print(f"outputs in {out}: " + ", ".join(Path(p).name for p in paths.values())
          + (" + TensorBoard events" if args.tensorboard else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in results.json (a sweep caches by it)
    threads = torch.get_num_threads()
    try:
        run(args)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"study analyze: error: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)  # --threads is for this run only (main may be called in-process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
