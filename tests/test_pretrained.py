"""`study.pretrained`: a gguf file becomes a cached Hugging Face folder with the same logits and tokenizer.

A tiny Llama (2 layers, grouped-query attention) is written to a gguf file the way llama.cpp's converter writes one
(q/k rows permuted for its rotary layout, MLP weights quantised to Q8_0), so the suite never loads the 135 M model.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from study import pretrained  # noqa: E402
from study.pretrained import EMBEDDED_MODELS, cache_key, materialize_gguf, resolve_model  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "e r"]


def _tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    merged = ["Ġt", "he", "Ġthe", "er"]
    return SPECIALS + chars + merged


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's `permute` of q/k rows (HF's rotate-half layout -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, seed: int = 0) -> LlamaForCausalLM:
    """Write a tiny Llama as gguf; return the reference model (its MLP rounded through Q8_0 like the file)."""
    tokens = _tokens()
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    Q8 = gguf.GGMLQuantizationType.Q8_0
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(16)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    writer.add_tensor("token_embd.weight", model.model.embed_tokens.weight.detach().numpy())
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for hf, short in names.items():
                module = layer.get_submodule(hf)
                w = module.weight.detach().clone()
                if short == "attn_q":
                    w = _permute(w, 4)
                elif short == "attn_k":
                    w = _permute(w, 2)
                if short.startswith("ffn_") and short != "ffn_norm":
                    q = gguf.quantize(w.numpy(), Q8)
                    writer.add_tensor(f"blk.{i}.{short}.weight", q, raw_shape=q.shape, raw_dtype=Q8)
                    # The reference carries the same rounding as the file.
                    module.weight.copy_(torch.from_numpy(np.asarray(gguf.dequantize(q, Q8))))
                else:
                    writer.add_tensor(f"blk.{i}.{short}.weight", w.numpy())
    writer.add_tensor("output_norm.weight", model.model.norm.weight.detach().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    path = folder / "tiny.gguf"
    reference = write_tiny_gguf(path)
    built = materialize_gguf(path, folder / "cache")
    return path, reference, built


def test_materialised_folder_reproduces_the_gguf_model(tiny):
    path, reference, built = tiny
    model = AutoModelForCausalLM.from_pretrained(built)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.num_key_value_heads == 2 and not hasattr(model.config, "quantization_config")
    ids = torch.randint(0, reference.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
        got = model.eval()(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # Tied embeddings stay tied after the round trip (the gguf has no output.weight).
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_materialised_tokenizer_is_the_gguf_one(tiny):
    _, _, built = tiny
    tokenizer = AutoTokenizer.from_pretrained(built)
    assert len(tokenizer) == len(_tokens())
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    ids = tokenizer("the ther", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["t", "he", "Ġthe", "r"]


def test_cache_is_reused_and_keyed_by_the_source(tiny, tmp_path):
    path, _, built = tiny
    assert materialize_gguf(path, built.parent) == built
    assert resolve_model(str(path), built.parent) == str(built)
    stamp = (built / "config.json").stat().st_mtime_ns
    assert materialize_gguf(path, built.parent) == built and (built / "config.json").stat().st_mtime_ns == stamp
    # A changed source (here: its modification time) is a new entry.
    copy = tmp_path / "tiny.gguf"
    copy.write_bytes(path.read_bytes())
    key = cache_key(copy)
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 10**9))
    assert cache_key(copy) != key


def _logits(folder, ids):
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits


@pytest.mark.parametrize("damage", ["zeroed weights", "missing config.json", "half-built"])
def test_a_damaged_model_folder_is_rebuilt_not_used(tiny, tmp_path, damage, capsys):
    """Zeroed bytes in the weights trained a changed model without a word; a missing config.json rebuilt the
    folder and then failed with "[Errno 39] Directory not empty" on every try; a half-built folder was used."""
    path, reference, _ = tiny
    built = materialize_gguf(path, tmp_path / "cache")
    weights = built / "model.safetensors"
    if damage == "zeroed weights":
        with open(weights, "r+b") as f:
            f.seek(weights.stat().st_size // 2)
            f.write(b"\0" * 4096)
    elif damage == "missing config.json":
        (built / "config.json").unlink()
    else:  # config.json there, the weights and the checksums not
        weights.unlink()
        (built / "checksums.json").unlink()
    assert materialize_gguf(path, tmp_path / "cache") == built
    assert f"cache {built} is damaged (" in capsys.readouterr().err
    ids = torch.randint(0, reference.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(_logits(built, ids), reference(ids).logits, atol=1e-5, rtol=1e-5)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [built.name]  # nothing left aside


def test_two_concurrent_builds_both_succeed(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, seed=3)
    results, errors = [], []

    def build() -> None:
        try:
            results.append(materialize_gguf(path, tmp_path / "cache"))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    # Only the final folder is left: no temporary folders.
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [results[0].name]


def test_resolve_model_passes_other_names_through_and_names_bad_ones(tmp_path, monkeypatch):
    assert resolve_model("gpt2") == "gpt2"
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        resolve_model(str(tmp_path / "missing.gguf"))
    assert "smollm2-135m" in EMBEDDED_MODELS
    monkeypatch.setitem(pretrained._GGUF_SOURCES, "smollm2-135m", ("no_such_package_xyz", "x.gguf", "pip install x"))
    with pytest.raises(FileNotFoundError, match="pip install x"):
        resolve_model("smollm2-135m", tmp_path)


def test_cache_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "env-cache"))
    assert pretrained.cache_root() == tmp_path / "env-cache"
    monkeypatch.delenv(pretrained.CACHE_ENV)
    assert pretrained.cache_root() == pretrained.DEFAULT_CACHE


@pytest.mark.slow
def test_study_fit_on_a_gguf_uses_its_tokenizer_and_trains(text_files, tmp_path, monkeypatch):
    """`study fit --model.model_name_or_path=<gguf>`: materialised, its own tokenizer linked, trained in train mode."""
    from study.fit import lightning_main
    from tests.test_cli import fit_args

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "models"))
    cli = lightning_main(fit_args(text_files, tmp_path, f"--model.model_name_or_path={path}"))
    assert type(cli.model.model).__name__ == "LlamaForCausalLM"
    assert cli.datamodule.vocab_size == len(_tokens()) == cli.model.hparams.vocab_size
    assert cli.datamodule.tokenizer.eos_token == "<|im_end|>"
    assert cli.trainer.global_step == 2
    assert cli.model.model.training


def test_study_analyze_accepts_a_gguf_and_names_the_output_after_it(tmp_path, monkeypatch):
    """`study analyze --model <short name | gguf>` goes through `resolve_model` (here: a tiny gguf)."""
    import json

    from study.frozen.analysis.command import main

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "models"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("the ther theta " * 200)
    assert main(["--model", str(path), "--text", "text.txt", "--lengths", "16", "--ns", "1", "5",
                 "--temperatures", "0.1", "1", "--mc-samples", "0", "--no-figures"]) == 0
    out = tmp_path / "logs" / "analysis" / str(path).replace("/", "--")
    source = json.loads((out / "results.json").read_text())["source"]
    assert source["model"] == str(path) and source["model_kind"] == "dir"
