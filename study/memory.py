"""A lower bound of one training step's memory, and what the machine offers: a run that cannot fit is refused
before it starts, with the estimate and the limit, instead of growing for minutes and dying on one allocation.

The bound counts only memory a step cannot do without, each part at its smallest:
- the weights, their gradients (the trainable ones) and the optimiser's state (AdamW: two tensors a weight);
- the logits and the log-probabilities the cross-entropy keeps for the backward pass (B x L x vocabulary each,
  the second in float32 whatever the precision: transformers' loss upcasts the logits);
- the activations each layer keeps for the backward pass, B x L x (4 width + 2 MLP width): its input and that
  input normalised, the queries, the attention's output (the output projection's input), and the MLP's hidden
  layer before and after its activation (each one's backward needs it); with activation checkpointing only the
  layer's input (the rest is recomputed); and the final normalised hidden state the output layer reads;
- on the explicit attention path (a normaliser other than softmax, top-k), the score matrix one layer keeps,
  B x H x L x L in float32, or one block of it where the blockwise path runs (`study.attention.blockwise`); the
  fused path (stock softmax) materialises none.
Everything else (other activations, the allocator's slack, the libraries) comes on top, so a run refused here
cannot fit, and one admitted may still not.

The limit is the smallest of what this process may use: MemAvailable (/proc/meminfo), the cgroup's memory limit
less its usage, the address-space limit (`ulimit -v`) less what is mapped now; on a CUDA device, its free memory.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

FLOAT32 = 4


@dataclass(frozen=True)
class StepShape:
    """What fixes a training step's memory, in numbers (`study.fit` reads them off the built data and config)."""

    parameters: int
    trainable: int
    optimizer_states: int  # tensors the optimiser keeps a trainable weight: AdamW 2, plain SGD 0
    batch: int
    length: int  # tokens a sequence (block_size)
    vocab: int
    layers: int
    width: int
    mlp_width: int
    weight_bytes: int  # bytes an element: 4 in float32 (and under mixed precision), 2 for bf16-true
    activation_bytes: int  # 2 under bf16/16 precision (mixed or true), 4 in float32
    checkpointing: bool = False
    scores: int = 0  # score elements an explicit attention layer keeps at once (0: the fused path)
    explicit_layers: int = 0  # layers whose attention runs the explicit path


def step_lower_bound(shape: StepShape) -> dict[str, int]:
    """The parts of the bound, in bytes (their sum is the bound)."""
    tokens = shape.batch * shape.length
    kept = shape.width if shape.checkpointing else 4 * shape.width + 2 * shape.mlp_width
    return {
        "weights": shape.parameters * shape.weight_bytes,
        "gradients": shape.trainable * shape.weight_bytes,
        "optimiser state": shape.trainable * shape.optimizer_states * FLOAT32,
        "logits": tokens * shape.vocab * (shape.activation_bytes + FLOAT32),
        "kept activations": (shape.layers * kept + shape.width) * tokens * shape.activation_bytes,
        "attention scores": shape.explicit_layers * shape.scores * FLOAT32,
    }


def _meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_left(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The cgroup's memory limit less its usage (cgroup v2, else v1); None when unlimited or unreadable."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):  # fmt: skip
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:  # v1 writes "unlimited" as a huge number
            return None
        return max(int(limit) - usage, 0)
    return None


def _address_space_left() -> int | None:
    """`ulimit -v` less the address space this process maps now; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        mapped = 0
    return max(soft - mapped, 0)


def host_limit() -> tuple[int, str] | None:
    """The smallest memory this process may still use on the host, in bytes, and what sets it; None if unknown."""
    found = [(value, name) for value, name in ((_meminfo_available(), "MemAvailable"),
                                               (_cgroup_left(), "the cgroup's memory limit less its usage"),
                                               (_address_space_left(), "ulimit -v less what is mapped"))
             if value is not None]  # fmt: skip
    return min(found) if found else None


def cuda_limit(device: int | None = None) -> tuple[int, str] | None:
    """A CUDA device's free memory, in bytes; None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free, "the CUDA device's free memory"


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def refusal(parts: dict[str, int], limit: tuple[int, str] | None) -> str | None:
    """One line when the bound exceeds the limit (the estimate, its largest parts and the limit), else None."""
    if limit is None or sum(parts.values()) <= limit[0]:
        return None
    largest = sorted(((v, k) for k, v in parts.items() if v), reverse=True)[:3]
    detail = ", ".join(f"{name} {gib(v)}" for v, name in largest)
    return (f"a training step needs at least {gib(sum(parts.values()))} ({detail}) and {limit[1]} is "
            f"{gib(limit[0])}: lower data.block_size or data.batch_size, or turn on model.gradient_checkpointing")


__all__ = ["StepShape", "cuda_limit", "host_limit", "refusal", "step_lower_bound"]
