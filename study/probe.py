"""`study probe`: how a frozen causal LM's loss and attention-logit gradients respond to the temperature T.

    study probe --model <folder | hub name> --text <file | shakespeare> [--temperatures 0.01 0.03 0.1 0.3 1]
                [--batches 4 --batch-size 2 --seq-len 128 --hessian-iterations 10] [--quiet] --out logs/probe

No training: for each T of the grid (the model's scores divided by T in every layer, `study.attention`), on the
same few batches of text:

* the loss and the gradient norms of W_q and W_k (the parameters of the attention logits; GPT-2's fused c_attn
  split into its q/k/v blocks) against the rest of the model;
* the exact spectral norm of the attention Jacobian d alpha / d l on sampled rows (`softmax_jacobian_norm`,
  the secular-equation solver) as a distribution (mean, 10/50/90th percentiles, max), the fraction of rows above
  1/(4T) and above sqrt 2 (the paper's stated bound is min(1/(4T), sqrt 2)), and the saturated fraction (max
  weight > 0.99: such rows have a Jacobian near 0 whatever T, which hides a 1/T law);
* the spectral norm and the largest eigenvalue of the loss Hessian restricted to W_q and W_k, by power iteration
  on Hessian-vector products (double backward through the explicit attention path), on the first batch.

This is the most direct test of "gradients scale like 1/T": `study report` fits the log-log slope of the W_q/W_k
gradient norm against T with a bootstrap over the batches when `<sweep>/probe/probe.json` exists.

Writes `<out>/probe.json`, `<out>/probe.png` and (unless ``--no-tensorboard``, as a sweep runs it) TensorBoard
scalars under `<out>/tensorboard` (step = index of T
in the sorted grid; `probe/temperature` holds T at each step): `probe/loss`, `probe/grad_norm/{attn_q,attn_k,
attn_qk,rest,total}`, `probe/jacobian/{mean,p10,p50,p90,max}`, `probe/jacobian/frac_above_quarter_T`,
`probe/jacobian/frac_above_sqrt2`, `probe/saturated_fraction`, `probe/hessian_qk_norm`, `probe/hessian_qk_top`.

Progress: a bar with the time left on a terminal, else one line per T on stderr
(``[probe] T 0.1 (3/5) in 12.0s, about 0:24 left``); ``--quiet`` turns it off.

Bad input (T <= 0, a model folder or name that does not exist, an empty or missing text) fails before the model
is loaded, naming the value.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from study import tags

DEFAULT_TEMPERATURES = (0.01, 0.03, 0.1, 0.3, 1.0)


class ProbeError(ValueError):
    """Input the probe cannot use; raised before the model is loaded."""


# ---- input ----------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="study probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a local Hugging Face model folder or a hub name")
    p.add_argument("--text", default="shakespeare", help="a text file, or 'shakespeare' (the embedded validation plays)")
    p.add_argument("--temperatures", type=float, nargs="+", default=list(DEFAULT_TEMPERATURES), help="the grid of T (> 0)")
    p.add_argument("--batches", type=int, default=4, help="batches of text (the bootstrap's replicates)")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per batch")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--jacobian-rows", type=int, default=64, help="attention rows sampled per layer and batch")
    p.add_argument("--hessian-iterations", type=int, default=10, help="power iterations per phase (0: no Hessian)")
    p.add_argument("--seed", type=int, default=0, help="seed of the row sampler and the power iteration")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-tensorboard", action="store_true",
                   help="no TensorBoard events (a sweep's probe: its folder would show as a run beside the sweep's runs)")
    p.add_argument("--quiet", action="store_true", help="no progress report (a bar on a terminal, else a line per T)")
    return p


def _embedded(name: str) -> bool:
    """A short name of a model the project embeds (smollm2-135m)."""
    from study.pretrained import EMBEDDED_MODELS

    return name in EMBEDDED_MODELS


def check_model(name: str) -> None:
    """A model folder with config.json, an embedded model's short name, or a hub name ("org/name" or "name";
    offline, only one already in the local hub cache)."""
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ProbeError(f"--model {name!r} is not a Hugging Face model folder (no config.json)")
        return
    if _embedded(name):
        return
    if not name or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ProbeError(f"--model {name!r}: no such folder")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ProbeError(f"--model {name!r} is not a local folder and not in the hub cache (HF_HUB_OFFLINE=1)")


def read_text(text: str) -> str:
    if text == "shakespeare":
        from study.data import shakespeare_files

        content = "\n".join(Path(f).read_text(errors="replace") for f in shakespeare_files()["validation"])
    elif Path(text).is_file():
        content = Path(text).read_text(errors="replace")
    else:
        raise ProbeError(f"--text {text!r}: no such file (or 'shakespeare')")
    if not content.strip():
        raise ProbeError(f"--text {text!r} is empty")
    return content


def check_args(args: argparse.Namespace) -> str:
    """Validate everything that can be checked without the model; returns the text."""
    bad_t = [t for t in args.temperatures if not (math.isfinite(t) and t > 0)]
    if bad_t:
        raise ProbeError(f"--temperatures must all be > 0, got {bad_t}")
    for flag, value, low in (("--batches", args.batches, 1), ("--batch-size", args.batch_size, 1),
                             ("--seq-len", args.seq_len, 2), ("--jacobian-rows", args.jacobian_rows, 1),
                             ("--hessian-iterations", args.hessian_iterations, 0)):  # fmt: skip
        if value < low:
            raise ProbeError(f"{flag} must be >= {low}, got {value}")
    check_model(args.model)
    return read_text(args.text)


def load_model(name: str):
    """The model (fp32, eval) and its tokenizer: the one place the probe loads them."""
    from transformers import AutoTokenizer

    from study.console import quiet_loading
    from study.pretrained import load_causal_lm, resolve_model

    name = resolve_model(name)  # an embedded short name (smollm2-135m) becomes its cached folder
    model = load_causal_lm(name, dtype=torch.float32)
    with quiet_loading():
        tokenizer = AutoTokenizer.from_pretrained(name)
    return model.eval(), tokenizer


def make_batches(tokenizer, text: str, batches: int, batch_size: int, seq_len: int) -> list[Tensor]:
    """Consecutive non-overlapping blocks of seq_len tokens, batch_size per batch."""
    need = batches * batch_size * seq_len
    ids: list[int] = []
    for start in range(0, len(text), 200_000):  # tokenise only as much text as the batches need
        ids += tokenizer(text[start : start + 200_000])["input_ids"]
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise ProbeError(f"the text has {len(ids)} tokens; {batches} x {batch_size} x {seq_len} = {need} needed")
    blocks = torch.tensor(ids[:need]).view(batches, batch_size, seq_len)
    return list(blocks)


# ---- measurements ---------------------------------------------------------------------------------------------
class RowSampler:
    """An attention tap that keeps a few random rows of every layer (for the Jacobian and saturation)."""

    def __init__(self, rows: int, generator: torch.Generator) -> None:
        self.rows, self.generator, self.sampled = rows, generator, []

    def observe(self, layer, weights, allowed, spec) -> None:
        from study.metrics import sample_rows

        self.sampled.append(sample_rows(weights.float(), allowed, self.rows, generator=self.generator).double())


class ExplicitPath:
    """A tap that observes nothing: while open, attention takes its explicit path (double backward works there;
    the fused SDPA kernels do not support it)."""

    def observe(self, layer, weights, allowed, spec) -> None:
        pass


def qk_masks(model: nn.Module) -> list[tuple[nn.Parameter, Tensor]]:
    """(parameter, 0/1 mask of its W_q / W_k entries) for every parameter that holds attention-logit weights."""
    from study.metrics import fused_qkv_split, parameter_kind

    out = []
    for name, p in model.named_parameters():
        kind = parameter_kind(name)
        if kind in ("attn_q", "attn_k"):
            out.append((p, torch.ones_like(p)))
        elif kind == "attn_qkv":
            mask = torch.zeros_like(p)
            q, k, _ = fused_qkv_split(name, mask)  # views into mask
            q.fill_(1.0)
            k.fill_(1.0)
            out.append((p, mask))
    if not out:
        raise ProbeError(f"{type(model).__name__}: no W_q / W_k parameters found by name")
    return out


def gradient_norms(model: nn.Module) -> dict[str, float]:
    from study.metrics import grouped_grad_norms

    norms = {k: float(v) for k, v in grouped_grad_norms(model.named_parameters(), by=("kind",)).items()}
    q, k, total = norms.get("attn_q", 0.0), norms.get("attn_k", 0.0), norms["total"]
    qk = math.hypot(q, k)
    return {"attn_q": q, "attn_k": k, "attn_qk": qk, "rest": math.sqrt(max(total**2 - qk**2, 0.0)), "total": total}


def jacobian_stats(rows: Tensor, temperature: float) -> dict[str, float]:
    from study.metrics import SATURATED, softmax_jacobian_norm

    norms = softmax_jacobian_norm(rows, temperature)
    q = torch.quantile(norms, torch.tensor([0.1, 0.5, 0.9], dtype=norms.dtype)).tolist()
    return {
        "mean": float(norms.mean()), "p10": q[0], "p50": q[1], "p90": q[2], "max": float(norms.max()),
        "frac_above_quarter_T": float((norms > 1 / (4 * temperature)).double().mean()),
        "frac_above_sqrt2": float((norms > math.sqrt(2)).double().mean()),
        "saturated_fraction": float((rows.amax(-1) > SATURATED).double().mean()),
        "rows": norms.numel(),
    }  # fmt: skip


def _power(hvp, v: list[Tensor], iterations: int, shift: float = 0.0) -> tuple[list[Tensor], float]:
    """Power iteration on (H + shift I); returns the last vector and |(H + shift I) v| for a unit v."""
    norm = 0.0
    for _ in range(iterations):
        length = torch.sqrt(sum((x * x).sum() for x in v))
        v = [x / length for x in v]
        hv = [h + shift * x for h, x in zip(hvp(v), v)]
        norm = float(torch.sqrt(sum((h * h).sum() for h in hv)))
        v = [h.detach() for h in hv]
    return v, norm


def hessian_qk(model: nn.Module, batch: Tensor, iterations: int, generator: torch.Generator) -> tuple[float, float]:
    """(spectral norm, largest eigenvalue) of the loss Hessian restricted to W_q, W_k, by power iteration.

    The restriction is the principal sub-matrix on the masked entries: each Hessian-vector product is masked.
    The q-k cross terms make the spectrum nearly symmetric (eigenvalues in +- pairs), where plain power
    iteration does not settle on one eigenvector; |H v| still converges to the spectral norm rho, and power
    iteration on H + rho I (all eigenvalues >= 0) then gives the largest eigenvalue as its norm minus rho.
    """
    pairs = qk_masks(model)
    params, masks = [p for p, _ in pairs], [m for _, m in pairs]
    loss = model(input_ids=batch, labels=batch).loss
    grads = torch.autograd.grad(loss, params, create_graph=True)

    def hvp(v: list[Tensor]) -> list[Tensor]:
        hv = torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)
        return [h * m for h, m in zip(hv, masks)]

    v = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) * m for p, m in pairs]
    v, rho = _power(hvp, v, iterations)
    _, shifted = _power(hvp, v, iterations, shift=rho)
    return rho, shifted - rho


def probe_temperature(model: nn.Module, batches: list[Tensor], temperature: float, args) -> dict:
    """Every measurement at one T (the model's attention set to T first).

    The row sampler and the power iteration restart from `args.seed` at every T: the sampled rows depend only on
    the mask, so every T measures the same rows from the same start (a paired comparison across T)."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping

    generator = torch.Generator().manual_seed(args.seed)
    apply_attention_spec(model, AttentionSpec(temperature=temperature))
    per_batch, sampled = [], []
    for batch in batches:
        sampler = RowSampler(args.jacobian_rows, generator)
        model.zero_grad(set_to_none=True)
        with tapping(sampler):  # also forces the explicit attention path
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        norms = gradient_norms(model)
        sampled += sampler.sampled
        per_batch.append({"loss": float(loss.detach()), **{f"grad_{k}": v for k, v in norms.items()}})
    model.zero_grad(set_to_none=True)
    width = max(r.shape[-1] for r in sampled)
    rows = torch.cat([nn.functional.pad(r, (0, width - r.shape[-1])) for r in sampled])
    hessian = (None, None)
    if args.hessian_iterations:
        with tapping(ExplicitPath()):  # double backward needs the explicit attention path
            hessian = hessian_qk(model, batches[0], args.hessian_iterations, generator)
    mean = {k: sum(b[k] for b in per_batch) / len(per_batch) for k in per_batch[0]}
    jac = jacobian_stats(rows, temperature)
    return {
        "temperature": temperature, **mean, "jacobian": jac, "saturated_fraction": jac["saturated_fraction"],
        "hessian_qk_norm": hessian[0], "hessian_qk_top": hessian[1], "batches": per_batch,
    }  # fmt: skip


# ---- output ---------------------------------------------------------------------------------------------------
def scalars(result: dict) -> dict[str, float]:
    """The TensorBoard scalars of one temperature's result (see the module docstring)."""
    out = {"temperature": result["temperature"], "loss": result["loss"]}
    for key in ("attn_q", "attn_k", "attn_qk", "rest", "total"):
        out[tags.grad_norm(key)] = result[f"grad_{key}"]
    for key in ("mean", "p10", "p50", "p90", "max", "frac_above_quarter_T", "frac_above_sqrt2"):
        out[f"jacobian/{key}"] = result["jacobian"][key]
    out["saturated_fraction"] = result["saturated_fraction"]
    for key in ("hessian_qk_norm", "hessian_qk_top"):
        if result[key] is not None:
            out[key] = result[key]
    return {tags.probe(k): float(v) for k, v in out.items()}


def write_tensorboard(results: list[dict], out: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "tensorboard"))
    for step, result in enumerate(results):
        for tag, value in scalars(result).items():
            writer.add_scalar(tag, value, step)
    writer.close()


