"""What the study's commands print: library notices that are not the user's to act on, silenced at their source.

Each notice is named exactly (its logger and the start of its message, or its warning category, message and
module); nothing else is filtered, so genuine warnings and errors stay visible.

- Lightning's INFO lines on its ``rank_zero`` logger: the litlogger / litmodels advertisements, "GPU available /
  TPU available / HPU available" and "`Trainer.fit` stopped: `max_steps=N` reached." (`silence_library_notices`);
- the `_pytree` ``isinstance(treespec, LeafSpec)`` FutureWarning that Lightning's own code triggers with torch
  >= 2.9 (`silence_library_notices`);
- transformers' "Loading weights" progress bar, around the study's own `from_pretrained` calls (`quiet_loading`);
- "`loss_type=None` was set in the config": not a warning about the config at all; the study declares the loss
  transformers falls back to (`study.pretrained.declare_causal_lm_loss`).

Lightning's "Found N module(s) in eval mode" is left visible: `CausalLMModule` puts a loaded model in train mode,
so the warning only appears when something is genuinely wrong (dropout would be silently off).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# Start of each Lightning INFO message that is silenced (they are logged on Lightning's rank_zero logger).
LIGHTNING_NOTICES = (
    "💡 Tip:",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "`Trainer.fit` stopped:",
)
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
PYTREE_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
PYTREE_MODULE = r"lightning\.pytorch\.utilities\._pytree"


class _DropNotices(logging.Filter):
    """Drops the INFO records whose message starts with one of `LIGHTNING_NOTICES`; keeps everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        return not str(record.getMessage()).startswith(LIGHTNING_NOTICES)


_FILTER = _DropNotices()


def silence_library_notices() -> None:
    """Install the filters above (idempotent). Called by `study fit`, `study probe` and `study bench`."""
    loggers = [logging.getLogger(name) for name in RANK_ZERO_LOGGERS]
    try:  # the logger lightning_utilities' rank_zero_info writes to (set by whichever Lightning package loaded last)
        from lightning_utilities.core import rank_zero

        loggers.append(rank_zero.log)
    except (ImportError, AttributeError):  # pragma: no cover - an older lightning_utilities
        pass
    for logger in loggers:
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    warnings.filterwarnings("ignore", message=PYTREE_WARNING, category=FutureWarning, module=PYTREE_MODULE)
    # the datasets library's bars (loading, tokenising and packing the corpus: "Map: 100%|...") on every run; the
    # variable is read when datasets is imported, the call covers a datasets already imported
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' progress bars off while the study loads a model or tokenizer (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


__all__ = ["LIGHTNING_NOTICES", "quiet_loading", "silence_library_notices"]
