"""`TapMonitor`: the glue every attention monitor shares (when to tap, what to accumulate, how to reduce and log).

A monitor is itself an attention tap (`study.attention.AttentionTap`). It opens the tap only on the steps it
logs, so on every other step attention keeps its fused fast path and nothing waits on the host:

- training: ``on_train_batch_start`` opens the tap when ``global_step % every_n_steps == 0`` (or it is the last step) and
  ``on_train_batch_end`` closes it; once the optimizer step has happened (so gradient accumulation windows
  are summed, not logged per micro-batch) the sums are reduced across processes and logged at that step;
- validation: the tap is open for every validation batch, the sums accumulate over the epoch and are logged
  at ``on_validation_epoch_end`` under the ``val/`` prefix. The sanity check is never measured.

Aggregation is by SUMS (per head: rows, entropy sum, ...), so adding batches, layers and processes is exact and
one division at the end gives the mean over all rows everywhere. Keys ending in ``_max`` are maxima instead of
sums (accumulated and reduced across ranks with a MAX: the largest attention logit of every rank's batches). Under DDP the sums are flattened into one tensor and reduced with ``trainer.strategy.reduce`` (one
all-reduce; one more if there are maxima), every rank computes the same values, and rank 0 alone writes them to
the loggers, so each tag appears once with the reduced value. Every rank must tap the same layers the same number
of times per logging window (true for data-parallel training; `DistributedSampler` pads validation to equal
lengths).
"""

from __future__ import annotations

import math
import threading
import weakref
from contextlib import ExitStack
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from study import tags
from study.attention import NORMALIZERS, AttentionSpec, tapping
from study.attention.rowstats import RowStatistics
from study.callbacks.layers import LayerChoice, check_layers, resolve_layers
from study.metrics import as_distribution, entropy_sums, visible_row_entropy

Sums = dict[int, dict[str, Tensor]]

TRAIN, VAL = "train", "val"
PREFIX = {TRAIN: "", VAL: tags.VAL_PREFIX}


def _is_max(key: str) -> bool:
    return key.endswith("_max")


def reduce_sums(trainer: L.Trainer, sums: Sums) -> Sums:
    """Add (or, for ``*_max`` keys, take the maximum of) every rank's sums; the same result on every rank.

    One flat float64 tensor per reduce op, so a logging step costs one or two collectives whatever the
    number of layers and statistics.
    """
    out: Sums = {layer: {} for layer in sums}
    for op, keep in (("sum", lambda k: not _is_max(k)), ("max", _is_max)):
        entries = [(layer, key, sums[layer][key]) for layer in sorted(sums) for key in sorted(sums[layer]) if keep(key)]
        if not entries:
            continue
        flat = torch.cat([value.reshape(-1).to(torch.float64) for _, _, value in entries])
        if trainer.world_size > 1:
            flat = trainer.strategy.reduce(flat, reduce_op=op)
        offset = 0
        for layer, key, value in entries:
            out[layer][key] = flat[offset : offset + value.numel()].reshape(value.shape)
            offset += value.numel()
    return out


def last_step(trainer: L.Trainer) -> int | None:
    """The run's last optimizer step (counted from 0), None when the run is bounded by epochs, not steps."""
    max_steps = trainer.max_steps
    return max_steps - 1 if isinstance(max_steps, int) and max_steps > 0 else None


def due(step: int, every_n_steps: int, last: int | None) -> bool:
    """Whether a monitor measures at ``step``: every ``every_n_steps`` from step 0, and at the run's last step
    ``last`` too, so that the end of a run is measured (steps 0, 5, 10 of a 14-step run left its last 3 unseen)."""
    return step % every_n_steps == 0 or (last is not None and step == last)


def write_scalars(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    """Write already-reduced scalars from rank 0 to every logger (the way `LearningRateMonitor` does).

    Written directly rather than through ``self.log``: Lightning would only forward step metrics every
    ``log_every_n_steps``, silently dropping a monitor's steps that fall between. The tags of `tags.LEADING` are
    also written under their leading name.
    """
    if not metrics or not trainer.is_global_zero:
        return
    metrics = {**metrics, **tags.leading_copies(metrics)}  # the few that lead TensorBoard's pages, copied there
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger) and getattr(logger, "_prefix", None) == "":
            write_summary(logger.experiment, metrics, step)
        else:  # any other logger (or a prefixed one): its own log_metrics, one call per step
            logger.log_metrics(metrics, step=step)


