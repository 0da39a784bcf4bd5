"""Fault injection for testing a sweep's resume and divergence handling (used by the tests; harmless otherwise).

    - class_path: tests.faults.KillAtStep        # SIGKILL the process after optimizer step `step`
      init_args: {step: 5}
    - class_path: tests.faults.NaNLossAtStep     # the training loss becomes NaN from step `step` on
      init_args: {step: 3}

Both act only when the environment variable named by `env` (default STUDY_FAULTS) is "1" or unset-able via
`always: true`, so a test can make the first invocation fail and the second one run clean with the same config.
"""

from __future__ import annotations

import os
import signal as signal_module
from typing import Any

import lightning as L
from typing_extensions import override


def _armed(env: str, always: bool) -> bool:
    return always or os.environ.get(env) == "1"


class KillAtStep(L.Callback):
    """Send `signal` to the process when the batch after `step` optimizer steps starts: SIGKILL (no cleanup, like
    a pre-empted job), SIGINT (Ctrl-C) or SIGTERM. Every step before it is done and logged."""

    def __init__(
        self, step: int, env: str = "STUDY_FAULTS", always: bool = False, signal: str = "SIGKILL"
    ) -> None:
        self.step, self.env, self.always, self.signal = step, env, always, getattr(signal_module, signal)
        self.sent = False

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if _armed(self.env, self.always) and trainer.global_step >= self.step and not self.sent:
            self.sent = True
            if self.signal == signal_module.SIGINT and signal_module.getsignal(self.signal) == signal_module.SIG_IGN:
                # A process started in the background by a non-interactive shell (`cmd &`) inherits SIGINT
                # ignored; a person's Ctrl-C reaches a foreground process, whose Python raises KeyboardInterrupt.
                signal_module.signal(self.signal, signal_module.default_int_handler)
            os.kill(os.getpid(), self.signal)


class KillAtValidation(L.Callback):
    """SIGKILL the process when the first validation after `step` optimizer steps starts: the window in which the
    step that wrote a checkpoint has logged its metrics after that checkpoint, and nothing has flushed them."""

    def __init__(self, step: int, env: str = "STUDY_FAULTS", always: bool = False) -> None:
        self.step, self.env, self.always = step, env, always

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if _armed(self.env, self.always) and trainer.global_step >= self.step and not trainer.sanity_checking:
            os.kill(os.getpid(), signal_module.SIGKILL)


class NaNLossAtStep(L.Callback):
    """Multiply the training loss by NaN from optimizer step `step` on (wraps the module's `training_step`)."""

    def __init__(self, step: int, env: str = "STUDY_FAULTS", always: bool = False) -> None:
        self.step, self.env, self.always = step, env, always

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not _armed(self.env, self.always):
            return
        original = pl_module.training_step

        def training_step(*args, **kwargs):
            out = original(*args, **kwargs)
            if trainer.global_step >= self.step:
                if isinstance(out, dict):
                    return {**out, "loss": out["loss"] * float("nan")}
                return out * float("nan")
            return out

        pl_module.training_step = training_step


class FileSizeLimitAtStep(L.Callback):
    """From step `step` on, no file may grow past `limit` bytes (RLIMIT_FSIZE, SIGXFSZ ignored): every larger
    write fails with OSError, as it does on a full disk. Use it in a subprocess: the limit is per process."""

    def __init__(self, step: int, limit: int = 1000, env: str = "STUDY_FAULTS", always: bool = False) -> None:
        self.step, self.limit, self.env, self.always = step, limit, env, always

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if _armed(self.env, self.always) and trainer.global_step >= self.step:
            import resource

            signal_module.signal(signal_module.SIGXFSZ, signal_module.SIG_IGN)
            resource.setrlimit(
                resource.RLIMIT_FSIZE, (self.limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
            )
