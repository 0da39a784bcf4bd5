"""README.md's "What the data say": each sentence that states a number or a direction is the committed JSON's.

Each check renders, from the report JSON a sentence comes from (docs/results/*.json), the words that sentence must
contain: the numbers in the project's own format (`fmt`, 3 significant digits) and the direction chosen from the
data (e.g. "more slowly than 1/T" only when the slope's interval lies between -1 and 0). A check fails when the
README says something its JSON no longer does; the coverage test fails when the paragraph states a number that no
check renders, so a new number cannot be typed in unchecked. After the main job's report.json changes
(`scripts/final_checks.py`, then `scripts/readme_results.py` for the scorecard), these tests say which sentences to
rewrite.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from study.report.stats import fmt
from study.sweep import build_plan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
FIRST, LAST = "What the data say.", "a first look, not a verdict on GPT-2."


def paragraph() -> str:
    """The README's "What the data say" paragraph, its line breaks as spaces."""
    text = (ROOT / "README.md").read_text()
    start = text.index(FIRST)
    return " ".join(text[start : text.index(LAST, start) + len(LAST)].split())


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def finding(data: dict, prefix: str) -> dict:
    """The one finding whose claim starts with `prefix`."""
    found = [f for f in data["findings"] if f["claim"].startswith(prefix)]
    assert len(found) == 1, f"{len(found)} findings start with {prefix!r}"
    return found[0]


def lr_finding(data: dict, key: str) -> dict:
    return next(f for f in data["lr_curves"]["findings"] if f["key"] == key)


def n3(x: float) -> str:
    return fmt(x, 3)


def interval(iv: dict) -> str:
    return f"{n3(iv['estimate'])} [{n3(iv['lo'])}, {n3(iv['hi'])}]"


def number_after(text: str, label: str) -> float:
    """The number that follows `label` in a finding's value text (the text the report writes)."""
    m = re.search(re.escape(label) + r"\s*(-?[\d.]+(?:e[-+]?\d+)?)", text)
    assert m, f"{label!r} not in {text!r}"
    return float(m.group(1))


def growth(iv: dict) -> str:
    """How a gradient grows as T falls, from its log-log slope's interval (1/T is a slope of -1)."""
    if iv["lo"] > 0:
        return "not at all (it shrinks as T falls)"
    if iv["hi"] > 0:
        return "not detectably"
    if iv["lo"] <= -1 <= iv["hi"]:
        return "consistent with 1/T"
    return "more slowly than 1/T" if iv["lo"] > -1 else "faster than 1/T"


MAIN = load("main")
PLAN = build_plan(ROOT / "configs" / "sweeps" / "default.yaml")
STEPS = yaml.safe_load((ROOT / "configs/sweeps/default.yaml").read_text())["overrides"]["trainer.max_steps"]
WORDS = ["none", "one", "two", "three", "four", "five", "six"]


def left_out(row: dict) -> list[float]:
    """The levels a training slope left out because fp64 contradicts fp32 there (its value names them)."""
    note = row["value"].split("left out, ")[1].split(";")[0] if "left out, " in row["value"] else ""
    return [float(x) for x in re.findall(r"T=([\d.]+) \(", note)]


def kept(row: dict) -> str:
    """The T range a main-job training slope was fitted over: the grid's levels fp64 did not leave out."""
    levels = sorted({r.params["temperature"] for r in PLAN.runs if r.params["top_k"] is None} - set(left_out(row)))
    return f"T = {fmt(levels[0])}-{fmt(levels[-1])}"


