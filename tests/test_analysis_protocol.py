"""analyze() end to end on tiny random models: JSON-clean results, outputs on disk, input validation."""

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from study.frozen.analysis import (
    analyze,
    benchmark_against_oracle,
    capture_attention,
    distance_stats,
    write_outputs,
)

GPT2 = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
LLAMA = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
SMALL = dict(lengths=[8, 16, 32], temperatures=[0.01, 0.05, 0.1, 1.0, 10.0], mc_samples=2, spectral_rows=4)


@pytest.fixture(scope="module")
def gpt2_results():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(copy.deepcopy(GPT2)).eval()
    ids = torch.randint(0, 64, (1, 32))
    return model, ids, analyze(model, ids, **SMALL)


def test_analyze_results_are_plain_json(gpt2_results):
    model, ids, res = gpt2_results
    text = json.dumps(res, allow_nan=False)  # raises on NaN/inf or tensors
    assert json.loads(text)["choices"]["vectors"] == "value"
    ch = res["choices"]
    assert ch["ns"] == [1, 5, 10, 20]  # 100 filtered out at L = 32
    assert ch["alphas"] == [0.01, 0.05] and "sum_outside" in ch["distance_reading"]
    a1 = res["alg1_distance_vs_length"]["d_sum_outside"]
    assert len(a1) == 2 and len(a1[0]) == 3 and len(a1[0][0]) == 4  # [layer][L][head]
    # measurements beside the paper's values; the verdicts are study report's alone
    assert all(set(c) == {"claim", "paper", "measured"} for c in res["claims"])
    assert all(0 <= v <= 1 for layer in res["alg4_separability"]["ratio"] for row in layer for v in row
               if v is not None)
    # The gradient probe and the exact spectral norm stay below 1/(2T).
    half = res["alg5_gradient"]["half_over_t"]
    assert all(s <= h + 1e-9 for s, h in zip(res["alg5_gradient"]["spectral_max_over_heads"], half))


def test_analyze_alg1_equals_direct_token_average(gpt2_results):
    model, ids, res = gpt2_results
    cap = capture_attention(model, ids[:, :16])  # the prefix of length 16, run on its own
    d = distance_stats(cap.weights(1), cap.vectors(1), [5])["d_sum_outside"][0, 2, :, 0]
    want = d[~torch.isnan(d)].double().mean().item()
    got = res["alg1_distance_vs_length"]["d_sum_outside"][1][1][2]  # layer 1, L = 16, head 2
    assert got == pytest.approx(want, rel=1e-4)


def test_write_outputs(gpt2_results, tmp_path):
    _, _, res = gpt2_results
    paths = write_outputs(res, tmp_path)
    for key in ("json", "csv", "claims", "fig2a", "fig2b", "fig2c", "fig3", "fig4", "dilution"):
        assert (tmp_path / paths[key].split("/")[-1]).stat().st_size > 0, key
    claims = (tmp_path / "claims.md").read_text()
    assert "| claim (paper) | paper | measured |" in claims and "verdict" not in claims.split("\n\n")[0]
    assert "consistent" not in claims and "Measurements, not verdicts" in claims
    lemma = [c for c in res["claims"] if c["claim"].startswith("Lemma 1")]
    assert len(lemma) == 1 and "fixed queries" in lemma[0]["measured"]
    header = (tmp_path / "per_head.csv").read_text().splitlines()[0]
    assert header == "analysis,metric,layer,head,L,N,T,eps,value"


def test_analyze_llama_hidden_vectors():
    torch.manual_seed(1)
    model = LlamaForCausalLM(copy.deepcopy(LLAMA)).eval()
    res = analyze(model, torch.randint(0, 64, (2, 16)), lengths=[16], ns=[1, 5], temperatures=[0.1, 1.0],
                  vectors="hidden", mc_samples=0, spectral_rows=2)
    assert res["choices"]["vectors"] == "hidden"
    assert res["model"]["heads"] == 4 and res["model"]["batch"] == 2
    assert "mc_expectation" not in res["alg1_distance_vs_length"]


def test_analyze_rejects_bad_input():
    model = GPT2LMHeadModel(copy.deepcopy(GPT2)).eval()
    ids = torch.randint(0, 64, (1, 16))
    with pytest.raises(ValueError, match="N=17"):
        analyze(model, ids, lengths=[16], n_fixed=17)
    with pytest.raises(ValueError, match="N=20"):
        analyze(model, ids, lengths=[16], critical_ns=[1, 20])
    with pytest.raises(ValueError, match="L=65"):
        analyze(model, torch.randint(0, 64, (1, 65)))
    with pytest.raises(ValueError, match="L=32"):
        analyze(model, ids, lengths=[8, 32])
    with pytest.raises(ValueError, match="empty"):
        analyze(model, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="T=0.0"):
        analyze(model, ids, lengths=[16], temperatures=[1.0, 0.0])
    with pytest.raises(ValueError, match="vectors"):
        analyze(model, ids, vectors="keys")


