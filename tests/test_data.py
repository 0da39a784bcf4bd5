"""TextDataModule: sources, tokenizers, packing, caching and validation of its arguments."""

from pathlib import Path

import pytest
import torch

from study.data import TextDataModule, gpt2_tokenizer, shakespeare_files
from study.errors import ConfigError


def test_local_files_are_packed_into_full_blocks(text_files, tmp_path):
    train, val = text_files
    dm = TextDataModule("files", train_files=[train], val_files=[val], vocab_size=300, block_size=16,
                        batch_size=4, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 16) and batch["input_ids"].dtype == torch.long
    assert int(batch["input_ids"].max()) < dm.vocab_size <= 300
    # Validation blocks, decoded and joined, are the validation text (packing drops only the tail).
    tokens = torch.cat([row["input_ids"] for row in dm.val_data]).tolist()
    text = dm.tokenizer.decode(tokens).replace("<|endoftext|>", "")
    assert Path(val).read_text().replace("\n", "").startswith(text.replace("\n", "")[:200])
    assert len(tokens) == len(dm.val_data) * 16


def test_cache_is_reused_and_keyed_by_block_size(text_files, tmp_path):
    train, val = text_files
    kwargs = dict(train_files=[train], val_files=[val], vocab_size=300, cache_dir=str(tmp_path / "cache"))
    a = TextDataModule("files", block_size=16, **kwargs)
    a.prepare_data()
    stamp = a._blocks_dir().stat().st_mtime_ns
    b = TextDataModule("files", block_size=16, **kwargs)
    b.prepare_data()
    assert b._blocks_dir() == a._blocks_dir() and b._blocks_dir().stat().st_mtime_ns == stamp
    assert TextDataModule("files", block_size=32, **kwargs)._blocks_dir() != a._blocks_dir()


def test_max_blocks_limit_the_splits(text_files, tmp_path):
    train, val = text_files
    dm = TextDataModule("files", train_files=[train], val_files=[val], vocab_size=300, block_size=16,
                        cache_dir=str(tmp_path), max_train_blocks=5, max_val_blocks=2)
    dm.prepare_data()
    dm.setup()
    assert len(dm.train_data) == 5 and len(dm.val_data) == 2


def test_missing_file_is_named_before_anything_runs(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        TextDataModule("files", train_files=[str(tmp_path / "nowhere.txt")], val_files=[str(tmp_path / "v.txt")])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(source="web"), "'web'"),
        (dict(block_size=0), "block_size.*0"),
        (dict(batch_size=2.5), "batch_size.*2.5"),
        (dict(source="hub"), "dataset"),
        (dict(source="files", train_files=["a"]), "val_files"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TextDataModule(**kwargs)


def test_unknown_tokenizer_is_named(text_files, tmp_path):
    train, val = text_files
    dm = TextDataModule("files", train_files=[train], val_files=[val], tokenizer="no-such-tok", cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no-such-tok"):
        _ = dm.vocab_size


def test_offline_gpt2_tokenizer_is_the_real_one():
    tok = gpt2_tokenizer()
    assert len(tok) == 50257 and tok.eos_token_id == 50256
    assert tok("Hello world")["input_ids"] == [15496, 995]


def test_embedded_corpus_is_split_by_whole_works():
    files = shakespeare_files()
    assert len(files["train"]) + len(files["validation"]) == 42 and len(files["validation"]) == 4
    assert not set(files["train"]) & set(files["validation"])
    assert any(f.endswith("hamlet_gut.txt") for f in files["validation"])


def test_auto_tokenizer_is_the_models_own_when_a_model_is_loaded(text_files, tmp_path):
    from transformers import GPT2TokenizerFast

    train, val = text_files
    own = GPT2TokenizerFast(vocab={"a": 0, "b": 1, "<|endoftext|>": 2}, merges=[], eos_token="<|endoftext|>")
    own.save_pretrained(tmp_path / "model")
    files = dict(train_files=[train], val_files=[val], cache_dir=str(tmp_path / "cache"), vocab_size=300)
    scratch = TextDataModule("files", tokenizer="auto", **files)
    loaded = TextDataModule("files", tokenizer="auto", model_name_or_path=str(tmp_path / "model"), **files)
    assert scratch.vocab_size == 300  # corpus-bpe of the requested size
    assert loaded.vocab_size == 3 and loaded.tokenizer.eos_token_id == 2
    # Different tokenizers never share a block cache.
    assert scratch._blocks_dir() != loaded._blocks_dir()
    assert TextDataModule("files", tokenizer="model", model_name_or_path=str(tmp_path / "model"),
                          **files)._blocks_dir() == loaded._blocks_dir()


def test_model_tokenizer_needs_a_model_and_a_tokenizer(text_files, tmp_path):
    train, val = text_files
    with pytest.raises(ValueError, match="tokenizer='model' needs a loaded model"):
        TextDataModule("files", train_files=[train], val_files=[val], tokenizer="model")
    (tmp_path / "bare").mkdir()
    dm = TextDataModule("files", train_files=[train], val_files=[val], tokenizer="auto",
                        model_name_or_path=str(tmp_path / "bare"), cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="bare has no tokenizer files"):
        _ = dm.vocab_size


def test_analyze_finds_the_auto_tokenizer_of_a_scratch_checkpoint(text_files, tmp_path):
    """`data.tokenizer: auto` without a loaded model is corpus-bpe: `study analyze` rebuilds it from its cache."""
    import yaml

    from study.frozen.load import checkpoint_tokenizer

    train, val = text_files
    data = dict(tokenizer="auto", source="files", train_files=[train], val_files=[val], vocab_size=300,
                cache_dir=str(tmp_path / "cache"))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    tok = checkpoint_tokenizer(tmp_path / "run" / "checkpoints" / "last.ckpt", {"model_name_or_path": None})
    assert tok is not None and len(tok) == 300


def test_a_damaged_token_cache_is_rebuilt_not_read(text_files, tmp_path, capsys):
    """Zeroed bytes in the cached arrow file gave all-zero blocks and no error; a half-written cache was read."""
    train, val = text_files
    kwargs = dict(train_files=[train], val_files=[val], vocab_size=300, block_size=16, cache_dir=str(tmp_path))
    dm = TextDataModule("files", **kwargs)
    dm.prepare_data()
    dm.setup()
    expected = torch.stack([row["input_ids"] for row in dm.train_data])
    blocks = dm._blocks_dir()
    (arrow,) = (blocks / "train").glob("*.arrow")
    size = arrow.stat().st_size
    with open(arrow, "r+b") as f:  # the data, not the header: what a bad disk or copy does
        f.seek(size // 4)
        f.write(b"\0" * (size // 2))
    damaged = TextDataModule("files", **kwargs)
    damaged.prepare_data()
    assert f"cache {blocks} is damaged (train/{arrow.name} changed since it was built" in capsys.readouterr().err
    damaged.setup()
    assert torch.equal(torch.stack([row["input_ids"] for row in damaged.train_data]), expected)
    # a tokenizer cache that lost a file is rebuilt the same way
    (tokenizer,) = tmp_path.glob("tokenizer-bpe300-*")
    (tokenizer / "tokenizer.json").unlink()
    again = TextDataModule("files", **kwargs)
    assert again.tokenizer.get_vocab() == dm.tokenizer.get_vocab()
    assert f"cache {tokenizer} is damaged (tokenizer.json is missing)" in capsys.readouterr().err
