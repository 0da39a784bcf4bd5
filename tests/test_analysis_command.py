"""`study analyze` end to end on tiny models saved to tmp (no hub): outputs, tokenizer lookup, input errors."""

import copy
import json

import pytest
import torch
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from study.attention import AttentionSpec
from study.frozen.analysis.command import main
from tests.conftest import tiny_gpt2_config

WORDS = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
FAST = ["--lengths", "16", "32", "--ns", "1", "5", "--temperatures", "0.01", "0.1", "1", "--mc-samples", "0"]


def _tokenizer(folder):
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 20, vocab_size=300, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    tok.save_pretrained(folder)
    return tok


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    tok = _tokenizer(root / "model")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(copy.deepcopy(tiny_gpt2_config(vocab_size=len(tok))))
    model.save_pretrained(root / "model")
    gen = torch.Generator().manual_seed(0)
    text = root / "text.txt"
    text.write_text(" ".join(WORDS[i] for i in torch.randint(len(WORDS), (400,), generator=gen)))
    return root, tok


def test_analyze_saved_model_dir_writes_outputs(saved, tmp_path, capsys):
    root, _ = saved
    out = tmp_path / "out"
    assert main(["--model", str(root / "model"), "--text", str(root / "text.txt"), "--out", str(out),
                 "--tensorboard", "--layers", "1", *FAST]) == 0
    for name in ("results.json", "per_head.csv", "claims.md", "fig2a_distance_vs_length.png", "fig4_gradient_sensitivity.png"):
        assert (out / name).stat().st_size > 0, name
    assert list(out.glob("events.out.tfevents.*")), "no TensorBoard events"
    res = json.loads((out / "results.json").read_text())
    assert res["choices"]["layers"] == [1] and res["choices"]["lengths"] == [16, 32]
    assert res["source"]["model_kind"] == "dir"
    assert {row.split(",")[2] for row in (out / "per_head.csv").read_text().splitlines()[1:]} == {"1"}
    assert "| claim (paper) | paper | measured |" in capsys.readouterr().out
    # A second run never overwrites the first: it gets a suffix.
    first = (out / "results.json").read_text()
    assert main(["--model", str(root / "model"), "--text", str(root / "text.txt"), "--out", str(out),
                 "--layers", "0", "--no-figures", *FAST]) == 0
    assert (out / "results.json").read_text() == first
    assert json.loads((tmp_path / "out-1" / "results.json").read_text())["choices"]["layers"] == [0]


def test_analyze_checkpoint_uses_its_spec_and_the_tokenizer_beside_it(saved, tmp_path):
    import lightning

    from study.model import CausalLMModule

    root, tok = saved
    module = CausalLMModule(AttentionSpec(normalizer="sparsemax", temperature=0.5), n_layer=2, n_head=4, n_embd=32,
                        n_positions=64, vocab_size=len(tok))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": lightning.__version__}, ckpt)
    args = ["--model", str(ckpt), "--text", str(root / "text.txt"), "--out", str(tmp_path / "a"), "--no-figures", "--threads", "1", *FAST]
    assert main(args) == 2  # no tokenizer anywhere near the checkpoint
    tok.save_pretrained(run / "tokenizer")
    assert main(args) == 0
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    assert res["model"]["normalizers"] == ["sparsemax"]
    assert res["model"]["attention"][0]["temperature"] == 0.5
    # Sparse rows: the smallest visible weight is exactly 0 somewhere.
    assert min(v for layer in res["lemma1_dilution"]["scaled_min"] for head in layer for v in head) == 0.0


