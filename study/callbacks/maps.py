"""`AttentionMapMonitor`: heatmaps of one fixed validation sample's attention, as TensorBoard images.

Unlike the other attention monitors it keeps no sums: on rank 0 it taps the first validation batch, copies the
chosen (layer, head) maps to the host, and at the end of that validation epoch draws each one with matplotlib
(perceptual colour map, colour bar, query and key positions on the axes). Nothing runs on other steps or ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import move_data_to_device, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from study import tags
from study.attention import AttentionSpec
from study.callbacks.base import TapCallback, tensorboard_writers


def draw_attention_map(weights: Tensor, title: str = "", log_scale: bool = False, floor: float = 1e-4):
    """A matplotlib figure of one (Lq, Lk) attention map: rows are queries, columns keys, colour the weight.

    Args:
        weights: (Lq, Lk) attention weights (zero on keys a query does not see).
        title: drawn above the map.
        log_scale: colour by log10(weight) clipped at ``floor``: at low temperature almost every weight is tiny
            and a linear scale shows a few bright dots; the log scale shows how small the rest are.
        floor: smallest weight told apart on the log scale (also the colour of exact zeros).

    The colour map is viridis (perceptually uniform, readable in grey); the colour bar gives the weight scale.
    """
    # A Figure of its own, not pyplot's: no global backend switch (a notebook keeps its own) and nothing to close.
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    if weights.dim() != 2:
        raise ValueError(f"an attention map is (queries, keys); got shape {tuple(weights.shape)}")
    data = weights.detach().float().cpu().numpy()
    q_len, k_len = data.shape
    size = 3.2 + 2.0 * min(max(q_len, k_len), 128) / 128
    fig = Figure(figsize=(size + 0.9, size), dpi=90)
    ax = fig.subplots()
    if log_scale:
        image = ax.imshow(data.clip(min=floor), cmap="viridis", norm=LogNorm(vmin=floor, vmax=1.0))
    else:
        image = ax.imshow(data, cmap="viridis", vmin=0.0, vmax=max(float(data.max()), 1e-12))
    image.set_interpolation("nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="weight (log scale)" if log_scale else "weight")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    if title:
        ax.set_title(title, fontsize=11)  # TensorBoard shows the image at its size: 11 pt is readable, 9 was not
    fig.tight_layout()
    return fig


def draw_attention_maps(
    panels: Sequence[tuple[Tensor, str]], title: str = "", log_scale: bool = False, floor: float = 1e-4
):
    """One figure with several (Lq, Lk) attention maps side by side (e.g. before and after training), each with
    its own caption and all on ONE colour scale (one colour bar), so that the same colour is the same weight."""
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure

    if not panels:
        raise ValueError("draw_attention_maps needs at least one map")
    data = []
    for weights, _ in panels:
        if weights.dim() != 2:
            raise ValueError(f"an attention map is (queries, keys); got shape {tuple(weights.shape)}")
        data.append(weights.detach().float().cpu().numpy())
    vmax = max(max(float(d.max()) for d in data), 1e-12)
    norm = LogNorm(vmin=floor, vmax=1.0) if log_scale else Normalize(vmin=0.0, vmax=vmax)
    size = 3.2 + 2.0 * min(max(data[0].shape), 128) / 128
    fig = Figure(figsize=(size * len(panels) + 0.9, size + 0.5), dpi=90, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, values, (_, caption) in zip(axes, data, panels):
        image = ax.imshow(values.clip(min=floor) if log_scale else values, cmap="viridis", norm=norm)
        image.set_interpolation("nearest")
        ax.set_title(caption, fontsize=11)
        ax.set_xlabel("key position")
    axes[0].set_ylabel("query position")
    fig.colorbar(image, ax=list(axes), fraction=0.046, pad=0.04, label="weight (log scale)" if log_scale else "weight")
    if title:
        fig.suptitle(title, fontsize=13)
    return fig


class AttentionMapMonitor(TapCallback):
    """Heatmaps of one fixed validation sample's attention, for chosen layers and heads (rank 0 only).

    The sample is ``sample_index`` of the first validation batch of the first validation dataloader, which is
    the same sample every time as long as validation is not shuffled. Images are written before the first
    training step (step 0: the model under its attention spec before any update; one forward pass of that batch
    in eval mode, ``module(batch["input_ids"])``), at the end of a validation epoch when at least
    ``every_n_steps`` optimizer steps have passed since the last ones, and at the last validation (``max_steps``
    reached), so a run always has its maps before and after training. Only rank 0 taps, and only that one batch;
    everything else keeps the fast path.

    Tags: ``attention_map/layer_{l}/head_{h}`` (TensorBoard images: viridis colour map with a colour bar, query
    positions down, key positions across, title with the layer, head, temperature and step), and
    ``attention_map_before_after/layer_{l}/head_{h}``: the first map drawn beside the current one, on one colour
    scale (from the second set of images on; not after a resume).

    Args:
        every_n_steps: minimum optimizer steps between two sets of images.
        layers: layer indices to draw; None draws every layer.
        heads: head indices to draw; None draws every head.
        sample_index: which sample of the first validation batch.
        max_tokens: draw only the first this many queries and keys (large maps are unreadable anyway).
        log_scale: colour by log10 of the weight (see `draw_attention_map`); linear when False.

    Example::

        trainer = L.Trainer(callbacks=[AttentionMapMonitor(every_n_steps=500, layers=[0, 11], heads=[0, 1])])
    """

    fused_output = True  # it only copies the weights it is handed (`study.attention.tap`)

    def __init__(
        self,
        every_n_steps: int = 500,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        sample_index: int = 0,
        max_tokens: int = 128,
        log_scale: bool = False,
    ) -> None:
        for name, value in (("every_n_steps", every_n_steps), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(sample_index, bool) or not isinstance(sample_index, int) or sample_index < 0:
            raise ValueError(f"sample_index must be an integer >= 0, got {sample_index!r}")
        super().__init__()
        self.every_n_steps = every_n_steps
        self.layers = None if layers is None else tuple(layers)
        self.heads = None if heads is None else tuple(heads)
        self.sample_index = sample_index
        self.max_tokens = max_tokens
        self.log_scale = log_scale
        self.val_logs = 0
        self.last_logged_step = -1
        self._maps: dict[int, dict[int, tuple[Tensor, float]]] = {}
        # The first maps drawn (step 0, before any update), kept to draw beside each later set; not checkpointed,
        # so a resumed run draws no before/after images.
        self._first: dict[tuple[int, int], tuple[Tensor, int]] = {}

    # ----- the tap -----------------------------------------------------------------------------------------

    def observe(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> None:
        if self.layers is not None and layer not in self.layers:
            return
        if self.sample_index >= weights.shape[0]:
            raise ValueError(
                f"sample_index={self.sample_index} but the first validation batch has {weights.shape[0]} samples"
            )
        w = weights[self.sample_index, :, : self.max_tokens, : self.max_tokens]  # (H, Lq, Lk)
        if self.heads and max(self.heads) >= w.shape[0]:
            raise ValueError(f"heads={list(self.heads)} but layer {layer} has {w.shape[0]} heads")
        heads = range(w.shape[0]) if self.heads is None else self.heads
        # A few small maps, once per `every_n_steps`: copying them to the host here is cheap enough.
        self._maps[layer] = {h: (w[h].float().cpu(), spec.temperature) for h in heads}

    def _due(self, trainer: L.Trainer) -> bool:
        if trainer.global_step == self.last_logged_step:
            return False
        last = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
        return last or self.last_logged_step < 0 or trainer.global_step - self.last_logged_step >= self.every_n_steps

    # ----- Lightning hooks ---------------------------------------------------------------------------------

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The maps before any update: the first validation batch through the model, once (not on a resume).
        if self.last_logged_step >= 0:
            return
        # What the first validation would do (idempotent): the loaders it will use. On EVERY rank: it holds a
        # barrier and an all-reduce, which one rank alone would wait on forever.
        trainer.fit_loop.epoch_loop.val_loop.setup_data()
        if not trainer.is_global_zero:
            return
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        batch = next(iter(loader), None) if loader is not None else None
        if batch is None:
            return
        batch = move_data_to_device(batch, pl_module.device)
        was_training = pl_module.training
        pl_module.eval()
        self._open_tap()
        inputs = batch["input_ids"] if isinstance(batch, dict) and "input_ids" in batch else batch
        try:
            with torch.no_grad():
                pl_module(inputs)
        except NotImplementedError:  # a module without `forward`: its maps start at the first validation
            self._maps = {}
            rank_zero_warn("AttentionMapMonitor: no maps at step 0; the module has no forward(input_ids)")
            return
        finally:
            self._close()
            pl_module.train(was_training)
        self._draw(trainer)

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if batch_idx == 0 and dataloader_idx == 0 and trainer.is_global_zero and not trainer.sanity_checking:
            if self._due(trainer):
                self._open_tap()

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: STEP_OUTPUT,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._close()

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            self._maps = {}
            return
        self._draw(trainer)

    def _draw(self, trainer: L.Trainer) -> None:
        maps, self._maps = self._maps, {}
        if not maps:
            return
        missing = sorted(set(self.layers or ()) - set(maps))
        if missing:  # asked for, never seen: the model has no such attention layer
            raise ValueError(f"layers={list(self.layers)}: no attention layer {missing} reached the monitor "
                             "(attention layers are numbered from 0 in module order)")
        step = trainer.global_step
        writers = tensorboard_writers(trainer)
        for layer, per_head in sorted(maps.items()):
            for head, (weights, temperature) in per_head.items():
                title = f"layer {layer}, head {head}, T = {temperature:g}, step {step}"
                fig = draw_attention_map(weights, title=title, log_scale=self.log_scale)  # drawn once for all writers
                for writer in writers:
                    writer.add_figure(tags.attention_map(layer, head), fig, step, close=False)
                before = self._first.setdefault((layer, head), (weights, step))
                if before[1] != step:
                    pair = draw_attention_maps(
                        [(before[0], f"step {before[1]}"), (weights, f"step {step}")],
                        title=f"layer {layer}, head {head}, T = {temperature:g}: before and after training",
                        log_scale=self.log_scale,
                    )
                    for writer in writers:
                        writer.add_figure(tags.attention_map_before_after(layer, head), pair, step, close=False)
        self.val_logs += 1
        self.last_logged_step = step

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"val_logs": self.val_logs, "last_logged_step": self.last_logged_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.val_logs = state_dict.get("val_logs", 0)
        self.last_logged_step = state_dict.get("last_logged_step", -1)


__all__ = ["AttentionMapMonitor", "draw_attention_map", "draw_attention_maps"]
