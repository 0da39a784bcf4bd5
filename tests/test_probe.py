"""`study probe` on tiny saved Llama / GPT-2 models: values against stock transformers and an exact Hessian, outputs,
and bad input rejected before the model is loaded."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from study.frozen import probe
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
    return ["--model", str(model), "--text", str(text), "--out", str(out), "--windows", "3", "--seq-len", "16",
            "--jacobian-rows", "8", "--hessian-iterations", "3", "--fp64-windows", "1", *extra]  # fmt: skip


def windows_of(tok, text_file, count=3, seq_len=16):
    from study.frozen.text import documents
    from study.frozen.windows import text_windows

    return text_windows(tok, documents(str(text_file)), count, seq_len).ids


def qk_grad_norm(model, arch: str, layers=None) -> float:
    from study.metrics import block_index

    def wanted(name):
        return layers is None or block_index(name) in layers

    if arch == "llama":
        sq = sum(p.grad.double().square().sum() for n, p in model.named_parameters()
                 if n.endswith(("q_proj.weight", "k_proj.weight")) and wanted(n) and p.grad is not None)  # fmt: skip
    else:  # fused c_attn: its q and k column blocks (weight and bias)
        sq = sum(p.grad.double().chunk(3, dim=-1)[0].square().sum() + p.grad.double().chunk(3, dim=-1)[1].square().sum()
                 for n, p in model.named_parameters() if ".c_attn." in n and wanted(n) and p.grad is not None)  # fmt: skip
    return float(sq.sqrt())


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_probe_outputs_and_gradients_match_stock_transformers(tmp_path, text_file, arch, capfd):
    folder = save_tiny(tmp_path, text_file, arch)
    out = tmp_path / "out"
    capfd.readouterr()
    assert probe.main(args_for(folder, text_file, out, "--temperatures", "1", "0.1", "0.01", "--single-layers", "1")) == 0
    # Off a terminal: one line per step with the count and the time left; no library notices.
    stdout, stderr = capfd.readouterr()
    lines = [line for line in stderr.splitlines() if line.startswith("[probe] ")]
    assert [line.split(" in ")[0] for line in lines] == [
        "[probe] T 0.01 (every layer) (1/7)", "[probe] T 0.1 (every layer) (2/7)", "[probe] T 1 (every layer) (3/7)",
        "[probe] T 0.01 (layer 1 alone) (4/7)", "[probe] T 0.1 (layer 1 alone) (5/7)", "[probe] T 1 (layer 1 alone) (6/7)",
        "[probe] T 0.01 (fp64 reference) (7/7)"]  # fmt: skip
    assert all(line.endswith(" left") for line in lines) and lines[-1].endswith("about 0:00 left")
    assert "Loading weights" not in stdout + stderr and "loss_type" not in stdout + stderr
    report = json.loads((out / "probe.json").read_text())
    results = report["results"]
    assert [r["temperature"] for r in results] == [0.01, 0.1, 1.0]
    assert (out / "probe.png").stat().st_size > 1000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    for r in results:
        assert r["jacobian"]["max"] <= 1 / (2 * r["temperature"]) * (1 + 1e-6)  # exact maximum (fp32 rows)
        assert r["jacobian"]["entry_max_times_4T"] <= 1 + 1e-6  # Corollary 3 entrywise, by mathematics
        assert len(r["windows"]) == 3 and math.isfinite(r["hessian_qk_norm"]) and math.isfinite(r["hessian_qk_top"])
        # the per-layer W_q/W_k norms add up (in squares) to the whole model's
        per_window = [math.hypot(*(layer[w] for layer in r["layers"]["attn_qk"])) for w in range(3)]
        assert per_window == pytest.approx([w["grad_attn_qk"] for w in r["windows"]], rel=1e-5)
    # T = 1 is the stock model: loss and W_q/W_k gradients match transformers' own eager attention, per window
    model, tok = probe.load_model(str(folder))
    model.set_attn_implementation("eager")
    batch = windows_of(tok, text_file)[0][None]
    embeds = model.get_input_embeddings()(batch).detach().requires_grad_()
    loss = model(inputs_embeds=embeds, labels=batch).loss
    loss.backward()
    stock = results[-1]["windows"][0]
    assert math.isclose(stock["loss"], float(loss), rel_tol=1e-5)
    assert math.isclose(stock["grad_attn_qk"], qk_grad_norm(model, arch), rel_tol=1e-4)
    # the residual stream entering layer 0 is the embeddings' output
    assert math.isclose(results[-1]["layers"]["residual"][0][0], float(embeds.grad.norm()), rel_tol=1e-4)
    # at T = 1 "layer 1 alone" is the stock model too: its own W_q/W_k norm is the all-layer run's layer 1
    (single,) = report["single_layer"]
    assert single["layer"] == 1
    assert single["results"][-1]["windows"][0]["grad_attn_qk"] == pytest.approx(results[-1]["layers"]["attn_qk"][1][0], rel=1e-4)
    # the fp64 reference ran at the grid's T <= 0.01 on one window, and agrees with fp32 on this small model
    assert report["fp64_temperatures"] == [0.01]
    assert results[0]["fp64"]["grad_attn_qk"][0] == pytest.approx(results[0]["windows"][0]["grad_attn_qk"], rel=1e-3)
    assert "fp64" not in results[1]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_single_layer_gradient_is_that_layers_own_with_t_lowered_there_only(tmp_path, text_file, arch):
    """Brute force: T lowered in layer 0 only (`AttentionSpec.layers`), a full backward, that layer's W_q/W_k
    gradient; the probe's single-layer number (backward stopped at that layer) is the same, in fp32 and fp64."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping
    from study.frozen.probe import measure
    from study.frozen.probe.jacobian import ExplicitPath

    folder = save_tiny(tmp_path, text_file, arch)
    model, tok = probe.load_model(str(folder))
    windows = windows_of(tok, text_file, count=2)
    result = measure.single_layer(model, windows, 0.05, 0, rows=4, seed=0)
    apply_attention_spec(model, AttentionSpec(temperature=0.05, layers=(0,)))
    for index, window in enumerate(windows):
        model.zero_grad(set_to_none=True)
        with tapping(ExplicitPath()):
            model(input_ids=window[None], labels=window[None]).loss.backward()
        assert result["windows"][index]["grad_attn_qk"] == pytest.approx(qk_grad_norm(model, arch, layers=(0,)), rel=1e-4)
    assert all(p.requires_grad for p in model.parameters())  # restored after the single-layer backward
    model.double()
    reference = measure.qk_gradient(model, windows, 0.05, 0)
    assert reference == pytest.approx([w["grad_attn_qk"] for w in result["windows"]], rel=1e-4)
    assert all(p.dtype == torch.float64 for p in model.parameters())


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batched_windows_give_each_windows_own_gradients(tmp_path, text_file, arch):
    """Brute force: one backward per window (batch size 1) with every weight's gradient formed; the probe's batched
    per-window norms (ghost norms, the residual stream, the token embedding tied with the LM head) are the same."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping
    from study.frozen.probe import measure
    from study.frozen.probe.jacobian import ExplicitPath
    from study.metrics import block_index, fused_qkv_split, parameter_kind

    folder = save_tiny(tmp_path, text_file, arch)
    model, tok = probe.load_model(str(folder))
    windows = windows_of(tok, text_file, count=3)
    result = measure.all_layers(model, windows, 0.2, rows=4, seed=0)
    apply_attention_spec(model, AttentionSpec(temperature=0.2))
    embed = model.get_input_embeddings()
    for w, window in enumerate(windows):
        model.zero_grad(set_to_none=True)
        inputs = {}

        def keep(module, args, kwargs, inputs=inputs):
            hidden = args[0] if args else kwargs["hidden_states"]
            hidden.retain_grad()
            inputs["hidden"] = hidden

        block = model.get_submodule("model.layers.0" if arch == "llama" else "transformer.h.0")
        handle = block.register_forward_pre_hook(keep, with_kwargs=True)
        with tapping(ExplicitPath()):
            loss = model(input_ids=window[None], labels=window[None]).loss
        loss.backward()
        handle.remove()
        squares = {}
        for name, p in model.named_parameters():
            kind, layer = parameter_kind(name), block_index(name)
            parts = dict(zip(("attn_q", "attn_k", "attn_v"), fused_qkv_split(name, p.grad))) if kind == "attn_qkv" else {kind: p.grad}
            for part, grad in parts.items():
                key = {"attn_q": "attn_qk", "attn_k": "attn_qk"}.get(part, part)
                squares[(key, layer)] = squares.get((key, layer), 0.0) + float(grad.double().square().sum())
        assert result["windows"][w]["loss"] == pytest.approx(float(loss), rel=1e-5)
        for key in ("attn_qk", "attn_v", "attn_out", "mlp"):
            for layer in range(2):
                assert result["layers"][key][layer][w] == pytest.approx(math.sqrt(squares[(key, layer)]), rel=1e-4), (key, layer)
        assert result["layers"]["residual"][0][w] == pytest.approx(float(inputs["hidden"].grad.norm()), rel=1e-4)
        assert result["windows"][w]["grad_embedding"] == pytest.approx(float(embed.weight.grad.norm()), rel=1e-4)


@pytest.mark.slow
def test_hessian_power_iteration_matches_the_exact_restricted_hessian_at_low_t(tmp_path, text_file):
    from torch.func import functional_call, hessian

    from study.attention import AttentionSpec, apply_attention_spec, tapping
    from study.frozen.probe.gradients import qk_masks
    from study.frozen.probe.hessian import hessian_qk
    from study.frozen.probe.jacobian import ExplicitPath

    folder = save_tiny(tmp_path, text_file, "llama", hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                       num_hidden_layers=1, intermediate_size=8)  # fmt: skip
    model, tok = probe.load_model(str(folder))
    batch = windows_of(tok, text_file, count=1, seq_len=12)
    names = [n for n, _ in model.named_parameters() if n.endswith(("q_proj.weight", "k_proj.weight"))]
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in names]
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])

    def loss_of(x):
        chunks = x.split([s.numel() for s in shapes])
        overrides = {n: c.view(s) for n, c, s in zip(names, chunks, shapes)}
        return functional_call(model, overrides, (batch,), {"labels": batch}).loss

    for temperature in (0.3, 0.01):
        apply_attention_spec(model, AttentionSpec(temperature=temperature))
        with tapping(ExplicitPath()):
            exact = torch.linalg.eigvalsh(hessian(loss_of)(flat).double())
            norm, top = hessian_qk(model, batch, qk_masks(model), 300, torch.Generator().manual_seed(0))
        # the q-k cross terms give a nearly symmetric spectrum: plain power iteration alone would not settle
        assert math.isclose(norm, exact.abs().max().item(), rel_tol=1e-2), (temperature, norm, exact[-3:], exact[:3])
        assert math.isclose(top, exact[-1].item(), rel_tol=2e-2), (temperature, top, exact[-3:])


def test_power_iteration_does_not_overflow_float32():
    """At T = 0.01 the W_q/W_k Hessian of a 135 M model has entries near 1e19: their squares overflow float32, and a
    plain sqrt(sum h^2) normalisation read the Hessian as 0.0. Here a float32 operator with eigenvalues +-1e21."""
    from study.frozen.probe.hessian import power_iteration, safe_norm

    gen = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(64, 64, generator=gen, dtype=torch.float64))
    eigen = torch.linspace(-1.0, 0.9, 64, dtype=torch.float64) * 1e21
    matrix = (basis * eigen) @ basis.T

    def hvp(v):
        return [(matrix @ v[0].double()).float()]

    start = [torch.randn(64, generator=gen)]
    _, norm = power_iteration(hvp, start, 200)
    assert norm == pytest.approx(1e21, rel=1e-3)
    _, shifted = power_iteration(hvp, start, 400, shift=norm)
    assert shifted - norm == pytest.approx(0.9e21, rel=2e-2)
    assert safe_norm([torch.full((4,), 1e30)]) == pytest.approx(2e30)  # float32 squares would be inf
    assert safe_norm([torch.zeros(3)]) == 0.0


def test_bad_input_fails_before_loading_the_model(tmp_path, text_file, monkeypatch, capsys):
    from study.frozen.probe import command

    def never(name):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(command, "load_model", never)
    folder = save_tiny(tmp_path, text_file, "llama")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    for argv, message in (
        (args_for(folder, text_file, tmp_path / "o", "--temperatures", "0.1", "0"), "got [0.0]"),
        (args_for(folder, text_file, tmp_path / "o", "--temperatures", "-1"), "got [-1.0]"),
        (args_for(tmp_path / "nope", text_file, tmp_path / "o"), "nope"),
        (args_for("./missing/model", text_file, tmp_path / "o"), "./missing/model"),
        (args_for("no-such-hub-model", text_file, tmp_path / "o"), "no-such-hub-model"),
        (args_for(folder, empty, tmp_path / "o"), "empty text"),
        (args_for(folder, binary, tmp_path / "o"), "is not text"),
        (args_for(folder, tmp_path / "none.txt", tmp_path / "o"), "none.txt"),
        (args_for(folder, text_file, tmp_path / "o", "--windows", "0"), "--windows must be >= 1, got 0"),
        (args_for(folder, text_file, tmp_path / "o", "--batch-size", "2"), "--batch-size must be 1"),
        (args_for(folder, text_file, tmp_path / "o", "--seq-len", "100000"),
         f"--seq-len 100000 is longer than the context length of {folder} (64 tokens)"),
        (args_for(folder, text_file, tmp_path / "o", "--temperatures", "1", "--fp64-temperatures", "0.1"),
         "--fp64-temperatures [0.1] not in --temperatures [1.0]"),
    ):
        assert probe.main(argv) == 2, argv
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_layer_the_model_does_not_have_and_too_little_text_are_named(tmp_path, text_file, capsys):
    folder = save_tiny(tmp_path, text_file, "llama")
    assert probe.main(args_for(folder, text_file, tmp_path / "o", "--single-layers", "7")) == 2
    assert "--single-layers [7]: the model has layers 0..1" in capsys.readouterr().err
    assert probe.main(args_for(folder, text_file, tmp_path / "o", "--windows", "500", "--seq-len", "60")) == 2
    err = capsys.readouterr().err
    assert "500 windows of L=60 tokens need 30000 tokens; the text has room for" in err


def test_help_documents_the_verb(capsys):
    from study.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["probe", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "Hessian" in text and "--temperatures" in text and "probe.json" in text


def test_sweep_spec_probe_section(tmp_path):
    from study.sweep.config import SweepConfigError, build_plan

    plan = build_plan("configs/sweeps/default.yaml", quick=True, save_dir=str(tmp_path))
    assert plan.probe[:4] == ["--model", str(tmp_path / "default-quick" / "pretrain" / "hf"), "--out", str(tmp_path / "default-quick" / "probe")]
    assert "--temperatures" in plan.probe and plan.probe[plan.probe.index("--windows") + 1] == "20"  # quick over main
    spec = tmp_path / "bad.yaml"
    for section, message in (("{temperatures: [0.1, 0]}", "probe.temperatures"), ("{steps: 3}", "unknown key(s) ['steps']"),
                             ("{enabled: true}", "probe.model")):  # fmt: skip
        spec.write_text(f"base: {tmp_path / 'base.yaml'}\ngrid: {{temperature: [1]}}\nprobe: {section}\n")
        (tmp_path / "base.yaml").write_text("model: {}\n")
        with pytest.raises(SweepConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            build_plan(spec)


def test_every_temperature_measures_the_same_rows(tmp_path, text_file):
    """The row sample and the power iteration restart from the seed at every T: two temperatures that differ by
    1e-9 give the same Jacobian statistics and Hessian (a new sample per T gave different rows)."""
    folder = save_tiny(tmp_path, text_file, "gpt2")
    out = tmp_path / "out"
    assert probe.main(args_for(folder, text_file, out, "--temperatures", "1", "1.000000001", "--quiet", "--single-layers")) == 0
    first, second = json.loads((out / "probe.json").read_text())["results"]
    for key in ("p10", "p50", "p90", "max"):
        assert second["jacobian"][key] == pytest.approx(first["jacobian"][key], rel=1e-6), key
    assert second["hessian_qk_top"] == pytest.approx(first["hessian_qk_top"], rel=1e-4)


def _live_tensors() -> tuple[int, int]:
    """(count, bytes) of the tensors Python can reach, storage counted once: what a probe loop keeps alive (a cycle
    through autograd's hooks is invisible to the garbage collector, so `gc.collect()` first does not hide it)."""
    import gc
    import warnings

    gc.collect()
    count, storages = 0, {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for tensor in tensors:
        count += 1
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return count, sum(storages.values())


def test_the_window_collector_lets_every_hooked_tensor_go(tiny_causal_lm):
    """The fast form of the check below: once a batch's backward is done (or the forward failed), no tensor the
    collector hooked is alive any more, though the collector itself (its norms) still is."""
    import gc
    import weakref

    from study.attention import tapping
    from study.frozen.probe.ghost_norms import window_gradients, window_losses
    from study.frozen.probe.jacobian import ExplicitPath
    from study.frozen.probe.measure import num_layers

    batch = torch.randint(60, (2, 12), generator=torch.Generator().manual_seed(0))
    layers = num_layers(tiny_causal_lm)
    with tapping(ExplicitPath()), window_gradients(tiny_causal_lm, batch, layers) as found:
        loss, _ = window_losses(tiny_causal_lm, batch)
        hooked = [weakref.ref(t) for t in found.outputs]
        found.backward(loss)
    del loss
    gc.collect()
    assert len(hooked) >= 4 * layers and not [ref for ref in hooked if ref() is not None]
    assert float(found.squares["attn_qk"][0].sum()) > 0
    with pytest.raises(RuntimeError, match="forward failed"), window_gradients(tiny_causal_lm, batch, layers) as found:
        window_losses(tiny_causal_lm, batch)
        hooked = [weakref.ref(t) for t in found.outputs]
        raise RuntimeError("forward failed")
    gc.collect()
    assert hooked and not [ref for ref in hooked if ref() is not None]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_probe_loop_keeps_no_tensor_alive_across_temperatures(tmp_path, text_file, arch):
    """The per-T loop of `study probe` (every layer, one layer alone, the Hessian): after the first T, further
    temperatures leave no more tensors alive than it did. The collector's gradient hooks point back at it, so
    tensors it kept past its backward would pile up, one forward's activations per T."""
    from study.frozen.probe import measure

    folder = save_tiny(tmp_path, text_file, arch)
    model, tok = probe.load_model(str(folder))
    windows = windows_of(tok, text_file, count=2)

    def one_temperature(t: float) -> None:
        measure.all_layers(model, windows, t, rows=4, seed=0)
        measure.hessian(model, windows[0], t, iterations=2, seed=0)
        measure.single_layer(model, windows, t, 0, rows=4, seed=0)

    one_temperature(1.0)  # the first T builds what every T shares (the attention spec, cached buffers)
    before = _live_tensors()
    for t in (0.5, 0.2):
        one_temperature(t)
    after = _live_tensors()
    assert after == before, f"live tensors (count, bytes) grew from {before} to {after} over two temperatures"


def test_the_estimate_scales_each_kind_of_step_to_the_probes_counts_and_writes_nothing(tmp_path, text_file,
                                                                                     monkeypatch, capsys):
    """`--estimate` with a planted cost per call (the model is real, the clock is not): every part is the closed
    form of the probe's counts, the single-layer cost interpolated between the shallowest and deepest layer."""
    from study.frozen.probe import command

    def planted(call, model, windows, temperature, *rest):
        name, n = call.__name__, len(windows) if windows.ndim == 2 else 1
        if name == "all_layers":
            return 1.0 * n
        if name == "single_layer":  # (layer, rows, seed): cheaper with depth
            return (4.0 - rest[0]) * n
        if name == "hessian":  # (iterations, seed)
            return 0.25 * rest[0]
        assert name == "qk_gradient" and n == 1  # (layer,): None is every layer
        return 0.5 if rest[0] is None else 0.1 * (3 - rest[0])

    monkeypatch.setattr(command, "_seconds", planted)
    folder = save_tiny(tmp_path, text_file, "llama", num_hidden_layers=3)
    grid = ["--temperatures", "0.001", "0.01", "0.1", "1"]
    argv = args_for(folder, text_file, tmp_path / "o", *grid, "--windows", "5", "--single-layers", "0", "1", "2",
                    "--hessian-iterations", "6", "--hessian-temperatures", "0.01", "0.1",
                    "--fp64-windows", "2", "--fp64-temperatures", "0.001", "0.01")  # fmt: skip
    assert probe.main([*argv, "--estimate"]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    parts = found["parts"]
    assert parts["every layer"] == pytest.approx(4 * 5 * 1.0)  # 4 T x 5 windows x 1 s a window
    # timed at 2 iterations (0.5 s), scaled to 6: 1.5 s at each of 2 T, the fp64 reference's 0.01 once more
    assert parts["hessian"] == pytest.approx(2 * 1.5)
    assert parts["single layers"] == pytest.approx(4 * 5 * (4.0 + 3.0 + 2.0))  # layer 1 interpolated
    assert parts["fp64 reference"] == pytest.approx(2 * 2 * (0.5 + 0.3 + 0.2 + 0.1) + 1 * 1.5)
    assert found["seconds"] == pytest.approx(sum(parts.values())) and found["timed_s"] > 0
    assert not (tmp_path / "o").exists()
    # nothing of what the options leave out
    assert probe.main([*args_for(folder, text_file, tmp_path / "o", "--single-layers", "--hessian-iterations", "0",
                                 "--fp64-windows", "0"), "--estimate"]) == 0  # fmt: skip
    assert set(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["parts"]) == {"load", "every layer"}


# ---- a rerun into the same --out replaces the outputs whole (issue 52, N12) ----------------------------------------
@pytest.mark.slow
def test_a_rerun_with_another_grid_replaces_the_event_file_and_says_so(tmp_path, text_file, capsys):
    """Before: a second event file beside the first, TensorBoard's step 0 both T 0.1 (old) and T 1 (new)."""
    from study.report.read import read_scalars
    from study.tags import probe as probe_tag

    folder, out = save_tiny(tmp_path, text_file, "gpt2"), tmp_path / "out"
    assert probe.main(args_for(folder, text_file, out, "--temperatures", "0.1", "--quiet")) == 0
    assert read_scalars(out / "tensorboard")[probe_tag("temperature")] == [(0, pytest.approx(0.1))]
    capsys.readouterr()
    assert probe.main(args_for(folder, text_file, out, "--temperatures", "1", "--quiet")) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "other settings" in line]
    assert said == [f"study probe: {out} held a probe made with other settings; its probe.json, figure and event "
                    "file are replaced whole"]  # fmt: skip
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert read_scalars(out / "tensorboard")[probe_tag("temperature")] == [(0, 1.0)]
    assert [r["temperature"] for r in json.loads((out / "probe.json").read_text())["results"]] == [1.0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no half-built folder left


def test_a_probe_killed_while_writing_leaves_the_previous_output_whole(tmp_path, monkeypatch):
    from study.frozen.probe import command, writers

    out = tmp_path / "out"
    out.mkdir()
    (out / "probe.json").write_text('{"argv": ["old"]}')
    (out / "probe.png").write_bytes(b"old figure")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(command, "check_args", lambda args: [])
    monkeypatch.setattr(command, "run_probe", lambda *a, **k: {"seconds": 0.0, "argv": ["new"], "results": []})

    def killed_after_the_json(report, folder):
        assert (folder / "probe.json").is_file()  # written, in the folder being built
        raise KeyboardInterrupt

    monkeypatch.setattr(writers, "write_figure", killed_after_the_json)
    with pytest.raises(KeyboardInterrupt):
        command.main(["--model", "m", "--out", str(out), "--no-tensorboard"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_an_out_folder_holding_other_files_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from study.frozen.probe import command

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr(command, "check_args", lambda args: pytest.fail("work started before the refusal"))
    assert command.main(["--model", "m", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"study probe: {out} holds notes.txt, which no probe writes: the probe replaces the folder as a whole; "
        "give an empty or new folder")  # fmt: skip
    assert (out / "notes.txt").read_text() == "mine"
