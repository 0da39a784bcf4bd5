"""A model trains on the ids of the tokenizer it was trained with (issue 52, N7): the tokenizer's digest, the record a
saved model carries, and the refusal of a run whose tokenizer is another one, before anything is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from study.cachefolder import build_atomically
from study.cli import main as study
from study.corpus import load_tokenizer
from study.data import TextDataModule
from study.errors import BadValue, ConfigError
from study.fit import check_fit_args, preflight
from study.trained_tokenizer import RECORD, tokenizer_digest, trained_with, write_record
from tests.conftest import tiny_gpt2_config
from tests.test_bad_values import DEFAULT, refused


def corpus_bpe(text_files, cache: Path, vocab_size: int) -> TextDataModule:
    train, val = text_files
    return TextDataModule("files", train_files=[train], val_files=[val], tokenizer="corpus-bpe",
                          vocab_size=vocab_size, cache_dir=str(cache))


def saved_model(folder: Path, data: TextDataModule, record: bool = True) -> Path:
    """A tiny GPT-2 saved with the tokenizer it trains with, as a sweep's pretraining saves `pretrain/hf` (with its
    record, built atomically with checksums); ``record=False``: a plain Hugging Face folder."""
    from transformers import GPT2LMHeadModel

    def save(tmp: Path) -> None:
        vocab = len(data.tokenizer)
        GPT2LMHeadModel(tiny_gpt2_config(vocab_size=vocab, n_positions=128, bos_token_id=vocab - 1,
                                         eos_token_id=vocab - 1)).save_pretrained(tmp)
        data.tokenizer.save_pretrained(tmp)
        if record:
            write_record(tmp, data.tokenizer, data.tokenizer_origin())

    build_atomically(save, folder)
    return folder


def config(model: Path, text_files, cache: Path, **data) -> dict:
    train, val = text_files
    return {"model": {"model_name_or_path": str(model)}, "trainer": {},
            "data": {"source": "files", "train_files": [train], "val_files": [val], "block_size": 32, "batch_size": 2,
                     "cache_dir": str(cache), "model_name_or_path": str(model), **data}}


def test_the_digest_is_what_the_ids_mean_not_the_files_or_the_size(text_files, tmp_path):
    trained = corpus_bpe(text_files, tmp_path / "cache", 300)
    digest = tokenizer_digest(trained.tokenizer)
    assert digest.startswith("vocabulary ") and len(digest) == len("vocabulary ") + 16
    trained.tokenizer.save_pretrained(tmp_path / "copy")  # another file layout of the same tokenizer
    assert tokenizer_digest(load_tokenizer(str(tmp_path / "copy"))) == digest
    smaller = corpus_bpe(text_files, tmp_path / "cache", 280)
    assert tokenizer_digest(smaller.tokenizer) != digest
    # the same size on other text: the vocabulary size alone does not show it
    words = Path(text_files[0]).read_text().split()
    other = tmp_path / "other.txt"
    other.write_text(" ".join(w[::-1] for w in words))
    reversed_bpe = corpus_bpe([str(other), text_files[1]], tmp_path / "cache", 300)
    assert len(reversed_bpe.tokenizer) == len(trained.tokenizer) == 300
    assert tokenizer_digest(reversed_bpe.tokenizer) != digest


def test_the_record_names_the_tokenizer_the_model_trained_with(text_files, tmp_path):
    data = corpus_bpe(text_files, tmp_path / "cache", 300)
    hf = saved_model(tmp_path / "hf", data)
    record = json.loads((hf / RECORD).read_text())
    assert record == {"digest": tokenizer_digest(data.tokenizer), "tokenizer": str(data._bpe_folder())}
    assert RECORD in json.loads((hf / "checksums.json").read_text())["files"]  # covered by the folder's checksums
    assert trained_with(hf) == (record["digest"], f"{hf / RECORD}, trained with {data._bpe_folder()}")
    plain = saved_model(tmp_path / "plain", data, record=False)
    assert trained_with(plain) == (record["digest"], f"the tokenizer saved in {plain}")
    (hf / RECORD).write_text("{not json")
    with pytest.raises(ConfigError, match=f"{hf / RECORD} is not a record of the tokenizer"):
        trained_with(hf)


def test_a_model_fine_tuned_with_another_corpus_bpe_is_refused_naming_both(text_files, tmp_path):
    """The issue's case: a model trained with one corpus BPE, a run that would feed it the ids of another."""
    cache = tmp_path / "cache"
    trained = corpus_bpe(text_files, cache, 300)
    hf = saved_model(tmp_path / "pretrain" / "hf", trained)
    other = corpus_bpe(text_files, cache, 280)
    with pytest.raises(BadValue) as info:
        preflight(config(hf, text_files, cache, tokenizer="corpus-bpe", vocab_size=280))
    assert str(info.value) == (
        f"data.tokenizer = 'corpus-bpe': the run's tokenizer (the corpus BPE {other._bpe_folder()}: "
        f"{tokenizer_digest(other.tokenizer)}) is not the one model {hf} was trained with ({hf / RECORD}, trained "
        f"with {trained._bpe_folder()}: {tokenizer_digest(trained.tokenizer)}): its token ids would mean other "
        "tokens to the model; use the model's own tokenizer (data.tokenizer auto or model)")
    # a tokenizer folder, and GPT-2's BPE, are other tokenizers too
    with pytest.raises(BadValue, match=f"the run's tokenizer \\(the tokenizer saved in {other._bpe_folder()}: "):
        preflight(config(hf, text_files, cache, tokenizer=str(other._bpe_folder())))
    with pytest.raises(BadValue, match="the run's tokenizer \\(gpt2, GPT-2's BPE: vocabulary "):
        preflight(config(hf, text_files, cache, tokenizer="gpt2"))


