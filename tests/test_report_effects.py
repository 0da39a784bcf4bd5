"""The per-temperature table of report.json and the opening sentences generated from it: a small fixture of runs
whose values are known, each number checked against a t-interval computed here with scipy's own t quantile."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from study import tags
from study.report import sources
from study.report import summary as S
from study.report.effects import against_paper, number, opening, per_t_json
from study.report.markdown import plain_summary
from study.report.summary import Summary

TEMPS = (0.01, 0.1, 1.0)
SEEDS = (0, 1, 2)
SPREAD = {0: 1.0, 1: 1.3, 2: 0.8}  # each seed's factor at low T (at T = 1 every seed is 1): the seeds' ratios differ


def factor(t: float, seed: int) -> float:
    return 1.0 if t == 1.0 else SPREAD[seed]


def main_run(t: float, seed: int, fp64: bool = True) -> Summary:
    f = factor(t, seed)
    grads = {"W_q,W_k": {0: f / t**5, 1: f / t}}
    return Summary(
        f"T{t:g}_kall_s{seed}", t, None, seed=seed, optimizer="adamw", learning_rate=3e-5,
        final={tags.VAL_PPL: 20 * f / t**0.9, tags.VAL_LOSS: 3.0, sources.ENTROPY: 2 * t * f,
               sources.NORMALIZED_ENTROPY: 0.6 * t * f, sources.MAX_LOGIT: 10 * f / t},
        values={S.GRAD_QK: f / t**5, S.FP64_QK: 30.0 if t == 0.01 else 1.0, S.FP64_LAST_QK: 1.0,
                S.STEP0_QK: f / t**5 if fp64 else None, S.VAL_LOSS_BASELINE: 3.5},
        step0_grads=grads if fp64 else {}, layer_grads=grads,
    )  # fmt: skip


def sgd_run(t: float, lr: float) -> Summary:
    diverged = t < 1 or lr == 1.0
    return Summary(f"T{t:g}_sgd_lr{lr:g}", t, None, seed=1, optimizer="sgd", learning_rate=lr,
                   state="diverged" if diverged else "finished", final={tags.VAL_LOSS: 3.0},
                   values={S.VAL_LOSS_BASELINE: 3.5})  # fmt: skip


@pytest.fixture
def sweep() -> list[Summary]:
    return [main_run(t, s) for t in TEMPS for s in SEEDS] + [sgd_run(t, lr) for t in (0.01, 1.0) for lr in (0.01, 1.0)]


def reference_fold(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the ratios with the 95% t-interval of their mean log: the textbook formula with scipy's t."""
    logs = np.log(ratios)
    half = scipy_stats.t.ppf(0.975, len(logs) - 1) * np.std(logs, ddof=1) / math.sqrt(len(logs))
    return math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)


def test_the_table_holds_each_seed_and_the_mean_with_its_interval(sweep):
    table = per_t_json(sweep)
    assert (table["reference_T"], table["lowest_T"], table["temperatures"]) == (1.0, 0.01, list(TEMPS))
    assert (table["optimizer"], table["learning_rate"], table["gradients"]) == ("adamw", 3e-5, "float64 step 0")
    by_key = {q["key"]: q for q in table["quantities"]}
    assert list(by_key) == ["grad_qk_step0", "grad_qk_last_step0", "grad_qk", "grad_qk_last", "val_ppl", "entropy",
                            "normalized_entropy", "max_logit"]  # fmt: skip
    ppl = {c["T"]: c for c in by_key["val_ppl"]["by_T"]}[0.01]
    assert ppl["runs"] == 3 and ppl["seeds"] == [0, 1, 2]  # the SGD runs at 0.01 are not the main arm
    values = [20 * SPREAD[s] / 0.01**0.9 for s in SEEDS]
    assert ppl["values"] == pytest.approx(values)
    estimate, lo, hi = reference_fold(values)
    assert (ppl["interval"]["estimate"], ppl["interval"]["lo"], ppl["interval"]["hi"]) == pytest.approx((estimate, lo, hi))
    entropy = {c["T"]: c for c in by_key["entropy"]["by_T"]}[0.01]["interval"]  # linear: the arithmetic mean
    half = scipy_stats.t.ppf(0.975, 2) * np.std([0.02 * SPREAD[s] for s in SEEDS], ddof=1) / math.sqrt(3)
    assert (entropy["estimate"], entropy["hi"] - entropy["estimate"]) == pytest.approx((0.02 * 31 / 30, half))
    # the float32 whole-network norm at T = 0.01 is off fp64 by 30x: marked, as the findings leave it out
    fp32 = {c["T"]: c for c in by_key["grad_qk"]["by_T"]}
    assert "numerically unreliable" in fp32[0.01]["left_out"] and "left_out" not in fp32[0.1]
    assert json.loads(json.dumps(table)) == table  # plain JSON


