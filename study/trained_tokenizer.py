"""The tokenizer a model was trained with: its digest, the record saved beside a model, and the one-line refusal of
a run whose tokenizer is another one.

A model's token ids mean what its training tokenizer made them mean; the same model fed the ids of another
tokenizer trains and reports numbers on text it cannot read, and nothing fails: a vocabulary of the right size, or a
smaller one, is accepted by the embedding. So a model this package trains and saves (a sweep's `pretrain/hf`)
carries `trained_tokenizer.json`, the digest of the tokenizer it trained with, and a run that loads a model folder
compares it with the digest of the tokenizer its data will use. A folder with no record (a hub model, a folder
saved elsewhere) was trained with the tokenizer saved in it, when it holds one.

The digest (`tokenizer_digest`) is what the ids mean: every token string with its id (added and special tokens
included) and, for a BPE, its merges in order. Two saves of one tokenizer, in any file layout, give one digest; a
corpus BPE of another size or trained on other text gives another. Normalisation and pre-tokenisation rules are not
part of it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from study.corpus import cache_fingerprint, is_tokenizer_dir, load_tokenizer
from study.errors import ConfigError

RECORD = "trained_tokenizer.json"  # beside a saved model: the digest of the tokenizer it was trained with


def tokenizer_digest(tokenizer: Any) -> str:
    """``vocabulary <16 hex>``: a digest of every (id, token) of the tokenizer and, for a BPE, of its merges in
    order (each merge as "left right", whatever the library version's serialisation of the pair)."""
    vocabulary = sorted((index, token) for token, index in tokenizer.get_vocab().items())
    merges = None
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer: the `tokenizers` model holds them
    if backend is not None:
        found = json.loads(backend.to_str()).get("model", {}).get("merges")
        merges = [m if isinstance(m, str) else " ".join(m) for m in found] if found else None
    elif getattr(tokenizer, "bpe_ranks", None):  # a slow BPE tokenizer: {(left, right): rank}
        merges = [" ".join(pair) for pair, _ in sorted(tokenizer.bpe_ranks.items(), key=lambda item: item[1])]
    return "vocabulary " + cache_fingerprint(vocabulary, merges)


def write_record(folder: Path, tokenizer: Any, origin: str) -> None:
    """Record in ``folder`` (a model being saved) the tokenizer it was trained with: its digest and where it was
    read from (``origin``: a tokenizer folder, 'gpt2' or a hub name). Call it inside the folder's build, so its
    checksums cover the record."""
    where = Path(origin)
    record = {"digest": tokenizer_digest(tokenizer), "tokenizer": str(where.resolve()) if where.is_dir() else origin}
    (Path(folder) / RECORD).write_text(json.dumps(record, indent=1) + "\n")


def read_record(folder: Path) -> dict[str, str] | None:
    """The record of a model folder (`write_record`), None when it has none; an unreadable one is a `ConfigError`
    naming it (the model's tokenizer would be unknown)."""
    path = Path(folder) / RECORD
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        if isinstance(record, dict) and isinstance(record.get("digest"), str):
            return record
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    raise ConfigError(f"{path} is not a record of the tokenizer the model was trained with (JSON with a digest): "
                      "restore it, or delete it to take the tokenizer saved in the folder as the model's")


def _listing(folder: Path) -> str:
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    return json.dumps([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files])


@functools.lru_cache(maxsize=32)
def _saved_digest(folder: str, listing: str) -> str:
    return tokenizer_digest(load_tokenizer(folder))


def saved_tokenizer_digest(folder: str | Path) -> str | None:
    """The digest of the tokenizer saved in ``folder`` (read once per version of its files in a process), None
    when it holds none."""
    if not is_tokenizer_dir(folder):
        return None
    return _saved_digest(str(Path(folder).resolve()), _listing(Path(folder)))


@functools.lru_cache(maxsize=4)
def named_tokenizer_digest(name: str) -> str:
    """The digest of a tokenizer loaded by name ('gpt2': GPT-2's BPE, offline too)."""
    return tokenizer_digest(load_tokenizer(name))


def trained_with(folder: Path) -> tuple[str, str] | None:
    """(digest, where it is read from) of the tokenizer the model in ``folder`` was trained with: its record when
    it has one, else the tokenizer saved in the folder; None when neither says."""
    folder = Path(folder)
    record = read_record(folder)
    if record is not None:
        return record["digest"], f"{folder / RECORD}, trained with {record.get('tokenizer', '?')}"
    saved = saved_tokenizer_digest(folder)
    return (saved, f"the tokenizer saved in {folder}") if saved is not None else None


def mismatch(model: str, trained: tuple[str, str], used: tuple[str, str],
             own: str = "data.tokenizer auto or model") -> str | None:
    """Why a run that trains ``model`` (trained with ``trained``: digest, where) on the ids of ``used`` (digest,
    where) is refused, in one line ending with how to ask for the model's ``own`` tokenizer; None when the two are
    one tokenizer."""
    if trained[0] == used[0]:
        return None
    return (f"the run's tokenizer ({used[1]}: {used[0]}) is not the one model {model} was trained with "
            f"({trained[1]}: {trained[0]}): its token ids would mean other tokens to the model; use the model's own "
            f"tokenizer ({own})")


__all__ = ["RECORD", "mismatch", "named_tokenizer_digest", "read_record", "saved_tokenizer_digest",
           "tokenizer_digest", "trained_with", "write_record"]