def test_the_tokenizer_the_model_trained_with_passes_by_any_name(text_files, tmp_path):
    cache = tmp_path / "cache"
    trained = corpus_bpe(text_files, cache, 300)
    hf = saved_model(tmp_path / "pretrain" / "hf", trained)
    for tokenizer in ("auto", "model", str(trained._bpe_folder())):
        preflight(config(hf, text_files, cache, tokenizer=tokenizer))
    preflight(config(hf, text_files, cache, tokenizer="corpus-bpe", vocab_size=300))  # rebuilt: the same content
    # the folder's own tokenizer swapped for another one under the record: refused too
    other = corpus_bpe(text_files, cache, 280)
    other.tokenizer.save_pretrained(hf)
    with pytest.raises(BadValue, match=f"the run's tokenizer \\(the tokenizer saved in {hf}: "):
        preflight(config(hf, text_files, cache, tokenizer="auto"))


def test_a_folder_without_a_record_trained_with_the_tokenizer_it_holds(text_files, tmp_path):
    cache = tmp_path / "cache"
    plain = saved_model(tmp_path / "plain", corpus_bpe(text_files, cache, 300), record=False)
    preflight(config(plain, text_files, cache, tokenizer="auto"))
    with pytest.raises(BadValue, match=f"was trained with \\(the tokenizer saved in {plain}: vocabulary "):
        preflight(config(plain, text_files, cache, tokenizer="corpus-bpe", vocab_size=280))
    # a folder holding no tokenizer says nothing about it: nothing to compare
    weights_only = tmp_path / "weights"
    from transformers import GPT2LMHeadModel

    GPT2LMHeadModel(tiny_gpt2_config(vocab_size=300, n_positions=128)).save_pretrained(weights_only)
    preflight(config(weights_only, text_files, cache, tokenizer="corpus-bpe", vocab_size=280))


def test_a_models_own_tokenizer_without_a_record_is_not_read(monkeypatch):
    """The main job (SmolLM2, data.tokenizer auto) pays nothing: no tokenizer is loaded by the check."""
    from study import trained_tokenizer

    def read(tokenizer):
        raise AssertionError("a tokenizer was read")

    monkeypatch.setattr(trained_tokenizer, "tokenizer_digest", read)
    assert check_fit_args(["--config", str(DEFAULT.parent / "smollm2.yaml")]) is None


def test_a_hub_gpt2_trained_with_gpt2s_bpe(text_files, tmp_path):
    assert check_fit_args(["--config", str(DEFAULT.parent / "gpt2-wikitext.yaml")]) is None
    problem = check_fit_args(["--config", str(DEFAULT.parent / "gpt2-wikitext.yaml"), "--data.tokenizer=corpus-bpe",
                              "--data.source=files", f"--data.train_files=[{text_files[0]}]",
                              f"--data.val_files=[{text_files[1]}]", "--data.vocab_size=300",
                              f"--data.cache_dir={tmp_path / 'cache'}"])
    assert problem is not None and "GPT-2's BPE, the tokenizer of hub model gpt2" in problem, problem