def test_effects_are_seed_paired_fold_changes_from_the_reference_t(sweep):
    effects = {e["key"]: e for e in per_t_json(sweep)["effects"]}
    whole = effects["grad_qk_step0"]
    assert (whole["role"], whole["from_T"], whole["to_T"], whole["seeds"]) == ("whole_network", 1.0, 0.01, 3)
    expected = reference_fold([SPREAD[s] / 0.01**5 for s in SEEDS])  # each seed's ratio of its two runs
    assert (whole["interval"]["estimate"], whole["interval"]["lo"], whole["interval"]["hi"]) == pytest.approx(expected)
    assert effects["grad_qk_last_step0"]["interval"]["estimate"] == pytest.approx(expected[0] * 0.01**4)
    assert effects["grad_qk"]["to_T"] == 0.1  # the float32 norm stops at the lowest level fp64 does not contradict
    assert effects["grad_qk"]["role"] == ""  # the findings fit the step-0 norms, not these
    falls = effects["entropy"]["interval"]["estimate"]
    assert falls == pytest.approx(reference_fold([0.01 * SPREAD[s] for s in SEEDS])[0])


def test_the_opening_states_each_effect_with_its_interval_and_seeds(sweep):
    text = opening({"per_t": per_t_json(sweep)})
    sentences = text.split(". ")
    assert 3 <= len(sentences) <= 5
    g, lo, hi = reference_fold([SPREAD[s] / 0.01**5 for s in SEEDS])
    assert text.startswith(
        f"From T = 1 to T = 0.01 (adamw, lr 3e-05, softmax with every key), the W_q/W_k gradient norm grows "
        f"{number(g)}-fold [{number(lo)}, {number(hi)}] over the whole network and grows {number(g * 1e-8)}-fold "
        f"[{number(lo * 1e-8)}, {number(hi * 1e-8)}] in the last layer (layer 1), 3 seeds each (float64 at step 0, "
        "as the findings fit it).")  # fmt: skip
    assert number(g) == "1.01e10" and number(lo * 1e-8) == "55.4"  # plain numbers: 3 digits, 1e10 as 9.9e9
    p, plo, phi = reference_fold([SPREAD[s] * 100**0.9 for s in SEEDS])
    assert f"Validation perplexity after training grows {number(p)}-fold [{number(plo)}, {number(phi)}], from 20 to " in text
    e, elo, ehi = reference_fold([1 / (0.01 * SPREAD[s]) for s in SEEDS])
    assert f"Attention entropy falls {number(e)}-fold [{number(elo)}, {number(ehi)}], from 2 to {number(0.02 * 31 / 30)} nats (3 seeds)" in text
    assert f"H/log n goes from 0.6 to {number(0.006 * 31 / 30)};" in text  # the arithmetic mean: a linear quantity
    # the learning-rate result: the SGD arm's bracket, one run per cell
    assert ("Under sgd the largest stable learning rate is none of 0.01, 1 at T = 0.01 and 0.01 at T = 1 (1 run per "
            "T and rate).") in text  # fmt: skip


def test_float32_gradients_say_which_levels_they_keep():
    runs = [main_run(t, s, fp64=False) for t in TEMPS for s in SEEDS]
    table = per_t_json(runs)
    assert table["gradients"] == "float32 median over the logged steps"
    text = opening({"per_t": table})
    assert "over the whole network (to T = 0.1, the lowest T the findings keep)" in text
    assert "float32 medians over the logged steps, at the levels the findings keep" in text
    assert "Under " not in text  # no learning-rate sweep, no learning-rate sentence
    one_t = per_t_json([main_run(1.0, s) for s in SEEDS])  # no lower T: a table, no effect, no opening
    assert one_t["quantities"] and one_t["effects"] == [] and opening({"per_t": one_t}) == ""


