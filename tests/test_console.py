"""What `study fit` prints: library notices that are not the user's to act on are silenced at their source; errors
and genuine warnings stay visible."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from study.console import silence_library_notices
from tests.conftest import tiny_gpt2_config
from tests.test_cli import fit_args

ROOT = Path(__file__).resolve().parents[1]
NOTICES = (
    "Loading weights",
    "litlogger",
    "litmodels",
    "LeafSpec",
    "loss_type=None",
    "module(s) in eval mode",
    "GPU available",
    "TPU available",
    "`Trainer.fit` stopped",
)


def _study(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "study.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_a_tiny_fit_of_a_loaded_model_prints_no_library_notices(text_files, tmp_path):
    from transformers import GPT2LMHeadModel

    folder = tmp_path / "tiny"
    GPT2LMHeadModel(tiny_gpt2_config(vocab_size=512, bos_token_id=511, eos_token_id=511)).save_pretrained(folder)
    args = fit_args(text_files, tmp_path, f"--model.model_name_or_path={folder}", "--data.tokenizer=corpus-bpe")
    done = _study(args)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert (tmp_path / "logs" / "default" / "version_0" / "checkpoints" / "last.ckpt").exists()
    for notice in NOTICES:
        assert notice not in output, f"{notice!r} in:\n{output}"

    bad = _study([*args, "--model.attention.temperature=0"])
    assert bad.returncode != 0
    assert "study fit:" in bad.stderr and "temperature" in bad.stderr


def test_only_the_named_notices_are_silenced():
    silence_library_notices()
    silence_library_notices()  # idempotent
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for message in ("GPU available: False, used: False", "💡 Tip: try litlogger", "Restoring states from x.ckpt"):
            logger.info(message)
        logger.warning("GPU available but not used.")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert seen == ["Restoring states from x.ckpt", "GPU available but not used."]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_library_notices()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)  # not Lightning's
    assert len(caught) == 1  # the filter names Lightning's module: the same text from elsewhere still shows