def write_figure(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["temperature"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for key, label in (("grad_attn_q", "W_q"), ("grad_attn_k", "W_k"), ("grad_rest", "rest of the model")):
        axes[0].plot(t, [r[key] for r in results], "o-", label=label)
    ref = results[-1]["grad_attn_qk"] * results[-1]["temperature"]
    axes[0].plot(t, [ref / x for x in t], "k--", lw=1, label="1/T (through the last point)")
    axes[0].set(xscale="log", yscale="log", xlabel="temperature T", title="gradient norm (mean over batches)")
    for key in ("p10", "p50", "p90", "max"):
        axes[1].plot(t, [max(r["jacobian"][key], 1e-12) for r in results], "o-", label=f"Jacobian {key}")
    axes[1].plot(t, [1 / (4 * x) for x in t], "k--", lw=1, label="1/(4T)")
    axes[1].axhline(math.sqrt(2), color="grey", ls="-.", lw=1, label="sqrt 2")
    twin = axes[1].twinx()
    twin.plot(t, [r["saturated_fraction"] for r in results], "rs:", label="saturated rows")
    twin.set(ylim=(-0.02, 1.02), ylabel="saturated fraction (red)")
    axes[1].set(xscale="log", yscale="log", xlabel="temperature T", title="attention Jacobian on sampled rows")
    axes[2].plot(t, [r["loss"] for r in results], "o-", label="loss")
    measured = [(x, r["hessian_qk_norm"]) for x, r in zip(t, results) if r["hessian_qk_norm"] is not None]
    drawn = [(x, h) for x, h in measured if math.isfinite(h) and h > 0]  # a log axis drops the others silently
    if drawn:
        axes[2].plot(*zip(*drawn), "s-", label="Hessian spectral norm (W_q, W_k)")
    if len(drawn) < len(measured):
        missing = ", ".join(f"{x:g}" for x, h in measured if (x, h) not in drawn)
        axes[2].text(0.02, 0.02, f"Hessian not finite or not > 0 at T = {missing} (not drawn)", fontsize=7,
                     transform=axes[2].transAxes)
    axes[2].set(xscale="log", yscale="log", xlabel="temperature T", title="loss and curvature")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "probe.png", dpi=90)
    plt.close(fig)


def run_probe(args: argparse.Namespace, text: str, argv: list[str] | None = None, show_progress: bool = False) -> dict:
    """Every T of the grid in turn; with ``show_progress``, one report per T with the time left (`study.progress`)."""
    from study.progress import progress

    start = time.perf_counter()
    model, tokenizer = load_model(args.model)
    batches = make_batches(tokenizer, text, args.batches, args.batch_size, args.seq_len)
    grid = sorted(set(args.temperatures))
    results = [probe_temperature(model, batches, t, args)
               for t in progress(grid, "probe", unit="T", enabled=show_progress, label="{:g}".format)]
    return {
        "model": args.model, "text": args.text, "batches": args.batches, "batch_size": args.batch_size,
        "seq_len": args.seq_len, "jacobian_rows": args.jacobian_rows, "hessian_iterations": args.hessian_iterations,
        "seed": args.seed, "seconds": round(time.perf_counter() - start, 1), "argv": argv, "results": results,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from study.console import silence_library_notices

    args = _parser().parse_args(argv)
    silence_library_notices()
    try:
        text = check_args(args)
        report = run_probe(args, text, argv=list(argv) if argv is not None else sys.argv[1:],
                           show_progress=not args.quiet)
    except ProbeError as err:
        print(f"study probe: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
    write_figure(report["results"], out)
    if not args.no_tensorboard:
        write_tensorboard(report["results"], out)
    for r in report["results"]:
        print(
            f"T={r['temperature']:g}: loss {r['loss']:.4g}, |grad W_q,W_k| {r['grad_attn_qk']:.4g}, rest {r['grad_rest']:.4g}, "
            f"Jacobian p50 {r['jacobian']['p50']:.4g}, saturated {r['saturated_fraction']:.3g}"
        )
    print(f"probe: {out / 'probe.json'} ({report['seconds']} s)")
    return 0
