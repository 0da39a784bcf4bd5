"""`study bench --interception`: what the SDPA interception itself costs, on an unlogged training step.

Two copies of the same LitGPT model (same weights), one unpatched and one under ``AttentionSpec()`` (T = 1, no
top-k: the interception hands each call to `attend`, which runs the same fused kernel) through
`study.attention.intercept`. A step is forward, backward and an SGD update on a random batch; the two copies take
turns, a chunk of steps each per round, in one process, so both see the same machine load. The ratio is the
median patched step over the median unpatched step. Two shapes: LitGPT's tiny test config and the small GPT-2
shape of `study bench` (4 layers x 128, 4 heads, vocab 8192, batch 8 x 128) as a LitGPT model.
"""

from __future__ import annotations

import copy
import os
import statistics
import time

import torch

INTERCEPTION_SHAPES = {
    # name: (Config keywords, batch, length)
    "litgpt-tiny": (dict(n_layer=2, n_head=4, n_embd=16, n_query_groups=2, vocab_size=32, intermediate_size=32,
                         norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", bias=False), 2, 12),
    "small": (dict(n_layer=4, n_head=4, n_embd=128, vocab_size=8192, bias=True, norm_class_name="LayerNorm",
                   mlp_class_name="GptNeoxMLP", intermediate_size=512), 8, 128),
}


def _model(keywords: dict, length: int):
    from litgpt.config import Config
    from litgpt.model import GPT

    return GPT(Config(block_size=length, padded_vocab_size=keywords["vocab_size"], parallel_residual=False,
                      **keywords))


def _step(model, optimizer, batch) -> None:
    logits = model(batch)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def measure_shape(name: str, rounds: int = 8, chunk: int = 4, warmup: int = 3, seed: int = 0) -> dict:
    """Median step times (s) of the unpatched and the intercepted copy and their ratio, for one shape."""
    from study.attention import AttentionSpec, apply_attention_spec

    keywords, batch_size, length = INTERCEPTION_SHAPES[name]
    torch.manual_seed(seed)
    stock = _model(keywords, length)
    patched = apply_attention_spec(copy.deepcopy(stock), AttentionSpec())
    batch = torch.randint(0, keywords["vocab_size"], (batch_size, length), generator=torch.Generator().manual_seed(seed))
    runs = {"unpatched": (stock, torch.optim.SGD(stock.parameters(), lr=1e-3)),
            "intercepted": (patched, torch.optim.SGD(patched.parameters(), lr=1e-3))}
    times: dict[str, list[float]] = {label: [] for label in runs}
    for model, optimizer in runs.values():
        for _ in range(warmup):
            _step(model, optimizer, batch)
    for round_ in range(rounds):
        order = list(runs) if round_ % 2 == 0 else list(reversed(runs))  # neither copy always goes first
        for label in order:
            model, optimizer = runs[label]
            for _ in range(chunk):
                start = time.perf_counter()
                _step(model, optimizer, batch)
                times[label].append(time.perf_counter() - start)
    medians = {label: statistics.median(values) for label, values in times.items()}
    return {"shape": name, "steps": rounds * chunk, **{f"{label}_s": value for label, value in medians.items()},
            "ratio": medians["intercepted"] / medians["unpatched"]}


def run_interception(rounds: int = 8, chunk: int = 4, warmup: int = 3) -> dict:
    """Every shape, with the machine's load average before and after and the torch threads."""
    load_before = os.getloadavg()
    rows = [measure_shape(name, rounds, chunk, warmup) for name in INTERCEPTION_SHAPES]
    return {"rows": rows, "load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def interception_markdown(result: dict) -> str:
    lines = [f"torch {result['torch']}, {result['threads']} threads on {result['cpus']} CPUs; load average (1, 5, 15 min) "
             f"before {tuple(round(x, 2) for x in result['load_before'])}, after "
             f"{tuple(round(x, 2) for x in result['load_after'])}.", "",
             "| shape | steps each | unpatched step | intercepted step (T = 1, no top-k) | ratio |", "|---|---:|---:|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {row['shape']} | {row['steps']} | {row['unpatched_s'] * 1e3:.2f} ms | "
                     f"{row['intercepted_s'] * 1e3:.2f} ms | {row['ratio']:.3f}x |")
    return "\n".join(lines) + "\n"


__all__ = ["INTERCEPTION_SHAPES", "interception_markdown", "measure_shape", "run_interception"]