def test_the_plain_summary_opens_with_the_effect_and_says_far_steeper(sweep):
    found = [{"claim": "5. (whole network) W_q, W_k gradients grow like 1/T", "verdict": "diagnostic (depth compounding)",
              "paper_value": "1/T", "experiment": "training", "interval": {"estimate": -5.15, "lo": -6.37, "hi": -3.92}},
             {"claim": "5. layer 29 alone", "verdict": "not supported", "paper_value": "1/T", "experiment": "probe",
              "interval": {"estimate": 0.384, "lo": -0.365, "hi": 1.13}},
             {"claim": "5. last layer", "verdict": "underpowered", "paper_value": "1/T", "experiment": "training",
              "interval": {"estimate": -0.519, "lo": -0.972, "hi": -0.0648}}]  # fmt: skip
    data = {"runs": {"finished": 9}, "family": {}, "findings": found, "per_t": per_t_json(sweep)}
    text = plain_summary(data)
    assert text.startswith("From T = 1 to T = 0.01") and text.index("9 runs (9 finished)") > text.index("Under sgd")
    assert ("ours -5.15 [-6.37, -3.92] (training): far steeper than the paper's 1/T: under T^-5.15 a 10-fold fall "
            "of T multiplies it 1.41e5-fold, not 10-fold.") in text  # fmt: skip
    assert "ours 0.384 [-0.365, 1.13] (probe): far shallower than the paper's 1/T (T^0.384, not T^-1)." in text
    assert "ours -0.519 [-0.972, -0.0648] (training)." in text  # it reaches into the band around -1: no side
    del data["per_t"]  # a report.json written before the table: the verdicts alone, as before
    assert plain_summary(data).startswith("9 runs (9 finished)")


@pytest.mark.parametrize(("lo", "hi", "words"), [(-6.4, -3.9, "far steeper"), (-1.9, -1.3, "steeper"),
                                                 (-0.7, -0.55, "shallower"), (-0.4, 1.1, "far shallower"),
                                                 (-1.2, -0.8, ""), (-0.97, -0.06, "")])  # fmt: skip
def test_against_paper_reads_the_interval_against_minus_one(lo, hi, words):
    said = against_paper({"paper_value": "1/T", "interval": {"estimate": (lo + hi) / 2, "lo": lo, "hi": hi}})
    assert said.startswith(words) if words else said == ""
    assert said.startswith(words + " ") or not words
    assert against_paper({"paper_value": "~100x", "interval": {"estimate": 5, "lo": -9, "hi": -8}}) == ""


def test_number_is_plain_between_a_thousandth_and_a_hundred_thousand():
    assert [number(x) for x in (1.23456e10, 60.24, 1210.4, 0.02, 74.0, 0.000123, 123456)] == [
        "1.23e10", "60.2", "1,210", "0.02", "74", "1.23e-4", "1.23e5"]  # fmt: skip


@pytest.mark.slow
def test_a_built_report_opens_with_its_effect_in_markdown_json_and_tensorboard(tmp_path):
    """`build_report` on a sweep folder of 3 T x 3 seeds: report.json holds the table, report.md's plain words and
    the TensorBoard Text entry open with the same sentences, the verdicts after them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from study.report import build_report
    from tests.test_report import write_fake_run

    sweep, runs = tmp_path / "tiny", []
    for t in TEMPS:
        for seed in SEEDS:
            f = factor(t, seed)
            name, params = f"T{t:g}_kall_softmax_s{seed}", {"temperature": t, "top_k": None, "seed": seed}
            write_fake_run(sweep, name, params, {
                "train/loss": [(0, 5.0), (1, 4.0)], "val/loss": [(0, 4.5), (2, 4.0)], "val/ppl": [(2, 20 * f / t)],
                "grad_norm/attn_q": [(0, f / t), (1, f / t)], "grad_norm/attn_k": [(0, f / t), (1, f / t)],
                sources.ENTROPY: [(2, 2 * t * f)],
            })  # fmt: skip
            runs.append({"name": name, "params": params})
    (sweep / "plan.json").write_text(json.dumps({"sweep": "tiny", "runs": runs}))
    path = build_report(sweep)
    table = json.loads((path.parent / "report.json").read_text())["per_t"]
    effects = {e["key"]: e for e in table["effects"]}
    assert set(effects) == {"grad_qk", "val_ppl", "entropy"} and table["gradients"].startswith("float32")
    assert effects["val_ppl"]["interval"]["estimate"] == pytest.approx(reference_fold([100 * SPREAD[s] for s in SEEDS])[0])
    plain = path.read_text().split("## In plain words\n\n")[1]
    assert plain.startswith(opening({"per_t": table})) and plain.startswith("From T = 1 to T = 0.01 (adamw")
    assert plain.index("Validation perplexity after training grows") < plain.index("9 runs (9 finished)")
    # no spike, no divergence: no stability figure of empty panels, a sentence under Figures instead
    assert not (path.parent / "stability_vs_T.png").exists()
    assert "stability_vs_T.png is not drawn: no divergence" in path.read_text().split("## Figures")[1]
    acc = EventAccumulator(str(path.parent), size_guidance={"tensors": 0})
    acc.Reload()
    text = acc.Tensors(tags.REPORT_SUMMARY)[0].tensor_proto.string_val[0].decode()
    assert text.startswith(opening({"per_t": table}))
