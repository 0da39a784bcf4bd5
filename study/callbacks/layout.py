"""A TensorBoard custom-scalars layout for the monitors: run-level charts first (the log10 W_q/W_k gradient norm and
perplexity, H/log n with the band over layers, the largest logit, the loss: the first page's quantities), gradients,
and the per-layer and per-block charts last, closed. Every chart's x axis is the step (the curve over n is a report figure)."""

from __future__ import annotations

import re

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from study import tags
from study.callbacks.base import tensorboard_writers
from study.metrics import KINDS


def _exact(*tag_names: str) -> list[str]:
    return ["^" + re.escape(t) + "$" for t in tag_names]


def _band(statistic: str, phase_prefix: str = "") -> list:
    """A margin chart: the layer mean with the band from the smallest to the largest layer value (one line and one
    band per run, where a chart of every layer draws runs x layers lines)."""
    names = (tags.attention(statistic), tags.attention_spread(statistic, "min"), tags.attention_spread(statistic, "max"))
    return ["Margin", [phase_prefix + name for name in names]]


# Quantities that span decades across temperatures; the Custom Scalars charts have no log axis in their layout
# (the Layout proto holds titles, tags and `closed` only): each such chart's own y-log button makes it readable.
LOG_HINT = " (log axis: the chart's y-log button)"

PER_LAYER = {
    "entropy (nats)": "entropy",
    "normalised entropy (1 = uniform)": "normalized_entropy",
    "KL to uniform": "kl_uniform",
    "effective support (keys)": "effective_support",
    "saturated rows (max weight > 0.99)": "saturated",
    "largest attention logit q.k / (T sqrt d) (band: layer maxima)": "max_logit",
    "weight on the first visible key (sink)": "first_key_weight",
}

CLOSED = ("attention per layer (train; select a few runs)", "attention per layer (validation; select a few runs)",
          "gradient norm per block (select a few runs)")
"""Categories drawn closed: one line per layer and run (30 layers x 18 runs = 540 lines) are for a few runs."""


def custom_scalars_layout(clipping: bool = True) -> dict[str, dict[str, list]]:
    """The layout `SummaryWriter.add_custom_scalars` takes: {category: {chart: ["Multiline" | "Margin", [tag, ...]]}}.

    Tags are built from `study.tags`: exact names for the margin charts (layer mean, min and max), regular
    expressions for the per-layer charts, so those hold every layer whatever the model's depth. The run-level
    charts come first, in the order of the first page (`tags.FIRST_PAGE`); the per-layer ones last, closed
    (`CLOSED`). ``clipping``: the run clips its gradients, so the chart of the norm before and after clipping has
    something to draw (without clipping it holds one line of two equal ones, or none).
    """
    kinds = "|".join(KINDS)
    val = tags.VAL_PREFIX
    gradients: dict[str, list] = {}
    if clipping:
        gradients["gradient norm before / after clipping" + LOG_HINT] = [
            "Multiline", _exact(tags.GRAD_NORM, tags.GRAD_NORM_CLIPPED)]
    gradients.update({
        "attention Jacobian (spectral norm) vs 1/(4T) and 1/(2T)" + LOG_HINT: [
            "Multiline",
            _exact(*(tags.jacobian(s) for s in ("mean", "max", "bound_quarter_T", "bound_half_T"))),
        ],
        "attention Jacobian: largest entry x 4T, rows near 1/(4T), saturated rows": [
            "Multiline",
            _exact(*(tags.jacobian(s) for s in tags.JACOBIAN_STATISTICS)),
        ],
        "gradient norm per kind" + LOG_HINT: ["Multiline", ["^" + re.escape(tags.grad_norm("")) + f"({kinds})$"]],
    })  # fmt: skip
    layout: dict[str, dict[str, list]] = {
        "run summary": {
            "log10 gradient norm of W_q and W_k (whole network)": ["Multiline", _exact(tags.LOG10_GRAD_QK)],
            "log10 perplexity (train; validation as points)": [
                "Multiline", _exact(tags.LOG10[tags.TRAIN_PPL], tags.LOG10[tags.VAL_PPL])],
            "H / log n: layer mean, band over layers": _band("normalized_entropy"),
            "largest attention logit over layers: scaled by 1/T, and before T" + LOG_HINT: [
                "Multiline", _exact(tags.MAX_LOGIT, tags.MAX_LOGIT_RAW, val + tags.MAX_LOGIT, val + tags.MAX_LOGIT_RAW)],
            "loss (train; validation as points)": ["Multiline", _exact(tags.TRAIN_LOSS, tags.VAL_LOSS)],
            "entropy: layer mean, band = min..max over layers (nats)": _band("entropy"),
            "log10 gradient norm, total": ["Multiline", _exact(tags.LOG10[tags.GRAD_NORM])],
            "log10 gradient norm of W_q and W_k, each": [
                "Multiline", _exact(tags.LOG10[tags.GRAD_Q], tags.LOG10[tags.GRAD_K])],
            "sink rate (heads with mean first-key weight > 0.3)": [
                "Multiline", _exact(tags.SINK_RATE, val + tags.SINK_RATE)],
        },
        "attention (train): layer mean, band = min..max over layers": {
            chart: _band(statistic) for chart, statistic in PER_LAYER.items()
        },
        "attention (validation): layer mean, band = min..max over layers": {
            chart: _band(statistic, val) for chart, statistic in PER_LAYER.items()
        },
        "gradients": gradients,
        CLOSED[0]: {
            chart: ["Multiline", [tags.attention_layers_regex(s)]]
            for chart, s in {**PER_LAYER, "attention Jacobian": "jacobian"}.items()
        },
        CLOSED[1]: {
            chart: ["Multiline", [tags.attention_layers_regex(s, val)]]
            for chart, s in {**PER_LAYER, "attention Jacobian": "jacobian"}.items()
        },
        CLOSED[2]: {
            "gradient norm per block, all kinds" + LOG_HINT: [
                "Multiline", [tags.GRAD_BLOCK_REGEX]],
        },
    }
    return layout


def layout_summary(layout: dict[str, dict[str, list]], closed: tuple[str, ...] = CLOSED):
    """The custom-scalars summary of ``layout``, with the categories named in ``closed`` drawn closed (torch's
    `custom_scalars` builds the Layout proto but cannot set `closed`)."""
    from tensorboard.plugins.custom_scalar import layout_pb2
    from torch.utils.tensorboard.summary import custom_scalars

    summary = custom_scalars(layout)
    tensor = summary.value[0].tensor
    proto = layout_pb2.Layout.FromString(tensor.string_val[0])
    for category in proto.category:
        category.closed = category.title in closed
    tensor.string_val[0] = proto.SerializeToString()
    return summary


class TensorBoardLayout(Callback):
    """Write `custom_scalars_layout` (or a given layout) to every TensorBoardLogger once, from rank 0; without a
    given layout, the clipping chart only in a run that clips its gradients (`trainer.gradient_clip_val`).

    Example::

        trainer = L.Trainer(callbacks=[AttentionEntropyMonitor(), GradientNormMonitor(), TensorBoardLayout()])
    """

    def __init__(self, layout: dict[str, dict[str, list]] | None = None) -> None:
        self.layout = layout
        self._written = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._written:
            return
        clipping = bool(getattr(trainer, "gradient_clip_val", None))  # a transformers.Trainer's view has none
        layout = self.layout if self.layout is not None else custom_scalars_layout(clipping)
        summary = layout_summary(layout)
        for writer in tensorboard_writers(trainer):
            writer._get_file_writer().add_summary(summary)
        self._written = True
