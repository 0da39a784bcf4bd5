"""The frozen model: the one way `study probe` and `study analyze` get a model and its tokenizer.

A model is named as an embedded short name (``smollm2-135m``, `study.pretrained`), a ``.gguf`` file, a local Hugging
Face folder (with ``config.json``), a `study fit` checkpoint (``.ckpt``, a `CausalLMModule`) or a hub name. Every
check that needs no weights runs first and fails with a `study.errors.ConfigError` naming the bad value: a missing
model, a tokenizer that is none, a sequence longer than the model's context. The text is read by `study.frozen.text`
and cut into windows by `study.frozen.windows`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from study.corpus import is_tokenizer_dir, load_tokenizer
from study.errors import ConfigError

CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx")  # where configs keep the context length


# ---- the model --------------------------------------------------------------------------------------------------
def model_kind(name: str) -> str:
    """'embedded', 'gguf', 'ckpt', 'dir' or 'hub'; a path that does not exist is an error, not a hub name.

    Offline (``HF_HUB_OFFLINE=1``) a hub name must already be in the local hub cache."""
    from study.pretrained import EMBEDDED_MODELS

    if name in EMBEDDED_MODELS:
        return "embedded"
    path = Path(name).expanduser()
    if name.endswith((".gguf", ".ckpt")):
        if not path.is_file():
            raise ConfigError(f"--model {name!r}: no such {'checkpoint' if name.endswith('.ckpt') else 'gguf file'}")
        return name.rsplit(".", 1)[1]
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model {name!r} is not a Hugging Face model folder (no config.json)")
        return "dir"
    if path.exists():
        from study.checkpoints import is_pickle

        if is_pickle(path):
            raise ConfigError(f"--model {name!r} is a pickle file: refused, pickles are never loaded (they can run "
                              "code); give a Hugging Face model folder, a .gguf or a study fit .ckpt")
        raise ConfigError(f"--model {name!r} is a file but neither a .ckpt checkpoint nor a .gguf file")
    if not name or name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(("/", ".bin", ".safetensors")):
        raise ConfigError(f"--model {name!r}: no such folder (neither a local path nor a hub name)")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ConfigError(f"--model {name!r} is not a local folder and not in the hub cache (HF_HUB_OFFLINE=1)")
    return "hub"


def config_context(name: str, kind: str | None = None) -> int | None:
    """The model's context length from its config alone (no weights); None for a checkpoint or when unknown."""
    kind = kind or model_kind(name)
    if kind == "ckpt":
        return None
    from transformers import AutoConfig

    from study.pretrained import resolve_model

    try:
        config = AutoConfig.from_pretrained(resolve_model(name))
    except (OSError, ValueError):
        return None
    return context_of(config)


def context_of(config_or_model: Any) -> int | None:
    config = getattr(config_or_model, "config", config_or_model)
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_seq_len(seq_len: int, context: int | None, model: str, flag: str = "--seq-len") -> None:
    if context is not None and seq_len > context:
        raise ConfigError(f"{flag} {seq_len} is longer than the context length of {model} ({context} tokens)")


def checkpoint_tokenizer(ckpt: Path, hparams: dict):
    """The tokenizer a `CausalLMModule` checkpoint was trained with, found beside it; None if none is found.

    Looked for, nearest first, in the checkpoint's folder and up to three folders above it: a folder holding a
    saved tokenizer (itself, or a sub-folder such as `tokenizer/` or a `save_pretrained` model folder); then the
    run's `config.yaml` (LightningCLI) `data` section ('gpt2', a tokenizer folder, or corpus-bpe rebuilt from
    its cache); then the model's `model_name_or_path` when it is a local folder with a tokenizer.
    """
    folders = [ckpt.parent, *list(ckpt.parent.parents)[:3]]
    for folder in folders:
        if is_tokenizer_dir(folder):
            return load_tokenizer(str(folder))
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
            if is_tokenizer_dir(sub):
                return load_tokenizer(str(sub))
    for folder in folders:
        config = folder / "config.yaml"
        if config.is_file():
            import yaml

            data = (yaml.safe_load(config.read_text()) or {}).get("data") or {}
            data = data.get("init_args", data)
            name = data.get("tokenizer")
            if name == "gpt2" or (name and is_tokenizer_dir(name)):
                return load_tokenizer(name)
            # "auto" without a loaded model is corpus-bpe (study.data); with one, the model's folder below.
            if name == "corpus-bpe" or (name == "auto" and not hparams.get("model_name_or_path")):
                from study.data import TextDataModule

                keys = ("source", "dataset", "dataset_config", "train_files", "val_files", "vocab_size", "cache_dir")
                return TextDataModule(tokenizer="corpus-bpe", **{k: data[k] for k in keys if k in data}).tokenizer
    base = hparams.get("model_name_or_path")
    if base:
        from study.pretrained import resolve_model

        base = resolve_model(base)  # an embedded short name (e.g. smollm2-135m) -> its cached folder
    if base and is_tokenizer_dir(base):
        return load_tokenizer(base)
    return None