def test_benchmark_agrees_with_oracle():
    res = benchmark_against_oracle(48, dim=16)
    assert res["max_relative_difference_fp32_vs_fp64"] < 1e-4
    # At L = 48 the loop is too short to beat the vectorised overheads; the speed-up is measured at L = 512.
    assert res["speedup"] > 0 and math.isfinite(res["loop_s"])


def results_layout(value, path: str = "") -> list[str]:
    """Every entry of a results dict as "path shape", in order: dict keys, lists of numbers by their nested
    lengths (e.g. 2x3x4), each element of a list of dicts, "scalar" for the rest."""
    if isinstance(value, dict):
        out = [f"{path} dict"] if path else []
        for key, v in value.items():
            out += results_layout(v, f"{path}.{key}" if path else key)
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = [f"{path} list of {len(value)}"]
        for i, v in enumerate(value):
            out += results_layout(v, f"{path}[{i}]")
        return out
    if isinstance(value, list):
        shape = []
        while isinstance(value, list):
            shape.append(len(value))
            value = value[0] if value else None
        return [f"{path} {'x'.join(map(str, shape))}"]
    return [f"{path} scalar"]


LAYOUT = Path(__file__).parent / "data" / "analysis_results_layout.txt"


def test_results_json_layout_is_unchanged(gpt2_results):
    """Every key of results.json, in order, with the shape of every array: the layout `study analyze` wrote before
    the analyses became one module and one registry entry each (recorded from that code, see LAYOUT's header)."""
    _, _, res = gpt2_results
    want = [line for line in LAYOUT.read_text().splitlines() if not line.startswith("#")]
    assert results_layout(res) == want


def test_an_analysis_is_one_registry_entry(monkeypatch, tmp_path):
    """A new analysis needs only its `Analysis` in `registry.ANALYSES`: the runner, results.json, the CSV, the
    claims and TensorBoard pick it up in table order."""
    from study.frozen.analysis import registry
    from study.frozen.analysis.outputs import write_tensorboard
    from study.frozen.analysis.registration import Analysis, stack_layers

    def diagonal(settings, layer):  # mean weight on the diagonal (the query's own key), per head
        return {"diagonal": layer.weights.diagonal(dim1=-2, dim2=-1).mean((0, 2))}

    def csv_rows(res, layer_ids):
        for layer, heads in zip(layer_ids, res["toy_diagonal"]["diagonal"]):
            for head, v in enumerate(heads):
                yield ["toy", "diagonal", layer, head, "", "", "", "", v]

    toy = Analysis(name="toy", layer=diagonal, results=lambda s, layers: {"toy_diagonal": stack_layers(layers)},
                   csv_rows=csv_rows, scalars=lambda res: [("analysis/toy", res["toy_diagonal"]["diagonal"][1][0], 1)],
                   claims=lambda res: [{"claim": "toy", "paper": "-", "measured": None}])
    monkeypatch.setattr(registry, "ANALYSES", (*registry.ANALYSES, toy))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(copy.deepcopy(GPT2)).eval()
    res = analyze(model, torch.randint(0, 64, (1, 8)), lengths=[8], ns=[1], temperatures=[1.0], mc_samples=0,
                  spectral_rows=2)
    assert list(res)[list(res).index("lemma1_fixed_query_by_window") + 1] == "toy_diagonal"
    assert list(res["seconds_by_step"])[-1] == "toy"
    assert res["claims"][-1]["claim"] == "toy"
    cap = capture_attention(model, torch.randint(0, 64, (1, 8)))
    assert len(res["toy_diagonal"]["diagonal"]) == cap.n_layers and len(res["toy_diagonal"]["diagonal"][0]) == 4
    write_outputs(res, tmp_path, figures=False)
    assert (tmp_path / "per_head.csv").read_text().count("toy,diagonal,") == cap.n_layers * 4
    assert "| toy |" in (tmp_path / "claims.md").read_text()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(write_tensorboard(res, tmp_path / "tb")))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("analysis/toy")] == [(1, pytest.approx(
        res["toy_diagonal"]["diagonal"][1][0]))]


def _assert_same(got, want, path="results"):
    """Nested results equal: the same keys and None entries, numbers within fp32 reordering."""
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for key in want:
            _assert_same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-8), path
    else:
        assert got == want, path


LEAN_BLOCKS = ("alg3_critical_n", "alg3_critical_n_by_window", "alg3_effect_size", "alg3_n_star_by_heads",
               "lemma1_dilution", "lemma1_fixed_query_by_window")


