"""Fault injection for testing a sweep's resume and divergence handling (used by the tests; harmless otherwise).

    - class_path: study.sweep.faults.KillAtStep        # SIGKILL the process after optimizer step `step`
      init_args: {step: 5}
    - class_path: study.sweep.faults.NaNLossAtStep     # the training loss becomes NaN from step `step` on
      init_args: {step: 3}

Both act only when the environment variable named by `env` (default STUDY_FAULTS) is "1" or unset-able via
`always: true`, so a test can make the first invocation fail and the second one run clean with the same config.
"""

from __future__ import annotations

import os
import signal

import lightning as L


def _armed(env: str, always: bool) -> bool:
    return always or os.environ.get(env) == "1"


class KillAtStep(L.Callback):
    """Kill the process with SIGKILL (no cleanup, like a pre-empted job) once `step` optimizer steps are done."""

    def __init__(self, step: int, env: str = "STUDY_FAULTS", always: bool = False) -> None:
        self.step, self.env, self.always = step, env, always

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _armed(self.env, self.always) and trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class NaNLossAtStep(L.Callback):
    """Multiply the training loss by NaN from optimizer step `step` on (wraps the module's `training_step`)."""

    def __init__(self, step: int, env: str = "STUDY_FAULTS", always: bool = False) -> None:
        self.step, self.env, self.always = step, env, always

    def on_fit_start(self, trainer, pl_module) -> None:
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