def _check_trained_tokenizer(name: str, folder: Path, tok: Any, tokenizer: str) -> None:
    """``--tokenizer`` on a model folder: refused unless it is the tokenizer the model was trained with (its record,
    else the tokenizer saved in it; `study.trained_tokenizer`), compared by content."""
    from study.trained_tokenizer import mismatch, tokenizer_digest, trained_with

    trained = trained_with(folder)
    where = "gpt2, GPT-2's BPE" if tokenizer == "gpt2" else f"the tokenizer saved in {tokenizer}"
    if trained is not None and (problem := mismatch(name, trained, (tokenizer_digest(tok), where), "no --tokenizer")):
        raise ConfigError(f"--tokenizer {tokenizer}: {problem}")


@dataclass
class FrozenModel:
    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any
    name: str  # as the user gave it
    kind: str  # model_kind(name)
    context: int | None = None  # context length in tokens, when the config says


def load_frozen(name: str, tokenizer: str | None = None, dtype: torch.dtype | None = None,
                device: str = "cpu") -> FrozenModel:  # fmt: skip
    """The model (eval mode, on ``device``; ``dtype`` None keeps the stored one) and its tokenizer: its own, the
    one saved beside a checkpoint, or ``tokenizer`` ('gpt2' or a folder) when given."""
    from study.pretrained import load_causal_lm, resolve_model

    kind = model_kind(name)
    if tokenizer is not None and tokenizer != "gpt2" and not is_tokenizer_dir(tokenizer):
        raise ConfigError(f"tokenizer {tokenizer!r} is neither 'gpt2' nor a directory holding a saved tokenizer")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available")
    kwargs = {} if dtype is None else {"dtype": dtype}
    if kind == "ckpt":
        from study.attention import AttentionSpec
        from study.checkpoints import checkpoint_problem
        from study.model import CausalLMModule

        # Checked first, by data-only reading: torch's own refusal would suggest `weights_only=False`.
        if (problem := checkpoint_problem(name)) and "AttentionSpec" not in problem:
            raise ConfigError(f"--model {name} is not a checkpoint to load ({problem}); it is never unpickled "
                              "beyond data")
        # Weights-only unpickling (the safe default) with the one project class the hyperparameters hold.
        try:
            with torch.serialization.safe_globals([AttentionSpec]):
                module = CausalLMModule.load_from_checkpoint(name, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - report any load failure with the path
            raise ConfigError(f"cannot load checkpoint {name} as a CausalLMModule: {err}") from err
        model = module.model if dtype is None else module.model.to(dtype)  # keeps the checkpoint's AttentionSpec
        tok = load_tokenizer(tokenizer) if tokenizer else checkpoint_tokenizer(Path(name), dict(module.hparams))
        if tok is None:
            raise ConfigError(f"no tokenizer found for checkpoint {name}: none saved beside it, no config.yaml "
                                   "naming one; pass --tokenizer gpt2 or --tokenizer DIR")  # fmt: skip
    else:
        folder = resolve_model(name)  # an embedded name or a gguf becomes its cached folder
        if tokenizer is None and kind == "dir" and not is_tokenizer_dir(folder):
            raise ConfigError(f"model directory {name} holds no tokenizer; pass --tokenizer gpt2 or DIR")
        model = load_causal_lm(folder, **kwargs)
        if tokenizer is None and kind == "hub" and name == "gpt2":
            tokenizer = "gpt2"  # offline too
        if tokenizer is not None:
            tok = load_tokenizer(tokenizer)
        elif kind == "hub":
            from transformers import AutoTokenizer

            from study.console import quiet_loading

            with quiet_loading():
                tok = AutoTokenizer.from_pretrained(folder)
        else:
            tok = load_tokenizer(folder)
        if tokenizer is not None and Path(folder).is_dir():
            _check_trained_tokenizer(name, Path(folder), tok, tokenizer)
    if len(tok) <= 1:
        raise ConfigError(f"the tokenizer for {name} is empty (offline hub?); pass --tokenizer")
    embed = model.get_input_embeddings().num_embeddings
    if len(tok) > embed:
        raise ConfigError(f"the tokenizer has {len(tok)} tokens but the model embeds only {embed}")
    return FrozenModel(model.to(device).eval(), tok, name, kind, context_of(model))
