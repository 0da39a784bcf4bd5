"""`TrainerMonitors`: the same monitor objects under Hugging Face's `transformers.Trainer`.

The monitors are Lightning callbacks; this adapter is one `transformers.TrainerCallback` that drives their
Lightning hooks from the Trainer's events, handing them a view of the Trainer with the few Lightning attributes
they read (`TrainerView`: global step, ranks, loggers, the reduce of a strategy). No monitor is changed, so any
monitor built on `TapMonitor` or on the Lightning hooks below works through it, with the same tags and steps as
under Lightning.

How the Trainer's events become Lightning hooks:

- training: ``on_step_begin`` (first micro-batch of an optimizer step) is ``on_train_batch_start``; each
  ``on_substep_end`` (a micro-batch of a gradient-accumulation window) ends one batch and starts the next; the
  ``on_step_end`` after the optimizer step is ``on_train_batch_end``, with the step already counted, so a
  monitor logs once an accumulation window has been summed, at the step its window opened (as under Lightning:
  step 0 is the model before any update);
- gradients before clipping: in this transformers version the Trainer clips *before* ``on_pre_optimizer_step``,
  so a callback there sees clipped gradients. When a monitor reads gradients (implements
  ``on_before_optimizer_step``) and ``max_grad_norm > 0``, the adapter takes the clipping over for the fit: it sets
  ``args.max_grad_norm`` to 0 at ``on_train_begin`` (the Trainer then measures the same pre-clip norm for its own
  ``grad_norm`` log, without clipping), calls the monitors' ``on_before_optimizer_step`` in
  ``on_pre_optimizer_step`` and then clips at the user's norm (``torch.nn.utils.clip_grad_norm_``, what accelerate
  does on unsharded gradients), before ``optimizer.step()``; ``on_train_end`` restores the argument. DeepSpeed,
  FSDP and XLA, which clip in their own ways, are refused in that case;
- validation: the Trainer has no event before evaluation (nor before each prediction step), so `attach` wraps
  the Trainer's ``evaluate`` (which its training loop calls too) and adds a forward pre-hook to the model: inside
  ``evaluate``, the first forward starts a validation epoch (``on_validation_epoch_start``) and each forward a
  validation batch; ``on_prediction_step`` ends the batch and ``on_evaluate`` ends the epoch (``val/`` tags at
  the Trainer's global step). Forwards outside ``evaluate`` (``predict()``, your own calls) are not tapped;
- ``on_train_begin`` is ``setup``, ``on_fit_start`` and ``on_train_start``; ``on_train_end`` is ``on_train_end``,
  ``on_fit_end`` and ``teardown``; an exception out of ``train`` or ``evaluate`` (which the Trainer has no event
  for) is ``on_exception``, so no tap stays open after a failed run.

TensorBoard: the scalars, histograms and layouts go through the `SummaryWriter` of the Trainer's own
`TensorBoardCallback` (``report_to="tensorboard"``), found in ``trainer.callback_handler`` by `attach`. Reaching it
is the only way to write into the same run: transformers picks that folder (``output_dir/runs/<time>_<host>``, or
``TENSORBOARD_LOGGING_DIR``) inside the callback's ``on_train_begin``, so a writer of our own could not know it.
Without that callback, ``log_dir`` names a folder for a writer of the adapter's own.

Under several processes every rank taps and reduces (sums and maxima through ``torch.distributed``), rank 0
writes, as under Lightning's DDP.

Resuming (``trainer.train(resume_from_checkpoint=...)``) goes as under Lightning: each ``checkpoint-N`` the
Trainer saves also holds `STATE_FILE`, the monitors' own state (their `state_dict`: counters, the Jacobian's row
sampler) and the TensorBoard folder; a resumed fit restores the monitors from it before they start (their
`load_state_dict`, before ``on_fit_start``, where Lightning restores callbacks), writes into that folder again and
purges what an interrupted attempt logged after the checkpoint's step, as Lightning's logger does with
``SummaryWriter(purge_step=...)``. TensorBoard purges by step, every tag at once, and at step N the Trainer has
logged its loss and evaluation before writing ``checkpoint-N`` while the monitors log the next window's training
values (opened at step N) after it: so the resumed writer purges from step N + 1 and writes nothing at or before
step N that the folder already holds. Every tag then has one value a step, those of the uninterrupted run.

Not supported (refused by `TrainerMonitors` with the reason): callbacks that drive Lightning's own loops or its
LightningModule (`UNSUPPORTED`).
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from typing_extensions import override

from study.atomic import write_atomically
from study.callbacks.base import write_summary
from study.checkpoints import checkpoint_problem

STATE_FILE = "study_monitors.pt"  # in each checkpoint-N: the monitors' state and the TensorBoard folder

# Callbacks that need Lightning's loops or its LightningModule, by class name, with why.
UNSUPPORTED = {
    "AttentionMapMonitor": "its step-0 maps run a batch of Lightning's validation loop (trainer.fit_loop)",
    "BaselineValidation": "it runs Lightning's validation loop at step 0 (trainer.fit_loop); call trainer.evaluate() "
    "before trainer.train() instead",
    "FixedBatchLoss": "it takes its batch from Lightning's validation loader and calls the LightningModule's loss",
    "NonFiniteGuard": "it logs through LightningModule.log and skips steps inside Lightning's optimizer closure",
}


# accelerate's distributed types whose gradients are sharded or clipped by an engine (not by one norm over
# the local, already-reduced gradients): the adapter cannot take the clipping over there.
SHARDED = {"DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM"}


def _overrides(callback: Callback, hook: str) -> bool:
    return getattr(type(callback), hook, None) is not getattr(Callback, hook)


class _Reduce:
    """The part of a Lightning strategy the monitors call: reduce a tensor across processes."""

    def __init__(self, view: TrainerView) -> None:
        self._view = view

    def reduce(self, tensor: torch.Tensor, group: Any = None, reduce_op: str | None = "mean") -> torch.Tensor:
        world = self._view.world_size
        if world <= 1 or not dist.is_available() or not dist.is_initialized():
            return tensor
        op = reduce_op.name if isinstance(reduce_op, dist.ReduceOp.RedOpType) else str(reduce_op or "mean")
        op = op.lower()
        ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM,
               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if op not in ops:
            raise ValueError(f"reduce_op={reduce_op!r}: the Trainer adapter reduces with sum, mean, max or min")
        out = tensor.clone()
        dist.all_reduce(out, op=ops[op])
        return out / world if op in ("mean", "avg") else out

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002 (Lightning's name)
        on_gpu = self._view.world_size > 1 and dist.is_initialized() and dist.get_backend() == "nccl"
        value = torch.tensor(float(bool(decision)), device="cuda" if on_gpu else "cpu")
        total = float(self.reduce(value, reduce_op="sum"))
        return total == self._view.world_size if all else total > 0

    def barrier(self, name: str | None = None) -> None:
        if self._view.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.barrier()


class _TensorBoard:
    """A Lightning logger's face over a `SummaryWriter`: ``log_metrics`` and ``experiment``."""

    def __init__(self, adapter: TrainerMonitors) -> None:
        self._adapter = adapter

    @property
    def experiment(self) -> Any:
        return self._adapter.writer()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        write_summary(self._adapter.writer(), metrics, step)

    def save(self) -> None:
        self._adapter.writer().flush()