def per_layer_sentence() -> list[str]:
    """The per-layer claim: supported in training over the fp64-valid levels, not on the frozen probe at low T."""
    last = finding(MAIN, "5. the last layer's W_q/W_k gradient")
    tgrid = load("smollm2-tgrid")
    last_tgrid = finding(tgrid, "5. the last layer's W_q/W_k gradient")
    layer0 = finding(MAIN, "5. a layer's attention-logit gradient grows like 1/T (layer 0 alone")
    layer29 = finding(MAIN, "5. a layer's attention-logit gradient grows like 1/T (layer 29 alone")
    assert last["verdict"] == last_tgrid["verdict"] == "supported"
    assert layer0["verdict"] == layer29["verdict"] == "not supported"
    sat = [number_after(f["value"], "saturated rows at T=0.001:") for f in (layer0, layer29)]
    assert min(sat) > 0.9, "'almost every row saturates'"
    low = kept(last).removeprefix("T = ").split("-")[0]
    return [
        f"grows like 1/T, holds on this model between T = {low} and 1 and not at low T.",
        f"grows {growth(last['interval'])} over {kept(last)} ({interval(last['interval'])}, supported)",
        f"{sum(tgrid['runs'].values())} runs: {interval(last_tgrid['interval'])})",
        f"the probe, {layer0['interval']['n']} independent text windows, its verdict read at T <= 0.1)",
        f"grows {growth(layer0['interval'])} in layer 0 (slope {interval(layer0['interval'])})",
        f"{growth(layer29['interval'])} in layer 29 ({interval(layer29['interval'])})",
        f"({n3(sat[0])} and {n3(sat[1])} of rows have a max weight above 0.99 at T = 0.001)",
    ]


def whole_network_sentence() -> list[str]:
    whole = finding(MAIN, "5. (whole network, T in every layer)")
    assert whole["verdict"] == "not supported" and whole["interval"]["hi"] < -1.25, "'far faster'"
    return [f"grows far faster than 1/T ({interval(whole['interval'])} over {kept(whole)})"]


def jacobian_sentence() -> list[str]:
    row = finding(MAIN, "5. attention sensitivity |d alpha/d l| grows like 1/T in training")
    assert row["verdict"] == "not supported" and row["interval"]["lo"] > -1
    return [f"slope is shallower than 1/T too ({interval(row['interval'])})"]


def depth_sentence() -> list[str]:
    rows = {g: finding(MAIN, f"5. (depth) the {g} gradient's T-slope steepens") for g in ("W_q,W_k", "W_v", "W_o")}
    assert all(r["verdict"] == "supported" for r in rows.values())
    ivs = [r["interval"] for r in rows.values()]
    assert max(iv["lo"] for iv in ivs) < min(iv["hi"] for iv in ivs), "'alike': the three intervals overlap"
    est = {g: n3(r["interval"]["estimate"]) for g, r in rows.items()}
    return [f"for W_q/W_k ({est['W_q,W_k']} per layer) and for the W_v ({est['W_v']}) and W_o ({est['W_o']}) controls alike"]


def excess_sentence() -> list[str]:
    words = []
    for control in ("W_v", "W_o"):
        ivs = [iv for iv in MAIN["excess_slopes"][control].values() if isinstance(iv, dict)]
        assert {iv["level"] for iv in ivs} == {0.95}
        steeper = sum(iv["hi"] < 0 for iv in ivs)
        assert steeper > len(ivs) / 2, "'that part is the attention logits' own' needs most layers steeper"
        words.append((steeper, len(ivs), n3(sum(iv["estimate"] for iv in ivs) / len(ivs))))
    (v, nv, mv), (o, no, mo) = words
    return [f"steeper than W_v's in {v} of {nv} layers and than W_o's in {o} of {no}",
            f"(mean excess {mv} and {mo}, 95% intervals per layer over seeds"]  # fmt: skip


def fp64_sentence() -> list[str]:
    whole = finding(MAIN, "5. (whole network, T in every layer)")
    last = finding(MAIN, "5. the last layer's W_q/W_k gradient")
    depth = finding(MAIN, "5. (depth) the W_q,W_k gradient's T-slope")
    jacobian = finding(MAIN, "5. attention sensitivity |d alpha/d l|")
    tolerance = number_after(whole["value"], "|fp32/fp64 - 1| >")
    assert left_out(whole) == left_out(depth) == [0.01, 0.1] and left_out(last) == [0.01] and not left_out(jacobian)
    assert "(worst of the whole network and every layer)" in depth["value"], "the depth rows read the per-layer check"
    return [f"fp32 is off by more than {fmt(100 * tolerance)}% at T = 0.01 (and at T = 0.1 for the whole network and its",
            "Every training slope but the Jacobian's is checked against fp64 at step 0",
            "(the per-layer, depth and excess slopes by the worst layer's check)"]  # fmt: skip


