"""Lightning callbacks that monitor attention and gradients, for any model that uses `study.attention`.

Public API:
    AttentionEntropyMonitor     row entropy and normalised entropy per layer, histogram over heads
    SelectionUniformityMonitor  KL/TV to uniform, max weight, effective support, top-k mass and uniformity
    GradientNormMonitor         gradient norms before/after clipping, per block, per kind, per block and kind
    AttentionJacobianMonitor    softmax Jacobian of sampled rows: spectral norm, largest entry x 4T, saturated rows
    AttentionLogitMonitor       the largest attention logit per layer (scaled by T and raw), mean and std of logits
    AttentionSinkMonitor        weight on the first visible key per layer, and the sink rate (heads above 0.3)
    EntropyCollapseAlert        warn (or stop) when a layer's normalised entropy collapses from its step-0 value
    BaselineValidation          a validation epoch at step 0: the model as loaded, under the new attention, before any step
    FixedBatchLoss              the loss on one held-out batch, the same at every logged step (spikes without noise)
    NgramBaseline               held-out unigram and bigram losses of the run's own tokens at step 0 (beat to use context)
    AttentionMapMonitor         heatmaps of a fixed validation sample's attention
    NonFiniteGuard              stop (or skip the step) when the loss or gradients go NaN/inf
    NormalizerParameterMonitor  learnable normaliser parameters (SSMax s, entmax alpha) per layer
    TensorBoardLayout           custom-scalars charts (all layers in one chart, Jacobian beside 1/(4T))
    TapMonitor                  the shared base class (tap on logging steps, sum, reduce across ranks, log)

Callbacks never import the model: they see attention through `study.attention.tapping`.

Under `transformers.Trainer`: `study.callbacks.hf_trainer.TrainerMonitors` runs the same monitor objects (not
imported here: it loads the Trainer, which needs the `hf-trainer` extra's accelerate).

Example::

    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    from study.callbacks import AttentionEntropyMonitor, GradientNormMonitor, TensorBoardLayout

    trainer = L.Trainer(
        logger=TensorBoardLogger("logs", name="run"),
        gradient_clip_val=1.0,
        callbacks=[AttentionEntropyMonitor(every_n_steps=50), GradientNormMonitor(every_n_steps=50), TensorBoardLayout()],
    )
"""

from study.callbacks.attention import AttentionEntropyMonitor, SelectionUniformityMonitor
from study.callbacks.base import TapMonitor, reduce_sums
from study.callbacks.baseline import BaselineValidation
from study.callbacks.collapse import EntropyCollapseAlert
from study.callbacks.fixed_batch import FixedBatchLoss
from study.callbacks.fp64_check import Fp64GradientCheck
from study.callbacks.gradients import GradientNormMonitor
from study.callbacks.jacobian import AttentionJacobianMonitor
from study.callbacks.layers import MID
from study.callbacks.layout import TensorBoardLayout, custom_scalars_layout
from study.callbacks.logits import AttentionLogitMonitor
from study.callbacks.maps import AttentionMapMonitor, draw_attention_map
from study.callbacks.ngram import NgramBaseline, ngram_losses
from study.callbacks.nonfinite import NonFiniteGuard
from study.callbacks.normalizer import NormalizerParameterMonitor, normalizer_parameters
from study.callbacks.sinks import SINK_THRESHOLD, AttentionSinkMonitor

__all__ = [
    "MID",
    "SINK_THRESHOLD",
    "AttentionEntropyMonitor",
    "AttentionJacobianMonitor",
    "AttentionLogitMonitor",
    "AttentionSinkMonitor",
    "AttentionMapMonitor",
    "BaselineValidation",
    "EntropyCollapseAlert",
    "Fp64GradientCheck",
    "FixedBatchLoss",
    "GradientNormMonitor",
    "NgramBaseline",
    "NonFiniteGuard",
    "NormalizerParameterMonitor",
    "SelectionUniformityMonitor",
    "TapMonitor",
    "TensorBoardLayout",
    "custom_scalars_layout",
    "draw_attention_map",
    "ngram_losses",
    "normalizer_parameters",
    "reduce_sums",
]