def written_up_to(log_dir: str, step: int) -> set[tuple[str, int]]:
    """(tag, step) of everything a TensorBoard folder holds at or before ``step`` (scalars, histograms, images,
    text and other tensors), as TensorBoard reads it (earlier purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not Path(log_dir).is_dir():
        return set()
    kinds = ("scalars", "histograms", "images", "tensors")
    accumulator = EventAccumulator(log_dir, size_guidance=dict.fromkeys(kinds, 0))
    accumulator.Reload()
    read = {"scalars": accumulator.Scalars, "histograms": accumulator.Histograms, "images": accumulator.Images,
            "tensors": accumulator.Tensors}
    return {(tag, event.step) for kind in kinds for tag in accumulator.Tags().get(kind, [])
            for event in read[kind](tag) if event.step <= step}


class _SkipWritten:
    """A `FileWriter` that leaves out of each summary the (tag, step) already in the folder."""

    def __init__(self, inner: Any, written: set[tuple[str, int]]) -> None:
        self._inner, self._written = inner, written

    def add_summary(self, summary: Summary, global_step: int | None = None, walltime: float | None = None) -> None:
        step = 0 if global_step is None else int(global_step)
        kept = [value for value in summary.value if (value.tag, step) not in self._written]
        if len(kept) < len(summary.value):
            if not kept:
                return
            summary = Summary(value=kept)
        self._inner.add_summary(summary, global_step, walltime)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ResumedWriter(SummaryWriter):
    """The `SummaryWriter` of a fit resumed from the checkpoint of ``step``: it purges what was logged after
    ``step`` (``purge_step=step + 1``) and writes no (tag, step) up to ``step`` that the folder already holds."""

    def __init__(self, log_dir: str, step: int) -> None:
        self._written = written_up_to(log_dir, step)  # before the purge this writer's file starts with
        super().__init__(log_dir=log_dir, purge_step=step + 1)

    @override
    def _get_file_writer(self) -> Any:
        return _SkipWritten(super()._get_file_writer(), self._written)


class TrainerView:
    """What the monitors read of a Lightning Trainer, from the transformers Trainer's state and arguments.

    An attribute a monitor asks for that has no counterpart here raises an AttributeError naming it.
    """

    sanity_checking = False

    def __init__(self, adapter: TrainerMonitors, args: TrainingArguments, state: TrainerState) -> None:
        self._adapter = adapter
        self.args = args
        self.state = state
        self.control: TrainerControl | None = None
        self.strategy = _Reduce(self)

    @property
    def global_step(self) -> int:
        return self.state.global_step

    @property
    def max_steps(self) -> int:
        return self.state.max_steps

    @property
    def current_epoch(self) -> int:
        return int(self.state.epoch or 0)

    @property
    def world_size(self) -> int:
        return self.args.world_size

    @property
    def global_rank(self) -> int:
        return self.args.process_index

    @property
    def is_global_zero(self) -> bool:
        return self.state.is_world_process_zero

    @property
    def loggers(self) -> list[_TensorBoard]:
        return [self._adapter.logger] if self.is_global_zero else []

    @property
    def logger(self) -> _TensorBoard | None:
        return self._adapter.logger if self.is_global_zero else None

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        optimizer = self._adapter.trainer.optimizer
        # accelerate's wrapper steps the optimizer it wraps: hooks go on that one
        return [getattr(optimizer, "optimizer", optimizer)] if optimizer is not None else []

    @property
    def should_stop(self) -> bool:
        return bool(self.control is not None and self.control.should_training_stop)

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        if self.control is not None and value:
            self.control.should_training_stop = True

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"a monitor read trainer.{name}, a Lightning Trainer attribute that the "
                             f"transformers.Trainer adapter (study.callbacks.hf_trainer.TrainerView) does not provide")


class TrainerMonitors(TrainerCallback):
    """Run Lightning monitors (``study.callbacks``) under a `transformers.Trainer`, with the tags they log under
    Lightning, into the Trainer's TensorBoard run.

    Args:
        monitors: the monitor objects (`AttentionEntropyMonitor`, `GradientNormMonitor`, ... any `TapMonitor`).
        log_dir: a folder for a SummaryWriter of the adapter's own, used only when the Trainer has no
            `TensorBoardCallback` (``report_to`` without "tensorboard").

    Put the model under its spec with `study.attention.apply_attention_spec` first (T, top-k, another normaliser),
    then build the Trainer and `attach` the adapter to it (it needs the Trainer's TensorBoard writer and
    accelerator, which a callback's events do not carry)::

        trainer = Trainer(model=model, args=TrainingArguments(..., report_to="tensorboard"), train_dataset=...)
        TrainerMonitors([AttentionEntropyMonitor(every_n_steps=10), GradientNormMonitor(every_n_steps=10)]).attach(trainer)
        trainer.train()
    """

    def __init__(self, monitors: Sequence[Callback], log_dir: str | None = None) -> None:
        monitors = list(monitors)
        for monitor in monitors:
            if not isinstance(monitor, Callback):
                raise TypeError(f"TrainerMonitors takes study.callbacks monitors (Lightning callbacks); got {monitor!r}")
            reason = UNSUPPORTED.get(type(monitor).__name__)
            if reason is not None:
                raise ValueError(f"{type(monitor).__name__} cannot run under transformers.Trainer: {reason}")
        self.monitors = monitors
        self.log_dir = log_dir
        self.trainer: Any = None
        self.logger = _TensorBoard(self)
        self._hf_tensorboard: Any = None
        self._writer: Any = None
        self._view: TrainerView | None = None
        self._batch_idx = 0
        self._val_epoch = False
        self._val_batch: int | None = None
        self._val_index = 0
        self._clip: float | None = None
        self._hook: Any = None
        self._wrapped: dict[str, Any] = {}
        self._evaluating = 0
        self._restore: dict[str, Any] | None = None  # the monitors' state of the checkpoint a fit resumes from

    # ----- wiring ------------------------------------------------------------------------------------------

    def attach(self, trainer: Any) -> TrainerMonitors:
        """Add the adapter to ``trainer`` (a `transformers.Trainer`) and find its TensorBoard writer."""
        from transformers.integrations import TensorBoardCallback

        self._hf_tensorboard = next(
            (cb for cb in trainer.callback_handler.callbacks if isinstance(cb, TensorBoardCallback)), None
        )
        if self._hf_tensorboard is None and self.log_dir is None:
            raise ValueError("the Trainer has no TensorBoardCallback (report_to without 'tensorboard'): "
                             "add report_to='tensorboard' or give TrainerMonitors(log_dir=...)")
        if self.trainer is not None:
            raise ValueError("this TrainerMonitors is already attached to a Trainer")
        self.trainer = trainer
        self._bind(trainer.args, trainer.state, trainer.control)  # evaluate() may come before any train()
        trainer.add_callback(self)
        self._hook = trainer.model.register_forward_pre_hook(self._before_forward)
        self._wrapped = {"train": trainer.train, "evaluate": trainer.evaluate}
        trainer.train = self._watching(trainer.train, evaluating=False)
        trainer.evaluate = self._watching(trainer.evaluate, evaluating=True)
        return self

    def _watching(self, method: Any, evaluating: bool) -> Any:
        """``method`` of the Trainer, marking evaluation and turning an exception into ``on_exception``."""

        @functools.wraps(method)
        def watched(*args: Any, **kwargs: Any) -> Any:
            if not evaluating:
                self._resume_from(kwargs.get("resume_from_checkpoint", args[0] if args else None))
            self._evaluating += evaluating
            try:
                return method(*args, **kwargs)
            except BaseException as exception:
                if self._view is not None:
                    self._call("on_exception", self._view, exception)
                self._val_epoch, self._val_batch = False, None
                if self._clip is not None:  # the clipping taken over: the Trainer's argument back as it was
                    self.trainer.args.max_grad_norm, self._clip = self._clip, None
                raise
            finally:
                self._evaluating -= evaluating

        return watched

    def _resume_from(self, checkpoint: str | bool | None) -> None:
        """Before ``train(resume_from_checkpoint=checkpoint)``: the monitors' state to restore at its start, and on
        rank zero the writer that purges what came after the checkpoint's step (`ResumedWriter`), in the folder the
        interrupted fit wrote to. Must run before the Trainer's own TensorBoard callback opens a writer."""
        self._restore = None
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.trainer.args.output_dir)
        if not checkpoint or not Path(checkpoint, "trainer_state.json").is_file():
            return  # a fresh fit, or a checkpoint the Trainer itself refuses
        step = int(json.loads(Path(checkpoint, "trainer_state.json").read_text())["global_step"])
        saved = Path(checkpoint, STATE_FILE)
        if saved.is_file():
            if (problem := checkpoint_problem(saved)) is not None:  # verified before use; data only, never code
                raise ValueError(f"{saved}: {problem}; remove it to resume with the monitors started afresh")
            self._restore = torch.load(saved, map_location="cpu", weights_only=True)
        else:
            warnings.warn(f"{checkpoint} holds no {STATE_FILE} (saved without TrainerMonitors): the monitors start "
                          "afresh, and a sampling monitor draws other rows than the uninterrupted run", stacklevel=3)
        if not self.trainer.is_world_process_zero():
            return
        tb = self._hf_tensorboard
        recorded = (self._restore or {}).get("log_dir")
        folder = (tb.logging_dir if tb is not None else self.log_dir) or recorded
        if folder is None:  # the Trainer picks a new folder: nothing there to purge
            return
        writer = ResumedWriter(folder, step)
        if tb is not None:
            if tb.tb_writer is not None:  # the interrupted fit's, in this process
                tb.tb_writer.close()
            tb.logging_dir, tb.tb_writer = folder, writer
        elif self._writer is not None:
            self._writer.close()
        self._writer = writer

    def _log_dir(self) -> str | None:
        tb = self._hf_tensorboard
        folder = tb.logging_dir if tb is not None else self.log_dir
        return os.path.abspath(folder) if folder else None

    def writer(self) -> Any:
        """The Trainer's SummaryWriter when it has one open, else the last one seen (a closed torch
        SummaryWriter reopens a file in its folder), else one of the adapter's own on ``log_dir``."""
        tb = self._hf_tensorboard
        if tb is not None and tb.tb_writer is not None:
            self._writer = tb.tb_writer
        if self._writer is None:
            folder = self.log_dir if tb is None else (tb.logging_dir or self.log_dir)
            if folder is None:
                raise RuntimeError("the Trainer's TensorBoard writer is not open yet and no log_dir was given")
            self._writer = SummaryWriter(log_dir=folder)
        return self._writer

    def _check_attached(self) -> None:
        if self.trainer is None:
            raise RuntimeError("TrainerMonitors must be attached with .attach(trainer), not passed in callbacks=: "
                               "it needs the Trainer's TensorBoard writer and wraps its evaluate()")

    def _bind(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> TrainerView:
        if self._view is None or self._view.state is not state or self._view.args is not args:
            self._view = TrainerView(self, args, state)
        self._view.control = control
        return self._view

    def _call(self, hook: str, view: TrainerView, *args: Any) -> None:
        for monitor in self.monitors:
            getattr(monitor, hook)(view, self.trainer.model, *args)

    def _flush(self) -> None:
        if self._view is not None and self._view.is_global_zero and self._writer is not None:
            self._writer.flush()

    # ----- training ----------------------------------------------------------------------------------------

    @override
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._check_attached()
        view = self._bind(args, state, control)
        if args.max_grad_norm and args.max_grad_norm > 0 and any(_overrides(m, "on_before_optimizer_step")
                                                                  for m in self.monitors):
            kind = self.trainer.accelerator.distributed_type.name
            if kind in SHARDED:
                raise ValueError(f"gradient monitors with max_grad_norm > 0 under {kind}: its gradients are clipped "
                                 "in ways the adapter cannot take over; set max_grad_norm=0 to log gradient norms")
            self._clip, args.max_grad_norm = float(args.max_grad_norm), 0.0
        self._batch_idx = 0
        if self._restore is not None:
            self._load_state(self._restore)
            self._restore = None
        self._call("setup", view, "fit")
        self._call("on_fit_start", view)
        self._call("on_train_start", view)
        self._flush()

    @override
    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._call("on_train_batch_start", self._bind(args, state, control), None, self._batch_idx)

    @override
    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        view = self._bind(args, state, control)
        self._call("on_train_batch_end", view, None, None, self._batch_idx)
        self._batch_idx += 1
        self._call("on_train_batch_start", view, None, self._batch_idx)

    @override
    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any):
        view = self._bind(args, state, control)
        for optimizer in view.optimizers[:1]:
            self._call("on_before_optimizer_step", view, optimizer)
        if self._clip is not None:
            # The clipping the Trainer would have done before this event. Its grad-norm log has already unscaled
            # fp16 gradients (accelerate's clip_grad_norm_ at inf), so accelerate's clip, which unscales again,
            # would fail: torch's is the same computation on unsharded gradients.
            torch.nn.utils.clip_grad_norm_(self.trainer.model.parameters(), self._clip)

    @override
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._call("on_train_batch_end", self._bind(args, state, control), None, None, self._batch_idx)
        self._batch_idx += 1
        self._flush()

    @override
    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        view = self._bind(args, state, control)
        try:
            self._call("on_train_end", view)
            self._call("on_fit_end", view)
            self._call("teardown", view, "fit")
        finally:
            if self._clip is not None:
                args.max_grad_norm, self._clip = self._clip, None
            if view.is_global_zero and self._writer is not None:
                # after the Trainer closed its writer: close what the monitors reopened
                self._writer.close()

    # ----- checkpoints -------------------------------------------------------------------------------------

    def _load_state(self, saved: dict[str, Any]) -> None:
        """Each monitor's state from a checkpoint of the same monitors, in the same order."""
        keys = [entry["state_key"] for entry in saved["monitors"]]
        if keys != [monitor.state_key for monitor in self.monitors]:
            raise ValueError(f"the checkpoint's {STATE_FILE} holds the state of the monitors {keys}, this fit has "
                             f"{[monitor.state_key for monitor in self.monitors]}: resume with the same monitors")
        for monitor, entry in zip(self.monitors, saved["monitors"]):
            monitor.load_state_dict(entry["state"])
        self._batch_idx = int(saved["batch_idx"])

    @override
    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """The monitors' state into the checkpoint the Trainer has just written (rank zero's, as Lightning keeps)."""
        folder = Path(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not state.is_world_process_zero or not folder.is_dir():
            return
        record = {"monitors": [{"state_key": m.state_key, "state": m.state_dict()} for m in self.monitors],
                  "batch_idx": self._batch_idx, "log_dir": self._log_dir()}
        write_atomically(folder / STATE_FILE, lambda f: torch.save(record, f))

    # ----- evaluation --------------------------------------------------------------------------------------

    def _before_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        if not self._evaluating or self._view is None or self._val_batch is not None:
            return
        if not self._val_epoch:
            self._val_epoch = True
            self._val_index = 0
            self._call("on_validation_epoch_start", self._view)
        self._val_batch = self._val_index
        self._call("on_validation_batch_start", self._view, None, self._val_batch, 0)

    @override
    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any):
        view = self._bind(args, state, control)
        if self._val_batch is not None:
            self._call("on_validation_batch_end", view, None, None, self._val_batch, 0)
            self._val_batch = None
            self._val_index += 1

    @override
    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._check_attached()  # evaluate() alone: nothing was tapped, say why
        view = self._bind(args, state, control)
        if self._val_epoch:
            self._call("on_validation_epoch_end", view)
        self._val_epoch = False
        self._flush()

    def detach(self) -> None:
        """Remove the forward hook and the adapter from its Trainer."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.trainer is not None:
            for name, method in self._wrapped.items():
                setattr(self.trainer, name, method)
            self.trainer.remove_callback(self)
            self.trainer, self._wrapped = None, {}


__all__ = ["STATE_FILE", "UNSUPPORTED", "ResumedWriter", "TrainerMonitors", "TrainerView", "written_up_to"]
