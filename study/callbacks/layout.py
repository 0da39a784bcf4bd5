"""A TensorBoard custom-scalars layout for the monitors: one chart for all layers' curves of a statistic."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from study.callbacks.base import tensorboard_writers


def custom_scalars_layout() -> dict[str, dict[str, list]]:
    """The layout `SummaryWriter.add_custom_scalars` takes: {category: {chart: ["Multiline", [tag regex, ...]]}}.

    Tags are regular expressions, so the charts hold every layer whatever the model's depth.
    """
    per_layer = {
        "entropy per layer (nats)": r"^attention/entropy/layer_\d+$",
        "normalised entropy per layer (1 = uniform)": r"^attention/normalized_entropy/layer_\d+$",
        "KL to uniform per layer": r"^attention/kl_uniform/layer_\d+$",
        "effective support per layer": r"^attention/effective_support/layer_\d+$",
        "attention Jacobian per layer": r"^attention/jacobian/layer_\d+$",
    }
    layout: dict[str, dict[str, list]] = {
        "attention (train)": {chart: ["Multiline", [regex]] for chart, regex in per_layer.items()},
        "attention (validation)": {
            chart: ["Multiline", [regex.replace("^", "^val/", 1)]] for chart, regex in per_layer.items()
        },
        "gradients": {
            "gradient norm before / after clipping": [
                "Multiline",
                [r"^grad_norm/total$", r"^grad_norm/total_clipped$"],
            ],
            "attention Jacobian vs 1/(4T) and 1/(2T)": [
                "Multiline",
                [r"^attention/jacobian/(mean|max)$", r"^attention/jacobian/bound_(quarter|half)_T$"],
            ],
            "gradient norm per block": ["Multiline", [r"^grad_norm/block_(\d+|none)$"]],
            "gradient norm per kind": [
                "Multiline",
                [r"^grad_norm/(attn_q|attn_k|attn_v|attn_out|attn_qkv|mlp|embedding|norm|head|normalizer|other)$"],
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

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._written:
            return
        for writer in tensorboard_writers(trainer):
            writer.add_custom_scalars(self.layout)
        self._written = True