def frozen_sentence() -> list[str]:
    nstar = finding(MAIN, "3. critical N* ~ 0.06 L")
    heads = {c["heads"] for c in MAIN["theorem1_effect_size"]["curves"]}
    ns = finding(MAIN, "4. N_s/N saturates at 0.70-0.85")
    g = finding(MAIN, "5. gradient sensitivity g follows 1/T for T < 0.1")
    assert nstar["verdict"] == ns["verdict"] == g["verdict"] == "not supported"
    assert ns["interval"]["hi"] < 0.70 and -1 < g["interval"]["lo"]
    tight = [float(x) for x in re.findall(r"\d\.?\d*: ([\d.e-]+)", g["value"].split("tightness")[1].split(";")[0])]
    assert len(heads) == 1 and max(tight) < 0.1, "'far from the bound': below a tenth of it at every T"
    return [
        f"N*/L is {n3(nstar['interval']['estimate'])} against the paper's 0.06 with the {heads.pop()} heads pooled here",
        f"N_s/N lies below 0.70-0.85 ({n3(ns['interval']['estimate'])})",
        f"g(T) is shallower than 1/T ({n3(g['interval']['estimate'])})",
        f"far from Corollary 3's bound (g x 4T between {n3(min(tight))} and {n3(max(tight))})",
    ]


def training_sentence() -> list[str]:
    unstable = finding(MAIN, "6. low temperature makes training unstable")
    calm = int(number_after(unstable["value"], "needs about"))
    sgd = finding(MAIN, "6. low temperature lowers the largest stable learning rate (sgd)")
    recovery = finding(MAIN, "6. (derived) low T hurts training")
    drift = finding(MAIN, "6. the selected set drifts towards uniform")
    assert unstable["verdict"] == "underpowered" and unstable["value"].startswith("no unstable run in either group")
    assert "largest stable lr T=0.01: -, T=1: 0.01" in sgd["value"] and "(runs per cell: 1)" in sgd["value"]
    assert sgd["family"] is False
    assert drift["verdict"] == "not supported" and drift["interval"]["n"] == len({r.params["seed"] for r in PLAN.runs})
    sgd_low = [r for r in PLAN.runs if r.params["optimizer"] == "sgd" and r.params["temperature"] == 0.01]
    assert MAIN["runs"].get("diverged") == len(sgd_low), "the diverged runs are the SGD runs at T = 0.01"
    assert recovery["verdict"] == "supported" and recovery["interval"]["estimate"] > 0.5, "'closed little'"
    low = min(r.params["temperature"] for r in PLAN.runs)
    return [
        f"no AdamW run (no clipping) at T = {fmt(low)} or T = 1 diverged or spiked",
        f"the instability row is underpowered (about {calm} calm runs a group would decide it)",
        "plain SGD diverged at T = 0.01 and trained at T = 1 with lr 0.01 (one run per cell, outside the family)",
        f"closed little of the loss gap that low T opens before any update ({n3(recovery['interval']['estimate'])} of it left)",
        f"did not drift towards uniform ({interval(drift['interval'])}: not supported, as in the 200-step run)",
    ]


def steps_sentence() -> list[str]:
    """The 12 steps (and the long run's 200) are the sweeps' configs, read as the runs were."""
    main = yaml.safe_load((ROOT / "configs/sweeps/default.yaml").read_text())["overrides"]["trainer.max_steps"]
    long = yaml.safe_load((ROOT / "configs/sweeps/smollm2-long.yaml").read_text())["overrides"]["trainer.max_steps"]
    assert sum(MAIN["runs"].values()) == len(PLAN.runs), "docs/results/main.json is not the main job's current grid"
    return [f"spiked in {main} steps", f"Trained for {long} steps instead of {main}", f"as in the {long}-step run"]