def write_summary(writer: Any, metrics: dict[str, float], step: int) -> None:
    """Every scalar of a logging step as one TensorBoard event (a Summary with one value per tag) on a
    `SummaryWriter`: the same records `add_scalar` writes one event at a time (a float32 ``simple_value`` per tag,
    read back by TensorBoard and `EventAccumulator` as separate scalars at that step).

    One event instead of one per tag: each `add_scalar` is a record through the writer's queue of ten, so a monitor
    logging a few hundred tags a step waits on the writer thread, most of all on a busy machine
    (docs/performance.md).
    """
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in metrics.items()])
    writer._get_file_writer().add_summary(summary, step)  # what add_scalar itself calls, once per tag


def tensorboard_writers(trainer: L.Trainer) -> list[Any]:
    """The `SummaryWriter` of each logger that has one (TensorBoardLogger), on rank 0 only."""
    if not trainer.is_global_zero:
        return []
    writers = []
    for logger in trainer.loggers:
        experiment = getattr(logger, "experiment", None)
        if experiment is not None and hasattr(experiment, "add_histogram"):
            writers.append(experiment)
    return writers


class TapCallback(Callback):
    """A callback that is an attention tap while its window is open (`study.attention.tapping`), and that closes
    the window whatever ends the fit (an exception, teardown). Subclasses open it on the steps they measure."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None

    def _open_tap(self) -> None:
        self._close()
        self._stack = ExitStack()
        self._stack.enter_context(tapping(self))

    def _close(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack = None

    @property
    def is_tapping(self) -> bool:
        return self._stack is not None

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._close()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._close()


class TapMonitor(TapCallback):
    """Base class of the attention monitors: tap on logging steps and during validation, sum, reduce, log.

    Subclasses implement `summarize` (one attention call -> per-layer sums) and `compute` (reduced sums ->
    scalars by tag), and may override `write_rank_zero` (histograms, images) and `wants_tap`.

    Args:
        every_n_steps: tap and log every this many optimizer steps (step 0 included).
        validation: also measure validation and log ``val/...`` at the end of each validation epoch.
        layers: the layers to measure and log (`study.callbacks.layers`): indices (negative from the end) and
            "mid" (n // 2), e.g. ``[0, 1, "mid", -2, -1]``; None (default) every layer. Layer means, spreads and
            histograms are then over the chosen layers. Until the first tapped forward pass has shown the number
            of layers, every layer is measured and the others are dropped before logging.

    ``summarize`` sums over rows, so a monitor takes its weights in blocks of query rows (``row_blocks``): at long
    contexts `attend`'s blockwise path hands it each block as it is computed and no full attention map exists.
    A subclass whose statistics need a whole call at once sets ``row_blocks = False``.

    A monitor only reads what it is handed (``fused_output``): on a spec the fused kernel computes, a logged step
    keeps that kernel's output and backward, and the weights are computed beside it for the monitors alone.

    A subclass whose statistics follow from softmax row statistics (`study.attention.rowstats`) names them in
    ``row_statistics`` and implements `summarize_row_statistics`: while every open tap does, a fused-path call hands
    the monitors those statistics instead of weights, and no attention map is formed (`study.attention.tap`).
    """

    row_blocks = True
    fused_output = True
    row_statistics: frozenset[str] | None = None

    def __init__(self, every_n_steps: int = 50, validation: bool = True, layers: LayerChoice = None) -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an integer >= 1, got {every_n_steps!r}")
        super().__init__()
        self.every_n_steps = every_n_steps
        self.validation = validation
        self.layers = check_layers(layers)
        self._selected: frozenset[int] | None = None  # `layers` resolved, once the number of layers is known
        self._largest_layer_seen = -1
        self._sums: dict[str, Sums] = {TRAIN: {}, VAL: {}}
        self._phase: str | None = None
        self._window_step: int | None = None
        # Counters kept across checkpoints (see `state_dict`).
        self.train_logs = 0
        self.val_logs = 0
        self.last_logged_step = -1

    # ----- the tap -----------------------------------------------------------------------------------------

    def selects(self, layer: int) -> bool:
        """Whether ``layer`` is measured: in ``layers``, or not yet known not to be (see `layers`)."""
        self._largest_layer_seen = max(self._largest_layer_seen, layer)
        return self.layers is None or self._selected is None or layer in self._selected

    def resolve_layer_choice(self) -> None:
        """Fix ``layers`` against the number of layers the taps have shown (called after each tapped batch)."""
        if self.layers is not None and self._selected is None and self._largest_layer_seen >= 0:
            self._selected = resolve_layers(self.layers, self._largest_layer_seen + 1)

    def observe(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> None:
        if self._phase is None or not self.selects(layer):  # phase None: someone else's `tapping(monitor)`
            return
        summary = self.summarize(layer, weights, allowed, spec)
        if summary:  # empty: nothing for this monitor in this layer (e.g. a Jacobian of a non-softmax normaliser)
            self.accumulate(self._phase, layer, summary)

    def observe_rows(self, layer: int, rows: RowStatistics, spec: AttentionSpec) -> None:
        if self._phase is None or not self.selects(layer):
            return
        summary = self.summarize_row_statistics(layer, rows, spec)
        if summary:
            self.accumulate(self._phase, layer, summary)

    def accumulate(self, phase: str, layer: int, summary: dict[str, Tensor]) -> None:
        """Add a layer's sums (max for ``*_max`` keys) to what the phase has gathered so far."""
        acc = self._sums[phase].setdefault(layer, {})
        for key, value in summary.items():
            if key not in acc:
                acc[key] = value
            elif _is_max(key):
                acc[key] = torch.maximum(acc[key], value)
            else:
                acc[key] = acc[key] + value

    def summarize(self, layer: int, weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
        """Sums (or ``*_max`` maxima) of one attention call, as tensors on the weights' device (no host sync)."""
        raise NotImplementedError

    def summarize_row_statistics(self, layer: int, rows: RowStatistics, spec: AttentionSpec) -> dict[str, Tensor]:
        """The sums `summarize` gives, from one call's softmax row statistics (those ``row_statistics`` names)."""
        raise NotImplementedError

    def compute(self, sums: Sums, phase: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Tensor]:
        """Scalars by tag (without the phase prefix) from sums already reduced across processes.

        Runs on every rank (it may itself reduce more tensors, e.g. gradient norms).
        """
        raise NotImplementedError

    def write_rank_zero(self, trainer: L.Trainer, sums: Sums, prefix: str, step: int) -> None:
        """Rank-0-only extras (histograms, images) from the reduced sums. Default: none."""

    def wants_tap(self, trainer: L.Trainer, phase: str, batch_idx: int, dataloader_idx: int = 0) -> bool:
        if phase == TRAIN:
            return due(trainer.global_step, self.every_n_steps, last_step(trainer))
        return self.validation and not trainer.sanity_checking

    # ----- opening and closing -----------------------------------------------------------------------------

    def _open(self, phase: str) -> None:
        self._open_tap()
        self._phase = phase

    @override
    def _close(self) -> None:
        super()._close()
        self._phase = None

    # ----- logging -----------------------------------------------------------------------------------------

    def before_reduce(self, phase: str) -> None:
        """Hook: turn work deferred during the forward passes into sums (default: nothing deferred)."""

    def _log_phase(self, trainer: L.Trainer, pl_module: L.LightningModule, phase: str, step: int) -> None:
        self.before_reduce(phase)
        self.resolve_layer_choice()
        sums = reduce_sums(trainer, {layer: s for layer, s in self._sums[phase].items() if self.selects(layer)})
        self._sums[phase] = {}
        prefix = PREFIX[phase]
        values = self.compute(sums, phase, trainer, pl_module)
        if not values:
            return
        # The one host sync of a logging step: every value comes over together.
        device = next((v.device for v in values.values() if isinstance(v, Tensor)), torch.device("cpu"))
        flat = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in values.values()])
        metrics = {prefix + tag: value for tag, value in zip(values, flat.tolist())}
        write_scalars(trainer, metrics, step)
        if trainer.is_global_zero:
            self.write_rank_zero(trainer, sums, prefix, step)
        if phase == TRAIN:
            self.train_logs += 1
        else:
            self.val_logs += 1
        self.last_logged_step = step

    # ----- Lightning hooks ---------------------------------------------------------------------------------

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.wants_tap(trainer, TRAIN, batch_idx):
            self._window_step = trainer.global_step
            self._open(TRAIN)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._phase == TRAIN:
            self._close()
            self.resolve_layer_choice()
        # Log once the optimizer has stepped, so an accumulation window's micro-batches are summed together.
        if self._window_step is not None and trainer.global_step > self._window_step:
            self._log_phase(trainer, pl_module, TRAIN, step=self._window_step)
            self._window_step = None

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sums[VAL] = {}

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.wants_tap(trainer, VAL, batch_idx, dataloader_idx):
            self._open(VAL)

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
        if self._phase == VAL:
            self._close()
            self.resolve_layer_choice()

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.validation and not trainer.sanity_checking:
            self._log_phase(trainer, pl_module, VAL, step=trainer.global_step)
        self._sums[VAL] = {}

    # ----- checkpointing -----------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"train_logs": self.train_logs, "val_logs": self.val_logs, "last_logged_step": self.last_logged_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_logs = state_dict.get("train_logs", 0)
        self.val_logs = state_dict.get("val_logs", 0)
        self.last_logged_step = state_dict.get("last_logged_step", -1)


