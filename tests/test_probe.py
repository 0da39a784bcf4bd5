"""`study probe` on tiny saved Llama / GPT-2 models: values against stock transformers and an exact Hessian, outputs,
and bad input rejected before the model is loaded."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from study import probe
from tests.conftest import tiny_gpt2_config, tiny_llama_config

WORDS = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()


def _tokenizer(text: str):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")


@pytest.fixture
def text_file(tmp_path):
    gen = torch.Generator().manual_seed(0)
    lines = [" ".join(WORDS[i] for i in torch.randint(len(WORDS), (12,), generator=gen)) for _ in range(200)]
    path = tmp_path / "text.txt"
    path.write_text("\n".join(lines))
    return path


def save_tiny(tmp_path, text_file, arch: str, **overrides):
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    tok = _tokenizer(text_file.read_text())
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(copy.deepcopy(tiny_llama_config(vocab_size=len(tok), **overrides)))
    else:
        model = GPT2LMHeadModel(copy.deepcopy(tiny_gpt2_config(vocab_size=len(tok), **overrides)))
    folder = tmp_path / arch
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def args_for(model, text, out, *extra):
    return ["--model", str(model), "--text", str(text), "--out", str(out), "--batches", "3", "--batch-size", "1",
            "--seq-len", "16", "--jacobian-rows", "8", "--hessian-iterations", "3", *extra]  # fmt: skip


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_probe_outputs_and_gradients_match_stock_transformers(tmp_path, text_file, arch, capfd):
    folder = save_tiny(tmp_path, text_file, arch)
    out = tmp_path / "out"
    capfd.readouterr()
    assert probe.main(args_for(folder, text_file, out, "--temperatures", "1", "0.1", "0.01")) == 0
    # Off a terminal: one line per T with the count and the time left; no library notices.
    stdout, stderr = capfd.readouterr()
    lines = [line for line in stderr.splitlines() if line.startswith("[probe] ")]
    assert [line.split(" in ")[0] for line in lines] == ["[probe] T 0.01 (1/3)", "[probe] T 0.1 (2/3)", "[probe] T 1 (3/3)"]
    assert all(line.endswith(" left") for line in lines) and lines[-1].endswith("about 0:00 left")
    assert "Loading weights" not in stdout + stderr and "loss_type" not in stdout + stderr
    report = json.loads((out / "probe.json").read_text())
    results = report["results"]
    assert [r["temperature"] for r in results] == [0.01, 0.1, 1.0]
    assert (out / "probe.png").stat().st_size > 1000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    for r in results:
        assert r["jacobian"]["max"] <= 1 / (2 * r["temperature"]) * (1 + 1e-9)  # exact maximum
        assert len(r["batches"]) == 3 and math.isfinite(r["hessian_qk_norm"]) and math.isfinite(r["hessian_qk_top"])
    # T = 1 is the stock model: loss and W_q/W_k gradients match transformers' own eager attention
    model, tok = probe.load_model(str(folder))
    model.set_attn_implementation("eager")
    batch = probe.make_batches(tok, text_file.read_text(), 3, 1, 16)[0]
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    if arch == "llama":
        sq = sum(p.grad.square().sum() for n, p in model.named_parameters() if n.endswith(("q_proj.weight", "k_proj.weight")))
    else:  # fused c_attn: its q and k column blocks (weight and bias)
        sq = sum(p.grad.chunk(3, dim=-1)[0].square().sum() + p.grad.chunk(3, dim=-1)[1].square().sum()
                 for n, p in model.named_parameters() if ".c_attn." in n)  # fmt: skip
    stock = results[-1]["batches"][0]
    assert math.isclose(stock["loss"], float(loss), rel_tol=1e-5)
    assert math.isclose(stock["grad_attn_qk"], float(sq.sqrt()), rel_tol=1e-4)


def test_hessian_power_iteration_matches_the_exact_restricted_hessian(tmp_path, text_file):
    from torch.func import functional_call, hessian

    from study.attention import AttentionSpec, apply_attention_spec, tapping

    folder = save_tiny(tmp_path, text_file, "llama", hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                       num_hidden_layers=1, intermediate_size=8)  # fmt: skip
    model, tok = probe.load_model(str(folder))
    apply_attention_spec(model, AttentionSpec(temperature=0.3))
    batch = probe.make_batches(tok, text_file.read_text(), 1, 1, 12)[0]
    names = [n for n, _ in model.named_parameters() if n.endswith(("q_proj.weight", "k_proj.weight"))]
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in names]
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])

    def loss_of(x):
        chunks = x.split([s.numel() for s in shapes])
        overrides = {n: c.view(s) for n, c, s in zip(names, chunks, shapes)}
        return functional_call(model, overrides, (batch,), {"labels": batch}).loss

    with tapping(probe.ExplicitPath()):
        exact = torch.linalg.eigvalsh(hessian(loss_of)(flat).double())
        norm, top = probe.hessian_qk(model, batch, 300, torch.Generator().manual_seed(0))
    # the q-k cross terms give a nearly symmetric spectrum: plain power iteration alone would not settle
    assert math.isclose(norm, exact.abs().max().item(), rel_tol=1e-2), (norm, exact[-3:], exact[:3])
    assert math.isclose(top, exact[-1].item(), rel_tol=2e-2), (top, exact[-3:])


def test_bad_input_fails_before_loading_the_model(tmp_path, text_file, monkeypatch, capsys):
    def never(name):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(probe, "load_model", never)
    folder = save_tiny(tmp_path, text_file, "llama")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    for argv, message in (
        (args_for(folder, text_file, tmp_path / "o", "--temperatures", "0.1", "0"), "got [0.0]"),
        (args_for(folder, text_file, tmp_path / "o", "--temperatures", "-1"), "got [-1.0]"),
        (args_for(tmp_path / "nope", text_file, tmp_path / "o"), "nope"),
        (args_for("./missing/model", text_file, tmp_path / "o"), "./missing/model"),
        (args_for("no-such-hub-model", text_file, tmp_path / "o"), "no-such-hub-model"),
        (args_for(folder, empty, tmp_path / "o"), "is empty"),
        (args_for(folder, tmp_path / "none.txt", tmp_path / "o"), "none.txt"),
        (args_for(folder, text_file, tmp_path / "o", "--batches", "0"), "--batches must be >= 1, got 0"),
    ):
        assert probe.main(argv) == 2, argv
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_help_documents_the_verb(capsys):
    from study.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["probe", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "Hessian" in text and "--temperatures" in text and "probe.json" in text


def test_sweep_spec_probe_section(tmp_path):
    from study.sweep.spec import SweepSpecError, build_plan

    plan = build_plan("configs/sweeps/default.yaml", quick=True, save_dir=str(tmp_path))
    assert plan.probe[:4] == ["--model", str(tmp_path / "default-quick" / "pretrain" / "hf"), "--out", str(tmp_path / "default-quick" / "probe")]
    assert "--temperatures" in plan.probe and plan.probe[plan.probe.index("--batches") + 1] == "3"  # quick over main
    spec = tmp_path / "bad.yaml"
    for section, message in (("{temperatures: [0.1, 0]}", "probe.temperatures"), ("{steps: 3}", "unknown key(s) ['steps']"),
                             ("{enabled: true}", "probe.model")):  # fmt: skip
        spec.write_text(f"base: {tmp_path / 'base.yaml'}\ngrid: {{temperature: [1]}}\nprobe: {section}\n")
        (tmp_path / "base.yaml").write_text("model: {}\n")
        with pytest.raises(SweepSpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            build_plan(spec)


def test_every_temperature_measures_the_same_rows(tmp_path, text_file):
    """The row sample and the power iteration restart from the seed at every T: two temperatures that differ by
    1e-9 give the same Jacobian statistics and Hessian (a new sample per T gave different rows)."""
    folder = save_tiny(tmp_path, text_file, "gpt2")
    out = tmp_path / "out"
    assert probe.main(args_for(folder, text_file, out, "--temperatures", "1", "1.000000001", "--quiet")) == 0
    first, second = json.loads((out / "probe.json").read_text())["results"]
    for key in ("p10", "p50", "p90", "max"):
        assert second["jacobian"][key] == pytest.approx(first["jacobian"][key], rel=1e-6), key
    assert second["hessian_qk_top"] == pytest.approx(first["hessian_qk_top"], rel=1e-4)
