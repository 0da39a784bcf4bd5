"""`NormalizerParameterMonitor`: the learnable parameters of attention normalisers, per layer."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from study import tags
from study.attention import Normalizer
from study.callbacks.base import due, last_step, tensorboard_writers, write_scalars


def normalizer_parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of every `Normalizer` inside ``module``, by ``{parameter}/layer_{l}``.

    The layer index is the owning attention module's ``layer_idx`` when it has one (transformers models), else
    the normaliser's position in module order.
    """
    found: dict[str, torch.Tensor] = {}
    position = 0
    for owner in module.modules():
        for child in owner.children():
            if not isinstance(child, Normalizer):
                continue
            layer = getattr(owner, "layer_idx", position)
            position += 1
            for name, param in child.named_parameters(recurse=False):
                found[f"{child.name}_{name}/layer_{layer}"] = param
    return found


class NormalizerParameterMonitor(Callback):
    """Log learnable normaliser parameters (SSMax's scale s, entmax's alpha) as they train.

    Per layer, the mean over heads as a scalar and the per-head values as a histogram (rank 0):
        ``normalizer/ssmax_s/layer_{l}``, ``normalizer/entmax_alpha/layer_{l}`` (and ``.../heads`` histograms).
    Parameters are identical on every rank under DDP, so rank 0 writes them. Nothing is logged for models
    without learnable normaliser parameters.

    Args:
        every_n_steps: log every this many optimizer steps.

    Example::

        trainer = L.Trainer(callbacks=[NormalizerParameterMonitor(every_n_steps=50)])
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an integer >= 1, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step - 1  # the optimizer step that just happened
        if not due(step, self.every_n_steps, last_step(trainer)) or not trainer.is_global_zero:
            return
        params = normalizer_parameters(pl_module)
        if not params:
            return
        means = torch.stack([p.detach().float().mean() for p in params.values()]).tolist()
        write_scalars(trainer, {tags.normalizer(tag): value for tag, value in zip(params, means)}, step)
        for writer in tensorboard_writers(trainer):
            for tag, param in params.items():
                writer.add_histogram(tags.normalizer(f"{tag.rsplit('/', 1)[0]}/heads/{tag.rsplit('/', 1)[1]}"),
                                     param.detach().float().cpu(), step)