@pytest.mark.parametrize("config", [GPT2, LLAMA], ids=["gpt2", "llama-gqa"])
def test_windows_one_at_a_time_equal_every_analysis_at_once(config):
    """The long-context mode (critical and dilution, the windows captured and analysed one by one, only the
    analysed layers kept) gives the numbers of the default run, all analyses on all windows at once."""
    torch.manual_seed(3)
    model = (GPT2LMHeadModel if config is GPT2 else LlamaForCausalLM)(copy.deepcopy(config)).eval()
    ids = torch.randint(0, 64, (3, 32))
    full = analyze(model, ids, **SMALL)
    lean = analyze(model, ids, **SMALL, analyses=["dilution", "critical"], layers=[1])
    assert full["choices"].get("windows") is None and lean["choices"]["windows"].startswith("one at a time")
    assert lean["choices"]["analyses"] == ["critical", "dilution"]  # the table's order
    assert set(LEAN_BLOCKS) <= set(lean) and "alg5_gradient" not in lean and "alg1_distance_vs_length" not in lean
    assert {c["claim"].split(" ")[0] for c in lean["claims"]} == {"N*", "Lemma"}
    one_layer = analyze(model, ids, **SMALL, layers=[1])  # every analysis at once, on the same layer
    for key in LEAN_BLOCKS:
        _assert_same(lean[key], one_layer[key], key)
    # And on every layer, the lean mode against the default run.
    lean_all = analyze(model, ids, **SMALL, analyses=["critical", "dilution"])
    for key in LEAN_BLOCKS:
        _assert_same(lean_all[key], full[key], key)
    # all at once on request: the same numbers again
    at_once = analyze(model, ids, **SMALL, analyses=["critical", "dilution"], one_window_at_a_time=False)
    assert "windows" not in at_once["choices"]
    for key in LEAN_BLOCKS:
        _assert_same(at_once[key], lean_all[key], key)


def test_analyses_are_chosen_by_name():
    model = GPT2LMHeadModel(copy.deepcopy(GPT2)).eval()
    ids = torch.randint(0, 64, (2, 16))
    with pytest.raises(ValueError, match=r"'bogus'.*distance, critical, separability, gradient, dilution"):
        analyze(model, ids, lengths=[16], analyses=["critical", "bogus"])
    with pytest.raises(ValueError, match="no analysis"):
        analyze(model, ids, lengths=[16], analyses=[])
    # Random draws per batch (Monte Carlo subsets, the gradient probe's directions): not one window at a time.
    with pytest.raises(ValueError, match=r"alg5_gradient.*one text window at a time"):
        analyze(model, ids, lengths=[16], analyses=["critical", "gradient"], one_window_at_a_time=True)
    res = analyze(model, ids, lengths=[16], temperatures=[0.1, 1.0], analyses=["gradient"], mc_samples=0,
                  spectral_rows=2)
    assert "windows" not in res["choices"] and set(res["seconds_by_step"]) == {"capture", "alg5_gradient"}


def test_write_outputs_of_chosen_analyses(tmp_path):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(copy.deepcopy(GPT2)).eval()
    res = analyze(model, torch.randint(0, 64, (2, 32)), **SMALL, analyses=["critical", "dilution"])
    paths = write_outputs(res, tmp_path)
    assert {"fig2c", "fig2c_ratio", "dilution"} <= set(paths) and not {"fig2a", "fig3", "fig4"} & set(paths)
    rows = (tmp_path / "per_head.csv").read_text().splitlines()[1:]
    assert rows and {r.split(",")[0] for r in rows} == {"lemma1"}
    table_rows = [line for line in (tmp_path / "claims.md").read_text().splitlines() if line.startswith("| ")][1:]
    assert [row.split(" (")[0] for row in table_rows] == ["| N* ~ 0.06 L", "| N* ~ 0.06 L", "| Lemma 1: C1/n <= alpha_i <= C2/n"]


def test_theorem1_effect_size_and_n_star_by_heads(gpt2_results):
    """The effect-size block holds one KS statistic and one d/E per window and N <= L, each recomputable from
    the per-window KS test; the N*-by-heads table's row of every layer is Algorithm 3's own N*."""
    _, _, res = gpt2_results
    block = res["alg3_effect_size"]
    assert block["heads"] == 2 * 4 and [e["length"] for e in block["by_length"]] == SMALL["lengths"]
    for entry in block["by_length"]:
        assert all(n <= entry["length"] for n in entry["ns"])
        assert [n / entry["length"] for n in entry["ns"]] == entry["n_over_length"]
        assert len(entry["ks"]) == 1 and all(v is None or 0 <= v <= 1 for v in entry["ks"][0])
        assert all(v is None or v > 0 for v in entry["d_over_e"][0])
    rows = res["alg3_n_star_by_heads"]
    assert [r["layer_positions"] for r in rows] == [[0], [0, 1]] and [r["heads"] for r in rows] == [4, 8]
    assert rows[-1]["n_star"] == [r["n_star"] for r in res["alg3_critical_n"]]
