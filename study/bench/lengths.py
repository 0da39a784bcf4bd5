"""`study bench --lengths`: peak memory and time of each attention path against the context length L.

SmolLM2-135M's attention shape (9 query / 3 key-value heads, head size 64, causal, batch 1, fp32), forward and
backward of:

- one attention call (`study.attention.attend` on random q, k, v), and
- one full SmolLM2 decoder layer (a randomly initialised one-layer Llama with SmolLM2's widths: RMSNorm,
  rotary q/k, attention, SwiGLU MLP), fed random embeddings,

for these paths: stock SDPA (PyTorch's fused kernel, plain softmax: the reference cost), the dense explicit path
(one (B, H, L, L) fp32 score tensor, `BlockwiseSettings.min_scores` set out of reach) and the blockwise explicit
path (forced on at any L), under top-k and sparsemax; both explicit paths run with a tap open, as a logged step
does. The gathered path (``paths`` "gathered"; softmax top-k only) runs with no tap open, as an unlogged training
step does, and gathering forced at every L (``gather_keys_per_pick`` = 1: the default rule keeps short rows on the
dense path): top-k by selection, then gather (`study.attention.topk`). The dense path is
skipped above ``dense_max_length``: at L = 8192 it would need about 16-22 GB for one call.

- the whole SmolLM2-135M (unit "model", with ``units``: 30 layers and the loss over its 49152-token vocabulary),
  random tokens, optionally with activation checkpointing (``checkpointing``).

Resident memory: each row runs in a fresh process (`study.resident`) and reports that process's peak
resident memory and how much the measured steps added to it (over the peak once the inputs and the model were
built): what runs out on a machine. Memory as the profiler sees it: on a CPU, the peak of the running sum of `torch.profiler`'s allocation events during the forward and
backward pass (tensor bytes live at once above what lived before: the inputs and parameters are not counted); on
a GPU, ``torch.cuda.max_memory_allocated`` minus what was allocated before. Time: CPU time of the process
(`time.process_time`, robust to other jobs on the machine) on a CPU, wall time after synchronising on a GPU;
short calls are repeated and the median taken.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from study.attention import AttentionSpec, attend, blockwise_settings, tapping
from study.attention.blockwise import block_rows
from study.bench.memory import profiled_peak_bytes
from study.resident import in_fresh_process

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M
HIDDEN, INTERMEDIATE = 576, 1536
SMOLLM2_LAYERS, SMOLLM2_VOCAB = 30, 49152
PATHS = ("stock sdpa", "dense explicit", "blockwise", "gathered")
NEVER = 2**62


@dataclass
class LengthSettings:
    lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    specs: dict[str, dict] = field(default_factory=lambda: {"top-k k=8": {"top_k": 8}, "sparsemax": {"normalizer": "sparsemax"}})
    layer_specs: tuple[str, ...] = ("top-k k=8",)  # the full-layer rows (the call rows take every spec)
    dense_max_length: int = 4096
    units: tuple[str, ...] = ("call", "layer")  # and "model": the whole SmolLM2 (its rows take layer_specs)
    device: str = "cpu"
    repeat_below: int = 2048  # lengths below this are timed 3 times after a warm-up (median)
    checkpointing: bool = False  # activation checkpointing of the layer and model rows (`CausalLMModule`'s option)
    fresh_process: bool = True  # each row in a process of its own: its peak resident memory (`study.resident`)
    paths: tuple[str, ...] = PATHS[1:3]  # the paths measured beside stock SDPA (default: the explicit ones)

    def __post_init__(self) -> None:
        bad = [n for n in self.lengths if isinstance(n, bool) or not isinstance(n, int) or n < 2]
        if bad or not self.lengths:
            raise ValueError(f"lengths must be integers >= 2, got {list(self.lengths)!r}")
        unknown = [name for name in self.layer_specs if name not in self.specs]
        if unknown:
            raise ValueError(f"layer_specs {unknown} are not among specs {sorted(self.specs)}")
        if not self.paths or set(self.paths) - set(PATHS[1:]):
            raise ValueError(f"paths must be among {list(PATHS[1:])}, got {list(self.paths)!r}")
        if not self.units or set(self.units) - {"call", "layer", "model"}:
            raise ValueError(f"units must be among 'call', 'layer' and 'model', got {list(self.units)!r}")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_bytes(step: Callable[[], None], device: str) -> int:
    """Most tensor bytes live at once during ``step`` beyond those live before it."""
    _sync(device)
    if device.startswith("cuda"):
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        _sync(device)
        return torch.cuda.max_memory_allocated() - before
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with profiler:
        step()
    return profiled_peak_bytes(profiler)


def seconds(step: Callable[[], None], device: str, repeats: int) -> float:
    """Median time of ``step``: CPU time of the process on a CPU, wall time on a GPU."""
    clock = time.perf_counter if device.startswith("cuda") else time.process_time
    times = []
    for _ in range(repeats):
        _sync(device)
        start = clock()
        step()
        _sync(device)
        times.append(clock() - start)
    return statistics.median(times)


class _ExplicitPath:
    """An open tap that reads nothing. With no tap open, softmax top-k takes the gathered path
    (`study.attention.topk`, measured by `study bench --fused-stats`); this keeps the explicit paths measured
    here explicit, as a logged step or another normaliser runs them."""

    row_blocks = True  # accepts the blockwise path's rows a block at a time

    def observe(self, layer, weights, allowed, spec) -> None:
        return None


@contextlib.contextmanager
def _path_settings(path: str):
    with contextlib.ExitStack() as stack:
        if path == "gathered":  # no tap, as an unlogged step; gathering forced, so the row is that path at any L
            stack.enter_context(blockwise_settings(gather_keys_per_pick=1))
        else:
            stack.enter_context(blockwise_settings(min_scores=NEVER if path == "dense explicit" else 0))
            if path != "stock sdpa":
                stack.enter_context(tapping(_ExplicitPath()))
        yield


def _softmax_top_k(spec: dict) -> bool:
    """Whether an `AttentionSpec`'s keywords ask for softmax top-k, the one spec the gathered path computes."""
    return spec.get("top_k") is not None and spec.get("normalizer", "softmax") == "softmax"


