"""A TensorBoard custom-scalars layout for the monitors: one chart for all layers' curves of a statistic."""

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


def custom_scalars_layout() -> dict[str, dict[str, list]]:
    """The layout `SummaryWriter.add_custom_scalars` takes: {category: {chart: ["Multiline", [tag regex, ...]]}}.

    Tags are regular expressions built from `study.tags`, so the charts hold every layer whatever the model's depth.
    """
    per_layer = {
        "entropy per layer (nats)": "entropy",
        "normalised entropy per layer (1 = uniform)": "normalized_entropy",
        "KL to uniform per layer": "kl_uniform",
        "effective support per layer": "effective_support",
        "saturated rows per layer (max weight > 0.99)": "saturated",
        "attention Jacobian per layer": "jacobian",
    }
    kinds = "|".join(KINDS)
    layout: dict[str, dict[str, list]] = {
        "attention (train)": {c: ["Multiline", [tags.attention_layers_regex(s)]] for c, s in per_layer.items()},
        "attention (validation)": {
            c: ["Multiline", [tags.attention_layers_regex(s, tags.VAL_PREFIX)]] for c, s in per_layer.items()
        },
        "gradients": {
            "gradient norm before / after clipping": ["Multiline", _exact(tags.GRAD_NORM, tags.GRAD_NORM_CLIPPED)],
            "attention Jacobian (spectral norm) vs 1/(4T) and 1/(2T)": [
                "Multiline",
                _exact(*(tags.jacobian(s) for s in ("mean", "max", "bound_quarter_T", "bound_half_T"))),
            ],
            "attention Jacobian: largest entry x 4T, rows near 1/(4T), saturated rows": [
                "Multiline",
                _exact(*(tags.jacobian(s) for s in tags.JACOBIAN_STATISTICS)),
            ],
            "gradient norm per block": ["Multiline", ["^" + re.escape(tags.grad_norm("block_")) + r"(\d+|none)$"]],
            "gradient norm per kind": ["Multiline", ["^" + re.escape(tags.grad_norm("")) + f"({kinds})$"]],
        },
        "dilution (Lemma 1, validation)": {
            "max weight by visible keys n": [
                "Multiline",
                [tags.by_visible_regex("max_weight", tags.VAL_PREFIX)],
            ],
        },
    }
    return layout


class TensorBoardLayout(Callback):
    """Write `custom_scalars_layout` (or a given layout) to every TensorBoardLogger once, from rank 0.

    Example::

        trainer = L.Trainer(callbacks=[AttentionEntropyMonitor(), GradientNormMonitor(), TensorBoardLayout()])
    """

    def __init__(self, layout: dict[str, dict[str, list]] | None = None) -> None:
        self.layout = layout if layout is not None else custom_scalars_layout()
        self._written = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._written:
            return
        for writer in tensorboard_writers(trainer):
            writer.add_custom_scalars(self.layout)
        self._written = True