def full_sentence() -> list[str]:
    full = load("smollm2-full")
    adamw = finding(full, "6. low temperature lowers the largest stable learning rate (adamw")
    lr = number_after(adamw["value"], "largest stable lr T=0.01:")
    sgd = finding(full, "6. low temperature lowers the largest stable learning rate (sgd")
    assert sgd["verdict"] == "supported"
    return [f"replicates the SGD bracket and finds AdamW at {fmt(lr)} stable at T = 0.01"]


def long_sentence() -> list[str]:
    long = load("smollm2-long")
    gap = finding(long, "6. (derived) low T hurts training")["interval"]
    drift = finding(long, "6. the selected set drifts towards uniform")
    assert drift["verdict"] == "not supported"
    return [f"T = 0.01 still keeps {interval(gap)} of its step-0 loss gap to T = 1",
            f"({interval(drift['interval'])}: not supported)"]  # fmt: skip


def scratch_sentence() -> list[str]:
    scratch = load("scratch")
    lr = scratch["lr_curves"]
    by_arm: dict[tuple[str, float], list[float]] = {}
    for c in lr["curves"]:
        by_arm.setdefault((c["arm"], c["temperature"]), []).append(c["largest_stable_lr"])
    low = [by_arm[("softmax", t)] for t in lr["temperatures"] if t < 1]
    lowered = {sum(x < max(by_arm[("softmax", 1.0)]) for x in seeds) for seeds in low}
    assert len(lowered) == 1 and set(by_arm[("softmax", 1.0)]) == {1.0}
    others = {x for (arm, _), seeds in by_arm.items() if arm != "softmax" for x in seeds}
    assert others == {1.0}, "QK-norm and the init-scale control: 1 in every seed at every T"
    seeds = len(by_arm[("softmax", 1.0)])
    low_lr = {x for seeds_ in low for x in seeds_ if x < 1}
    assert len(low_lr) == 1, low_lr
    verdicts = {f["verdict"] for f in lr["findings"]}
    assert verdicts <= {"inconclusive", "underpowered"} and len(lr["findings"]) == WORDS.index("six")
    return [f"{sum(scratch['runs'].values())} runs, T x learning rate",
            f"only softmax at T <= {fmt(max(t for t in lr['temperatures'] if t < 1))} lowered the",
            f"({fmt(low_lr.pop())} in {lowered.pop()} of {seeds} seeds, against 1 in every seed at T = 1)",
            f"removed that ({fmt(others.pop())} in every seed at every T)", f"but with {seeds} seeds none of its six pre-registered findings is decided"]  # fmt: skip


def sign_counts(row: dict) -> tuple[int, int, int]:
    """(lower, untied, tied) from a sign-test finding's value: 'L of U untied seeds lower at T=... (K tied)'."""
    m = re.match(r"(\d+) of (\d+) untied seeds lower at T=[\d.]+ \((\d+) tied\)", row["value"])
    assert m, row["value"]
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def replication_sentences() -> list[str]:
    first, second = load("scratch-replication"), load("scratch-replication-2")
    lower, untied, tied = sign_counts(lr_finding(first, "2"))
    level = first["lr_curves"]["family"]["level"]
    needed = math.ceil(math.log2(1 / (1 - level)))  # a perfect count of m untied seeds reaches p = 2^-m
    assert all(f["verdict"] != "supported" for f in first["lr_curves"]["findings"])
    seeds1 = lower + tied + (untied - lower)
    out = [f"replication on {seeds1} fresh seeds",
           f"lower at T = 0.03 in {lower} seeds and higher in {'none' if untied == lower else untied - lower}",
           f"{needed - untied} short of what the sign test needs"]  # fmt: skip
    two = lr_finding(second, "2")
    lower2, untied2, tied2 = sign_counts(two)
    sens = lr_finding(second, "1")
    decided = [f for f in second["lr_curves"]["findings"] if f["verdict"] in ("supported", "not supported")]
    assert {f["key"] for f in decided} == {"1", "2"} and sens["verdict"] == two["verdict"] == "supported"
    p = number_after(two["value"], "p =")
    return [*out, f"replication on {lower2 + tied2} fresh seeds", f"decides {WORDS[len(decided)]}:",
            f"lower at T = 0.03 in {lower2} seeds, equal in {tied2}, higher in {'none' if untied2 == lower2 else untied2 - lower2} (p = {n3(p)})",
            f"(slope {interval(sens['interval'])} against log10 T)"]  # fmt: skip


