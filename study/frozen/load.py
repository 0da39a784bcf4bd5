"""Frozen-model input: the one way `study probe` and `study analyze` get a model, its tokenizer and its text.

A model is named as an embedded short name (``smollm2-135m``, `study.pretrained`), a ``.gguf`` file, a local Hugging
Face folder (with ``config.json``), a `study fit` checkpoint (``.ckpt``, a `CausalLMModule`) or a hub name. Text is
``shakespeare`` (the embedded corpus's held-out plays, one document each), a text file (one document) or a folder
of ``*.txt`` files (one document each). Every check that needs no weights runs first and fails with a
`FrozenInputError` naming the bad value: a missing model or file, a binary or empty text, a text too short for
what is asked of it, a sequence longer than the model's context.

`text_windows` draws independent replicates for measurements on a frozen model: windows of ``seq_len`` tokens
spread across the documents (different plays, far-apart places in each), not consecutive blocks of one passage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx")  # where configs keep the context length
SHAKESPEARE = "shakespeare"


class FrozenInputError(ValueError):
    """A model, tokenizer or text the frozen-model commands cannot use; raised before any heavy work."""


# ---- the model --------------------------------------------------------------------------------------------------
def is_tokenizer_dir(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES)


def model_kind(name: str) -> str:
    """'embedded', 'gguf', 'ckpt', 'dir' or 'hub'; a path that does not exist is an error, not a hub name.

    Offline (``HF_HUB_OFFLINE=1``) a hub name must already be in the local hub cache."""
    from study.pretrained import EMBEDDED_MODELS

    if name in EMBEDDED_MODELS:
        return "embedded"
    path = Path(name).expanduser()
    if name.endswith((".gguf", ".ckpt")):
        if not path.is_file():
            raise FrozenInputError(f"--model {name!r}: no such {'checkpoint' if name.endswith('.ckpt') else 'gguf file'}")
        return name.rsplit(".", 1)[1]
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FrozenInputError(f"--model {name!r} is not a Hugging Face model folder (no config.json)")
        return "dir"
    if path.exists():
        raise FrozenInputError(f"--model {name!r} is a file but neither a .ckpt checkpoint nor a .gguf file")
    if not name or name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(("/", ".bin", ".safetensors")):
        raise FrozenInputError(f"--model {name!r}: no such folder (neither a local path nor a hub name)")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise FrozenInputError(f"--model {name!r} is not a local folder and not in the hub cache (HF_HUB_OFFLINE=1)")
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
        raise FrozenInputError(f"{flag} {seq_len} is longer than the context length of {model} ({context} tokens)")


def load_tokenizer(spec: str):
    """'gpt2' (GPT-2's BPE, offline too) or a folder holding a saved tokenizer."""
    from transformers import AutoTokenizer

    from study.console import quiet_loading

    if spec == "gpt2":
        from study.corpus import gpt2_tokenizer

        return gpt2_tokenizer()
    if not is_tokenizer_dir(spec):
        raise FrozenInputError(f"tokenizer {spec!r} is neither 'gpt2' nor a directory holding a saved tokenizer")
    with quiet_loading():
        return AutoTokenizer.from_pretrained(spec)


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
        raise FrozenInputError(f"tokenizer {tokenizer!r} is neither 'gpt2' nor a directory holding a saved tokenizer")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FrozenInputError(f"--device {device}: CUDA is not available")
    kwargs = {} if dtype is None else {"dtype": dtype}
    if kind == "ckpt":
        from study.attention import AttentionSpec
        from study.model import CausalLMModule

        # Weights-only unpickling (the safe default) with the one project class the hyperparameters hold.
        try:
            with torch.serialization.safe_globals([AttentionSpec]):
                module = CausalLMModule.load_from_checkpoint(name, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - report any load failure with the path
            raise FrozenInputError(f"cannot load checkpoint {name} as a CausalLMModule: {err}") from err
        model = module.model if dtype is None else module.model.to(dtype)  # keeps the checkpoint's AttentionSpec
        tok = load_tokenizer(tokenizer) if tokenizer else checkpoint_tokenizer(Path(name), dict(module.hparams))
        if tok is None:
            raise FrozenInputError(f"no tokenizer found for checkpoint {name}: none saved beside it, no config.yaml "
                                   "naming one; pass --tokenizer gpt2 or --tokenizer DIR")  # fmt: skip
    else:
        folder = resolve_model(name)  # an embedded name or a gguf becomes its cached folder
        if tokenizer is None and kind == "dir" and not is_tokenizer_dir(folder):
            raise FrozenInputError(f"model directory {name} holds no tokenizer; pass --tokenizer gpt2 or DIR")
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
    if len(tok) <= 1:
        raise FrozenInputError(f"the tokenizer for {name} is empty (offline hub?); pass --tokenizer")
    embed = model.get_input_embeddings().num_embeddings
    if len(tok) > embed:
        raise FrozenInputError(f"the tokenizer has {len(tok)} tokens but the model embeds only {embed}")
    return FrozenModel(model.to(device).eval(), tok, name, kind, context_of(model))


# ---- the text ---------------------------------------------------------------------------------------------------
def _checked(path: Path) -> str:
    from study.corpus import text_problem

    problem = text_problem(path)
    if problem is not None and "empty" not in problem:  # binary or not UTF-8: refuse it
        raise FrozenInputError(problem)
    return path.read_text(errors="replace")


def documents(spec: str) -> list[tuple[str, str]]:
    """(name, text) of every document of ``spec``: the held-out plays of the embedded corpus ('shakespeare'), a text
    file, or a folder of ``*.txt`` files. Binary files and empty text are refused, naming them."""
    if spec == SHAKESPEARE:
        from study.corpus import shakespeare_files

        try:
            files = shakespeare_files()["validation"]  # held-out plays: text the embedded model never trained on
        except FileNotFoundError as err:
            raise FrozenInputError(str(err)) from err
        docs = [(Path(f).name.removesuffix("_gut.txt"), Path(f).read_text(errors="replace")) for f in files]
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            files = sorted(path.glob("*.txt"))
            if not files:
                raise FrozenInputError(f"text folder {spec} holds no *.txt files")
            docs = [(f.name, _checked(f)) for f in files]
        elif path.is_file():
            docs = [(path.name, _checked(path))]
        else:
            raise FrozenInputError(f"text file not found: {spec} (a file, a folder of .txt files, or 'shakespeare')")
    docs = [(name, text) for name, text in docs if text.strip()]
    if not docs:
        raise FrozenInputError(f"empty text: {spec} has no characters to tokenise")
    return docs


def read_text(spec: str, min_chars: int | None = None) -> str:
    """The documents of ``spec`` joined by newlines; with ``min_chars``, only as many documents as reach it."""
    parts, size = [], 0
    for _, text in documents(spec):
        parts.append(text)
        size += len(text)
        if min_chars is not None and size >= min_chars:
            break
    return "\n".join(parts)


@dataclass
class Windows:
    """Token windows of one length: ``ids[i]`` comes from document ``sources[i][0]`` at token ``sources[i][1]``."""

    ids: torch.Tensor  # (count, seq_len), int64
    sources: list[tuple[str, int]] = field(default_factory=list)


def text_windows(tokenizer, docs: list[tuple[str, str]], count: int, seq_len: int, seed: int = 0) -> Windows:
    """``count`` windows of ``seq_len`` tokens spread across the documents, as independent as the text allows.

    Windows go to the documents in turn (round robin, so 20 windows over 4 plays are 5 per play); a document's
    share is placed in equal strata of its tokens, one window at a random offset inside each stratum (``seed``),
    so windows never overlap and lie far apart. A document too short for its share passes the rest on; too few
    tokens in all is an error naming how many there are.
    """
    if count < 1 or seq_len < 2:
        raise FrozenInputError(f"need at least 1 window of at least 2 tokens, got {count} x {seq_len}")
    generator = torch.Generator().manual_seed(seed)
    tokens = {name: tokenizer(text, add_special_tokens=False)["input_ids"] for name, text in docs}
    capacity = {name: len(ids) // seq_len for name, ids in tokens.items()}
    if sum(capacity.values()) < count:
        have = sum(len(ids) for ids in tokens.values())
        raise FrozenInputError(f"the text has {have} tokens in {len(docs)} document(s), room for "
                               f"{sum(capacity.values())} windows of {seq_len} tokens; {count} asked")  # fmt: skip
    share = dict.fromkeys(tokens, 0)
    while sum(share.values()) < count:
        for name in tokens:
            if share[name] < capacity[name] and sum(share.values()) < count:
                share[name] += 1
    per_doc: list[list[tuple[list[int], tuple[str, int]]]] = []
    for name, n in share.items():
        doc, picked = tokens[name], []
        stratum = len(doc) // n if n else 0
        for i in range(n):
            start = i * stratum + int(torch.randint(stratum - seq_len + 1, (), generator=generator))
            picked.append((doc[start : start + seq_len], (name, start)))
        per_doc.append(picked)
    # interleave the documents: the first few windows (an fp64 check on a subset) come from different texts
    ordered = [doc[i] for i in range(max(map(len, per_doc))) for doc in per_doc if i < len(doc)]
    return Windows(torch.tensor([ids for ids, _ in ordered], dtype=torch.long), [src for _, src in ordered])