@pytest.mark.parametrize("extra, message", [
    (["--lengths", "16", "--ns", "20"], "N=20"),
    (["--lengths", "128"], "L=128"),  # beyond the tiny model's context of 64
    (["--temperatures", "1", "0"], "T=0.0"),
    (["--temperatures", "-1"], "T=-1.0"),
    (["--lengths", "0"], "L=0"),
    (["--threads", "0"], "--threads"),
    (["--critical-ns", "1", "0"], "N=0"),
    (["--lengths", "16", "--critical-ns", "1", "17"], "N=17"),
])
def test_bad_numbers_fail_naming_the_value(saved, tmp_path, capsys, extra, message):
    root, _ = saved
    assert main(["--model", str(root / "model"), "--text", str(root / "text.txt"), "--out", str(tmp_path / "o"),
                 *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_missing_and_empty_inputs(saved, tmp_path, capsys):
    root, _ = saved
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    short = tmp_path / "short.txt"
    short.write_text("the quick brown fox")
    cases = [
        (["--model", str(root / "model"), "--text", str(tmp_path / "nope.txt")], "nope.txt"),
        (["--model", str(root / "model"), "--text", str(empty)], "empty text"),
        (["--model", str(tmp_path / "missing.ckpt"), "--text", str(root / "text.txt")], "missing.ckpt"),
        (["--model", "./no/such/dir", "--text", str(root / "text.txt")], "no/such/dir"),
        (["--model", str(root / "model"), "--text", str(short), "--lengths", "32"], "L=32 needs 32 tokens"),
    ]
    for argv, message in cases:
        assert main([*argv, "--out", str(tmp_path / "o")]) == 2, argv
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_bad_analysis_names_fail_before_the_model_loads(tmp_path, capsys):
    """A misspelt analysis is named with the choices, before anything is read (the model here does not exist)."""
    assert main(["--model", str(tmp_path / "no-model"), "--text", str(tmp_path / "no.txt"), "--out",
                 str(tmp_path / "o"), "--analyses", "critical", "dilutoin"]) == 2
    err = capsys.readouterr().err
    assert "--analyses: unknown analysis 'dilutoin'" in err and "critical, separability, gradient, dilution" in err
    assert "no-model" not in err and not (tmp_path / "o").exists()


def test_verb_is_registered():
    from study.cli import VERBS

    assert VERBS["analyze"] == "study.frozen.analysis.command"


def test_windows_are_independent_replicates_from_the_text(saved, tmp_path):
    """--windows K analyses K disjoint windows spread over the text (the batch), recorded in results.json."""
    root, tok = saved
    out = tmp_path / "w"
    argv = ["--model", str(root / "model"), "--text", str(root / "text.txt"), "--out", str(out), "--windows", "4",
            "--lengths", "8", "16", "--ns", "1", "5", "--temperatures", "0.01", "1", "--epsilons", "0.001",
            "--mc-samples", "0", "--no-figures"]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    origins = res["source"]["windows"]
    assert res["model"]["batch"] == 4 and len(origins) == 4 and res["source"]["argv"] == argv
    starts = sorted(o["start"] for o in origins)
    assert all(b - a >= 16 for a, b in zip(starts, starts[1:]))  # disjoint windows of L = 16
    n_tokens = len(tok((root / "text.txt").read_text(), add_special_tokens=False)["input_ids"])
    assert starts[-1] > n_tokens / 2  # spread over the text, not its first blocks
    assert res["choices"]["epsilons"] == [0.001]
    assert len(res["alg5_gradient_by_window"]["g_max_over_heads"]) == 4
    assert "Pooled over 4 text windows" in (out / "claims.md").read_text()


@pytest.mark.parametrize(("extra", "message"), [
    (["--windows", "0"], "--windows must be >= 1, got 0"),
    (["--epsilons", "0"], "eps=0.0"),
    (["--windows", "500", "--lengths", "16"], "500 windows of L=16 tokens need 8000 tokens"),
])
def test_bad_windows_fail_naming_the_value(saved, tmp_path, capsys, extra, message):
    root, _ = saved
    assert main(["--model", str(root / "model"), "--text", str(root / "text.txt"), "--out", str(tmp_path / "o"),
                 *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_estimate_analyses_the_deepest_layer_once_scales_it_and_writes_nothing(saved, tmp_path, capsys,
                                                                                   monkeypatch):
    from study.frozen.analysis import command

    analysed = []
    real = command._analyze

    def recording(args, model, input_ids, lengths, layers):
        analysed.append(list(layers))
        return real(args, model, input_ids, lengths, layers)

    monkeypatch.setattr(command, "_analyze", recording)
    root, _ = saved
    out = tmp_path / "out"
    assert main(["--model", str(root / "model"), "--text", str(root / "text.txt"), "--out", str(out),
                 "--layers", "1", "0", *FAST, "--estimate"]) == 0  # fmt: skip
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert analysed == [[1]]  # the deepest: its capture is the whole forward pass the analysis needs
    assert set(found["parts"]) == {"load", "capture", "layers"} and all(v >= 0 for v in found["parts"].values())
    assert found["seconds"] == pytest.approx(sum(found["parts"].values()))
    assert not out.exists()