def call_step(length: int, path: str, spec: AttentionSpec, device: str, checkpointing: bool = False) -> Callable[[], None]:
    """Forward and backward of one attention call at SmolLM2's head shape (nothing to checkpoint)."""
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, h, length, HEAD_DIM, generator=g).to(device).requires_grad_(True)
               for h in (HEADS, KV_HEADS, KV_HEADS))
    spec = AttentionSpec() if path == "stock sdpa" else spec

    def step() -> None:
        with _path_settings(path):
            out = attend(q, k, v, spec)
        out.sum().backward()
        for t in (q, k, v):
            t.grad = None

    return step


def _llama(model_class, length: int, path: str, spec: AttentionSpec, device: str, checkpointing: bool, **config):
    from transformers import LlamaConfig

    from study.attention import apply_attention_spec
    from study.model import enable_gradient_checkpointing

    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, max_position_embeddings=length, **config)  # fmt: skip
    torch.manual_seed(0)
    model = model_class(config).to(device).train()
    if path == "stock sdpa":
        model.set_attn_implementation("sdpa")
    else:
        apply_attention_spec(model, spec)
    if checkpointing:
        enable_gradient_checkpointing(model)
    return model


def layer_step(length: int, path: str, spec: AttentionSpec, device: str, checkpointing: bool = False) -> Callable[[], None]:
    """Forward and backward of one SmolLM2 decoder layer (random weights) on random embeddings."""
    from transformers import LlamaModel

    model = _llama(LlamaModel, length, path, spec, device, checkpointing, vocab_size=16, num_hidden_layers=1)
    embeds = torch.randn(1, length, HIDDEN, generator=torch.Generator().manual_seed(length)).to(device)
    embeds.requires_grad_(True)

    def step() -> None:
        with _path_settings(path):
            out = model(inputs_embeds=embeds).last_hidden_state
        out.sum().backward()
        model.zero_grad(set_to_none=True)
        embeds.grad = None

    return step


def measure(unit: str, name: str, path: str, length: int, settings: LengthSettings) -> dict:
    """One row's seconds and profiler peak, and the peak resident memory once its inputs (and model) were built
    (``base_rss_bytes``: what the forward and backward add to it is the row's extra resident memory)."""
    from study.resident import max_rss_bytes

    build = {"call": call_step, "layer": layer_step, "model": model_step}[unit]
    spec = AttentionSpec(**settings.specs.get(name, {}))
    step = build(length, path, spec, settings.device, settings.checkpointing)
    base = max_rss_bytes()
    repeats = 3 if length < settings.repeat_below and unit != "model" else 1  # the whole model: seconds a pass
    if repeats > 1:
        step()  # warm-up: first-call costs (allocator, lazy initialisation) left out
    row = {"seconds": seconds(step, settings.device, repeats), "base_rss_bytes": base}
    if unit != "model":  # on the whole model the profiler's event log costs as much as the step, and its figure
        row["peak_bytes"] = peak_bytes(step, settings.device)  # is not the one that runs out: resident memory only
    return row