CHECKS = [per_layer_sentence, jacobian_sentence, whole_network_sentence, depth_sentence, excess_sentence, fp64_sentence, frozen_sentence,
          training_sentence, steps_sentence, full_sentence, long_sentence, scratch_sentence, replication_sentences]  # fmt: skip


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_sentence_states_what_its_json_says(check):
    text = paragraph()
    missing = [words for words in check() if words not in text]
    assert not missing, f"README.md's 'What the data say' no longer says (from the JSON): {missing}"


# Numbers that are part of a name or of the paper's statement, not a measurement: 1/T, fp32/fp64, the paper's 0.06
# and 0.70-0.85, "Algorithm 5", "Corollary 3", "Theorem 1", log10, g x 4T, the saturation threshold 0.99, file names.
# Temperatures are not exempt: each is inside a checked fragment. Numbers spelt out in words ("two", "none") are not
# seen by the coverage test; the checks that render them ("decides two") cover them.
NOT_MEASURED = re.compile(
    r"1/T|fp32|fp64|log10|Algorithm \d|Corollary \d|Theorem \d|0\.70-0\.85|paper's 0\.06|"
    r"max weight above 0\.99|docs/results/[\w.-]+|GPT-2|g x 4T"
)


def test_every_number_in_the_paragraph_is_checked():
    """A number typed into the paragraph that no check renders fails here: add a check for it."""
    text = paragraph()
    covered = [False] * len(text)
    for check in CHECKS:
        for words in check():
            start = text.find(words)
            while start >= 0:
                covered[start : start + len(words)] = [True] * len(words)
                start = text.find(words, start + 1)
    for m in NOT_MEASURED.finditer(text):
        covered[m.start() : m.end()] = [True] * (m.end() - m.start())
    loose = [m.group() for m in re.finditer(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text) if not all(covered[m.start() : m.end()])]
    assert not loose, f"numbers in README.md's 'What the data say' that no check renders: {loose}"


def test_the_default_runs_opening_is_the_record_and_the_grid():
    """The paragraph that opens "What the default run found": its commit, date, time and memory are the final checks'
    record (docs/results/checks.json, whose block the README also carries) and its runs the main job's grid."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("final_checks", ROOT / "scripts" / "final_checks.py")
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    record = json.loads((RESULTS / "checks.json").read_text())
    demo = next(s for s in record["steps"] if s["step"] == "demo")
    text = (ROOT / "README.md").read_text()
    start = text.index("## What the default run found")
    opening = " ".join(text[start : text.index("<!-- scorecard", start)].split())
    grid = [r for r in PLAN.runs if r.params["top_k"] is None and r.params["optimizer"] != "sgd"]
    temps = sorted({r.params["temperature"] for r in grid})
    top8 = sorted({r.params["temperature"] for r in PLAN.runs if r.params["top_k"] == 8})
    sgd = [r for r in PLAN.runs if r.params["optimizer"] == "sgd"]
    expected = [
        f"on a fresh clone of commit {record['commit']}",
        f"{record['date'].split()[0]} (its wall time",
        f"{checks.clock(demo['wall_s'])}, {'within' if demo['wall_s'] <= 20 * 60 else 'over'} the 20-minute budget",
        f"with the largest process at {demo['max_rss_kib'] / 2**20:.2f} GiB resident",
        f"{len(PLAN.runs)} fine-tuning runs of {STEPS} attention-only AdamW steps",
        f"(T in {{{', '.join(fmt(t) for t in temps)}}} x {len({r.params['seed'] for r in grid})} seeds with all keys",
        f"a top-8 arm of one seed at T = {', '.join(fmt(t) for t in top8[:-1])} and {fmt(top8[-1])}",
        f"a plain-SGD arm of {len(sgd)} runs)",
    ]
    missing = [words for words in expected if words not in opening]
    assert not missing, f"README.md's 'What the default run found' opening no longer says: {missing}"