def row_distribution(weights: Tensor, spec: AttentionSpec) -> Tensor:
    """The weights as a distribution over keys: unchanged for normalisers whose rows sum to 1, otherwise
    |w| / sum |w| (Self-Adjust Softmax), so that entropy and distances to uniform stay defined."""
    return weights if NORMALIZERS[spec.normalizer].sums_to_one else as_distribution(weights)


class _LastCall(threading.local):
    """What has been computed of the last tapped call (one per thread: the bench fits in threads): its rows'
    entropy (B, H, Lq) and its entropy sums, each None until a monitor asks."""

    key: tuple[weakref.ref, weakref.ref, AttentionSpec] | None = None
    entropy: Tensor | None = None
    sums: dict[str, Tensor] | None = None


_last_call = _LastCall()


def _this_call(weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> _LastCall:
    """The memo of the call these tensors belong to (emptied when they are another call's).

    `study.attention.tap.notify` hands every tap the same tensors for a call, so a call is recognised by the
    identity of its tensors, held weakly: a weights tensor freed and another allocated at its address is a new
    call, never a stale hit, and the memo keeps no activation alive (it holds per-row values and sums only).
    """
    key = _last_call.key
    if key is None or key[0]() is not weights or key[1]() is not allowed or key[2] != spec:
        _last_call.key = (weakref.ref(weights), weakref.ref(allowed), spec)
        _last_call.entropy = _last_call.sums = None
    return _last_call


def call_row_entropy(weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> Tensor:
    """The entropy of each row of one tapped call's row distribution (`visible_row_entropy`), computed once
    however many monitors ask: the entropy monitor and the collapse alert compute or read it, the selection monitor
    reads it when one of them came first (`known_row_entropy`)."""
    memo = _this_call(weights, allowed, spec)
    if memo.entropy is None:
        memo.entropy = visible_row_entropy(row_distribution(weights, spec), allowed)
    return memo.entropy


def known_row_entropy(weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> Tensor | None:
    """This call's `call_row_entropy` if a monitor has already computed it, else None (nothing computed here): for
    a statistic that computes the entropy anyway from its own copy of the weights (the selection monitor), so that
    alone or first it pays no extra pass."""
    return _this_call(weights, allowed, spec).entropy


def call_entropy_sums(weights: Tensor, allowed: Tensor, spec: AttentionSpec) -> dict[str, Tensor]:
    """`entropy_sums` of one tapped call's row distribution, computed once however many monitors ask for it
    (the entropy monitor and the collapse alert), from the call's `call_row_entropy`."""
    memo = _this_call(weights, allowed, spec)
    if memo.sums is None:
        memo.sums = entropy_sums(weights, allowed, entropy=call_row_entropy(weights, allowed, spec))
    return dict(memo.sums)


def nanmean(values: Tensor) -> Tensor:
    """Mean over the finite-or-not entries that are not NaN (a head with no counted row is NaN = no data)."""
    return values.to(torch.float64).nanmean()


def layer_spread(statistic: str, layer_values: Tensor) -> dict[str, Tensor]:
    """``attention/{statistic}/layer_min`` and ``.../layer_max``: the extreme layer values, the band around the layer
    mean in the custom-scalars charts (NaN = a layer with no counted row is left out, without a host sync; NaN if
    every layer is)."""
    out = {}
    for end, fill in (("min", math.inf), ("max", -math.inf)):
        value = getattr(layer_values.nan_to_num(nan=fill, posinf=math.inf, neginf=-math.inf), end)()
        out[tags.attention_spread(statistic, end)] = torch.where(value.isinf(), math.nan, value)
    return out