def model_step(length: int, path: str, spec: AttentionSpec, device: str, checkpointing: bool = False) -> Callable[[], None]:
    """Forward and backward of the whole SmolLM2-135M (its shape: 30 layers, vocabulary 49152, tied embeddings;
    random weights: memory and time do not depend on them) on random tokens, with the language-model loss."""
    from transformers import LlamaForCausalLM

    model = _llama(LlamaForCausalLM, length, path, spec, device, checkpointing, vocab_size=SMOLLM2_VOCAB,
                   num_hidden_layers=SMOLLM2_LAYERS, tie_word_embeddings=True)  # fmt: skip
    ids = torch.randint(SMOLLM2_VOCAB, (1, length), generator=torch.Generator().manual_seed(length)).to(device)

    def step() -> None:
        with _path_settings(path):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def run_length_sweep(settings: LengthSettings, tick: Callable[[str], None] = lambda _: None) -> dict:
    """Every (unit, spec, path, L) row: peak extra bytes and seconds of forward + backward (or why skipped)."""
    rows = []
    plan = []
    for unit, specs in (("call", list(settings.specs)), ("layer", list(settings.layer_specs)),
                        ("model", list(settings.layer_specs))):  # fmt: skip
        if unit not in settings.units:
            continue
        for length in settings.lengths:
            plan.append((unit, "stock", "stock sdpa", length))
            for name in specs:
                plan += [(unit, name, path, length) for path in settings.paths]
    for unit, name, path, length in plan:
        row = {"unit": unit, "spec": name, "path": path, "L": length}
        if path == "blockwise":  # at short L one block holds every row: the blockwise path is the dense one
            with _path_settings(path):
                rows_per_block = block_rows(HEADS, length, length)
            row["blocks"] = 1 if rows_per_block is None else -(-length // rows_per_block)
        if path == "dense explicit" and length > settings.dense_max_length:
            row["skipped"] = f"dense path above L = {settings.dense_max_length}"
        elif path == "gathered" and not _softmax_top_k(settings.specs.get(name, {})):
            row["skipped"] = "the gathered path is softmax top-k's"
        elif settings.fresh_process:
            measured, resident = in_fresh_process(measure, unit, name, path, length, settings)
            row.update(measured, max_rss_bytes=resident["max_rss_bytes"],
                       extra_rss_bytes=resident["max_rss_bytes"] - measured.pop("base_rss_bytes"))
        else:
            row.update(measure(unit, name, path, length, settings))
            row.pop("base_rss_bytes")
        rows.append(row)
        tick(f"{unit} {name} {path} L={length}")
    return {"settings": asdict(settings), "rows": rows}


def total_units(settings: LengthSettings) -> int:
    per_length = 0
    if "call" in settings.units:
        per_length += 1 + len(settings.paths) * len(settings.specs)
    for unit in ("layer", "model"):
        if unit in settings.units:
            per_length += 1 + len(settings.paths) * len(settings.layer_specs)
    return per_length * len(settings.lengths)


def lengths_markdown(result: dict) -> str:
    """One table per unit: each spec and path's peak memory (MB) and time (s) against L."""
    rows = result["rows"]
    lengths = sorted({r["L"] for r in rows})
    gpu = str(result["settings"]["device"]).startswith("cuda")
    clock = "wall s" if gpu else "CPU s"
    resident = any("extra_rss_bytes" in r for r in rows)
    cell = "extra peak MB (profiler) / extra resident MB / peak resident MB / " if resident else "extra peak MB / "
    checkpointed = ", activation checkpointing" if result["settings"].get("checkpointing") else ""
    lines = []
    for unit, title in (("call", "one attention call"), ("layer", f"one SmolLM2 decoder layer{checkpointed}"),
                        ("model", f"the whole SmolLM2-135M (30 layers, vocabulary 49152, loss){checkpointed}")):  # fmt: skip
        chosen = [r for r in rows if r["unit"] == unit]
        if not chosen:
            continue
        lines += ["", f"{title} (SmolLM2 head shape: 9 query / 3 key-value heads, D = 64, causal, batch 1, fp32, "
                  f"forward + backward): {cell}{clock}", "",
                  "| spec | path | " + " | ".join(f"L = {n}" for n in lengths) + " |",
                  "|---|---|" + "---:|" * len(lengths)]
        keys = list(dict.fromkeys((r["spec"], r["path"]) for r in chosen))
        for spec, path in keys:
            cells = []
            for n in lengths:
                r = next((r for r in chosen if r["spec"] == spec and r["path"] == path and r["L"] == n), None)
                if r is None or "skipped" in r:
                    cells.append("-")
                elif "extra_rss_bytes" in r:
                    profiled = f"{r['peak_bytes'] / 2**20:.0f}" if "peak_bytes" in r else "-"
                    cells.append(f"{profiled} / {r['extra_rss_bytes'] / 2**20:.0f} / "
                                 f"{r['max_rss_bytes'] / 2**20:.0f} / {r['seconds']:.2f}")
                else:
                    cells.append(f"{r['peak_bytes'] / 2**20:.0f} / {r['seconds']:.2f}")
            lines.append(f"| {spec} | {path} | " + " | ".join(cells) + " |")
        blocks = {r["L"]: r["blocks"] for r in chosen if "blocks" in r}
        if blocks:  # one block is the dense path itself
            lines += ["", "Blocks of query rows per blockwise call: "
                      + ", ".join(f"L = {n}: {blocks[n]}" for n in sorted(blocks)) + "."]
    return "\n".join(lines).lstrip("\n")


__all__ = ["PATHS", "LengthSettings", "call_step", "layer_step", "lengths_markdown", "measure", "model_step",
           "peak_bytes", "run_length_sweep", "seconds", "total_units"]
