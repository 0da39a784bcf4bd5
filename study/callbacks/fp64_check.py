"""`Fp64GradientCheck`: the step-0 gradient of the first training batch computed again in float64: the per-layer
float64 norms (a reference no CPU's rounding tips) and how far float32 is from them."""

from __future__ import annotations

import copy
import math
import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from study import tags
from study.attention.tap import suspended
from study.metrics.gradients import grouped_grad_norms


def _grad_norms(model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, float]:
    """The gradient norms per kind and per block and kind (`grouped_grad_norms`) of ``model`` in ``dtype`` (dropout
    off), for the language-model loss of ``batch``.

    The model itself is converted to ``dtype`` and back, not copied: a float32 -> float64 -> float32 round trip is
    exact, and a copy in float64 would hold the model three times over at once (a resident-memory budget counts
    that). Its gradients, training mode and weights are as they were afterwards; a model that is not all float32
    (its round trip would not be exact) or that trains under DDP is copied instead."""
    floating = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    # Under DDP the parameters carry the reducer's gradient hooks: a backward through them on one rank would start
    # an all-reduce the other ranks never join, so there the check runs on a copy.
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    in_place = all(t.dtype == torch.float32 for t in floating) and not distributed
    target = model if in_place else copy.deepcopy(model)
    saved_grads = [p.grad for p in target.parameters()]
    was_training = target.training
    try:
        for p in target.parameters():
            p.grad = None
        target.to(dtype).eval()
        ids = batch["input_ids"]
        with suspended():  # the monitors' taps are open on this step: these passes are not the training step's
            target(input_ids=ids, attention_mask=batch.get("attention_mask"), labels=ids).loss.backward()
        norms = {key: float(value) for key, value in
                 grouped_grad_norms(target.named_parameters(), by=("kind", "block_kind")).items()}
    finally:
        target.to(torch.float32).train(was_training)
        for p, grad in zip(target.parameters(), saved_grads):
            p.grad = grad
    return norms


def _blocks(norms: dict[str, float]) -> list[int]:
    return sorted({int(key.split("/")[0][len("block_"):]) for key in norms
                   if key.startswith("block_") and key.split("/")[0][len("block_"):].isdigit()})


def _group_norm(norms: dict[str, float], kinds: tuple[str, ...], prefix: str = "") -> float | None:
    """sqrt of the sum of squares of the kinds' norms (None if the model logged none of them)."""
    parts = [norms[f"{prefix}{kind}"] for kind in kinds if f"{prefix}{kind}" in norms]
    return math.sqrt(sum(part**2 for part in parts)) if parts else None


def _qk_norms(model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[float, float]:
    """(every layer, last layer) sqrt(|g_Wq|^2 + |g_Wk|^2) of ``model`` in ``dtype`` (`_grad_norms`)."""
    norms = _grad_norms(model, batch, dtype)
    blocks = _blocks(norms)
    qk = tags.LAYER_GROUPS["W_q,W_k"]
    last = _group_norm(norms, qk, f"block_{blocks[-1]}/") if blocks else None
    return _group_norm(norms, qk) or 0.0, last if last is not None else float("nan")


def _ratio(fp32: float | None, fp64: float | None) -> float:
    return fp32 / fp64 if fp32 is not None and fp64 is not None and fp64 > 0 else float("nan")


def fp64_norms(fp64: dict[str, float]) -> dict[str, float]:
    """The logged float64 norms: every block's gradient norm per parameter kind (``fp64_check/grad_norm/block_{i}/
    {kind}``), from which the report builds any layer's or the whole network's group norm."""
    return {tags.fp64_grad_norm(key): value for key, value in fp64.items()
            if key.startswith(tags.GRAD_GROUP_BLOCK_PREFIX) and "/" in key}


def ratios(fp32: dict[str, float], fp64: dict[str, float]) -> dict[str, float]:
    """The logged fp32 / fp64 ratios from the two passes' norms: W_q/W_k over every layer, in the last layer, and the
    per-layer ratio furthest from 1 (in log; a non-finite one first) over every layer and group of `tags.LAYER_GROUPS`
    that has a gradient: a per-layer slope fits the level only if every layer's gradient there is what it claims."""
    blocks = _blocks(fp64)
    qk = tags.LAYER_GROUPS["W_q,W_k"]
    per_layer = [_ratio(_group_norm(fp32, kinds, f"block_{b}/"), _group_norm(fp64, kinds, f"block_{b}/"))
                 for b in blocks for kinds in tags.LAYER_GROUPS.values()
                 if _group_norm(fp64, kinds, f"block_{b}/") is not None]

    def distance(r: float) -> float:
        return abs(math.log(r)) if math.isfinite(r) and r > 0 else math.inf

    last = f"block_{blocks[-1]}/" if blocks else "none/"
    return {
        tags.FP64_RATIO_QK: _ratio(_group_norm(fp32, qk), _group_norm(fp64, qk)),
        tags.FP64_RATIO_LAST_QK: _ratio(_group_norm(fp32, qk, last), _group_norm(fp64, qk, last)),
        tags.FP64_RATIO_LAYERS_WORST: max(per_layer, key=distance) if per_layer else float("nan"),
    }


class Fp64GradientCheck(Callback):
    """At the first training batch, the gradient of a float32 and a float64 pass of the model on that batch, logged
    at step 0: the float64 norm of every block's gradient per parameter kind (``fp64_check/grad_norm/block_{i}/
    {kind}``), and float32 over float64 (``fp64_check/attn_qk``: W_q/W_k over every layer; ``fp64_check/last_block/
    attn_qk``: the last layer's; ``fp64_check/layers/worst``: the ratio furthest from 1 over every layer's W_q/W_k,
    W_v, W_o and MLP gradients). At low temperature a float32 gradient can be rounding more than model (its error
    grows with the attention logits' conditioning, and differs between CPUs' matmul kernels); the float64 norms are
    the same on every machine to many digits, so `study report` fits its step-0 gradient slopes on them.

    Only parameters that train get a gradient (a frozen MLP has none). The step-0 gradient depends on the setting
    and the batch (the seed's first batch), not the optimizer; with ``seed`` it runs only in the run whose global
    seed is that one. Both passes run in eval mode (no dropout), so they compute the same function, with the
    monitors' taps suspended. It costs two extra forward/backward passes once per run and, while the float64 pass
    runs, the model's weights in float64 in place of float32 (converted back exactly).

    Args:
        seed: check only when the run's global seed is this (None: in every run).
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be None or an integer, got {seed!r}")
        self.seed = seed

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != 0 or batch_idx != 0 or not trainer.is_global_zero:
            return
        if self.seed is not None and os.environ.get("PL_GLOBAL_SEED") != str(self.seed):
            return
        model = getattr(pl_module, "model", pl_module)
        with torch.enable_grad():
            fp32, fp64 = _grad_norms(model, batch, torch.float32), _grad_norms(model, batch, torch.float64)
        metrics = {**ratios(fp32, fp64), **fp64_norms(fp64)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=0)


__all__ = ["Fp64GradientCheck"]