def test_study_fit_exits_2_before_building(text_files, tmp_path, capsys, monkeypatch):
    from lightning.pytorch.cli import LightningCLI

    built = []
    monkeypatch.setattr(LightningCLI, "instantiate_classes", lambda self: built.append(True))
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    hf = saved_model(tmp_path / "pretrain" / "hf", corpus_bpe(text_files, cache, 300))
    train, val = text_files
    args = ["fit", "--config", str(DEFAULT), "--trainer.logger.init_args.save_dir=logs",
            f"--model.model_name_or_path={hf}", "--data.source=files", f"--data.train_files=[{train}]",
            f"--data.val_files=[{val}]", "--data.block_size=32", f"--data.cache_dir={cache}"]
    capsys.readouterr()  # the test's own building above
    err = refused(capsys, study([*args, "--data.tokenizer=corpus-bpe", "--data.vocab_size=280"]),
                  "study fit: data.tokenizer = 'corpus-bpe': the run's tokenizer", f"{hf / RECORD}")
    assert err.count("vocabulary ") == 2
    assert built == [] and not (tmp_path / "logs").exists()
    assert check_fit_args([*args[1:], "--data.tokenizer=auto"]) is None


def test_probe_and_analyze_refuse_another_tokenizer_on_a_model_folder(text_files, tmp_path):
    from study.frozen.load import load_frozen

    cache = tmp_path / "cache"
    trained = corpus_bpe(text_files, cache, 300)
    hf = saved_model(tmp_path / "hf", trained)
    other = corpus_bpe(text_files, cache, 280)
    other.tokenizer  # noqa: B018 - built into its cache folder
    with pytest.raises(ConfigError) as info:
        load_frozen(str(hf), tokenizer=str(other._bpe_folder()))
    assert str(info.value) == (
        f"--tokenizer {other._bpe_folder()}: the run's tokenizer (the tokenizer saved in {other._bpe_folder()}: "
        f"{tokenizer_digest(other.tokenizer)}) is not the one model {hf} was trained with ({hf / RECORD}, trained "
        f"with {trained._bpe_folder()}: {tokenizer_digest(trained.tokenizer)}): its token ids would mean other "
        "tokens to the model; use the model's own tokenizer (no --tokenizer)")
    assert len(load_frozen(str(hf), tokenizer=str(trained._bpe_folder())).tokenizer) == 300  # the same one: loads


@pytest.mark.slow  # a sweep that pretrains and fine-tunes: 10-30 s on 2 cores
def test_a_sweeps_pretrained_model_records_its_bpe_and_a_run_with_another_is_refused(text_files, tmp_path):
    """The issue's case end to end: a sweep pretrains on a corpus BPE and records it in pretrain/hf; its fine-tuning
    run (the model's own tokenizer) trains; the same run on a corpus BPE of another size is refused by the preflight
    every run passes, naming both digests."""
    from study.sweep import main
    from study.sweep.config import build_plan
    from tests.test_sweep import TINY, status, write_spec

    train, val = text_files
    data = {"data.source": "files", "data.train_files": [train], "data.val_files": [val],
            "data.cache_dir": str(tmp_path / "cache"), "data.block_size": 32}
    steps = {"trainer.max_steps": 2, "trainer.val_check_interval": 2, "model.warmup_steps": 1}
    spec = write_spec(tmp_path, {"temperature": [1.0]}, {**steps, **data},
                      pretrain={"overrides": {**TINY, **steps, **data, "data.vocab_size": 300}})
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    sweep = tmp_path / "logs" / "tiny"
    hf = sweep / "pretrain" / "hf"
    record = json.loads((hf / RECORD).read_text())
    assert record["tokenizer"].startswith(str(tmp_path / "cache" / "tokenizer-bpe300-"))
    assert record["digest"] == tokenizer_digest(load_tokenizer(str(hf))) == tokenizer_digest(
        load_tokenizer(record["tokenizer"]))
    assert status(sweep / "T1_kall_softmax_s0")["state"] == "finished"
    run = build_plan(spec).runs[0]
    problem = check_fit_args([*run.args, "--data.tokenizer=corpus-bpe", "--data.vocab_size=280"])
    assert problem is not None and problem.startswith("data.tokenizer = 'corpus-bpe': the run's tokenizer (the "
                                                      "corpus BPE "), problem
    assert f"was trained with ({hf / RECORD}, trained with {record['tokenizer']}: {record['digest']})" in problem
