"""The Wortsman-scale study's registered family (study.report.wortsman) on planted per-seed data whose every verdict
is known by construction: supported, not supported, inconclusive and underpowered; a planted bug (the temperature
labels swapped) that flips finding 1's sign; the design checks read before the findings; the earlier pooled page
left to `study.report.pooled`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from study import cli
from study.report import wortsman
from study.report.lrcurves import ARM_LABELS
from study.report.pooled import PartError, read_part

GRID = [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0]
TEMPS = (0.03, 0.1, 1.0)
SEEDS = range(100, 116)
L0 = 7.0
DECADES = -math.log10(0.03)  # from the lowest T to T = 1
HASH = "sha256 0123456789abcdef"
SETTINGS = {"model.n_layer": 2, "model.n_embd": 128, "data.vocab_size": 512, "trainer.max_steps": 1000}
# mean over the 7 LRs 3e-4 ... 0.3 (Wortsman's range) of |log10(lr / 0.03)|: a curve's S is its basin width x this
RANGE_MEAN_DISTANCE = float(np.mean([abs(math.log10(lr / 0.03)) for lr in GRID[:7]]))


def noise(seed: int, t: float, arm: str) -> float:
    """A deterministic wobble of mean 0 over the 16 seeds at each T: gives the seed-level intervals a spread."""
    k = (seed * 7 + TEMPS.index(t) * 5 + ("softmax", "qk_norm", "output_gate", "uniform").index(arm) * 3) % 8
    return 0.004 * (k - 3.5)


def entry(t: float, arm: str, seed: int, per_decade: float = 0.0, diverge_from: float = 3.0, floor: float = 4.0,
          growth_per_decade: float = 0.0, collapse_first: bool = True) -> dict:
    """A curve whose basin (best at lr 0.03) widens by ``per_decade`` per decade T falls (S rises by
    ``per_decade`` x RANGE_MEAN_DISTANCE per decade), non-finite from ``diverge_from`` (stopped at step 500, its
    collapse alert at step 400 when ``collapse_first``, else at 600), with G = log10(max logit growth) =
    1 - ``growth_per_decade`` x log10 T."""
    width = 0.3 + per_decade * -math.log10(t) + noise(seed, t, arm)
    g = 1.0 - growth_per_decade * math.log10(t) + noise(seed, t, arm)
    finals, nonfinite, ends, div, col = {}, {}, {}, {}, {}
    for lr in GRID:
        key, bad = str(lr), lr >= diverge_from
        nonfinite[key] = bad
        finals[key] = None if bad else floor + 0.002 * (seed - 100) + width * abs(math.log10(lr / 0.03))
        ends[key] = [[0, 2.0], [1000 if not bad else 500, 2.0 * 10**g]]
        div[key] = 500 if bad else None
        col[key] = (400 if collapse_first else 600) if bad else None
    return {"temperature": t, "arm": arm, "seed": seed, "init_loss": L0, "final_loss_by_lr": finals,
            "nonfinite_by_lr": nonfinite, "max_logit_ends_by_lr": ends, "divergence_step_by_lr": div,
            "collapse_step_by_lr": col, "collapse_logged_by_lr": {str(lr): True for lr in GRID}}


def design(softmax: float = 0.2, qk: float = 0.0, gate: float = 0.0, growth: float = 0.5, collapse_first: bool = True,
           seeds=SEEDS) -> list[dict]:
    """Every curve of the registered design. Softmax diverges from lr 1 at the lowest T and from 3 above (lr* 0.3
    against 1: finding 2 lower in every seed), the remedies from 3; uniform attention at T = 1, 0.4 nat worse."""
    curves = []
    for seed in seeds:
        for t in TEMPS:
            curves.append(entry(t, "softmax", seed, softmax, 1.0 if t == 0.03 else 3.0, growth_per_decade=growth,
                                collapse_first=collapse_first))
            curves.append(entry(t, "qk_norm", seed, qk, collapse_first=collapse_first))
            curves.append(entry(t, "output_gate", seed, gate, collapse_first=collapse_first))
        curves.append(entry(1.0, "uniform", seed, 0.0, floor=4.4))
    return curves


def part_json(name: str, curves: list[dict], baselines: dict | None = None) -> dict:
    runs = len(curves) * len(GRID)
    return {"schema": 1, "title": name, "source": f"logs/{name}",
            "lr_curves": {"grid": GRID, "curves": curves, "settings": dict(SETTINGS), "incomplete": [],
                          "baselines": baselines or {"unigram": 5.1, "bigram": 4.6}, "findings": []},
            "origin": {"sources": {HASH: runs}, "mixed": False, "commits": {"96ad315a1b2c": runs},
                       "dirty_source_runs": 0, "machines": {"AMD EPYC, 1 thread": runs}}}


def parts(tmp_path: Path, curves: list[dict], baselines: dict | None = None) -> list[Path]:
    """Two parts (seeds 100-107 and 108-115), written as report JSONs."""
    paths = []
    for name, keep in (("part-01", lambda s: s < 108), ("part-02", lambda s: s >= 108)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(part_json(name, [c for c in curves if keep(c["seed"])], baselines)))
        paths.append(path)
    return paths


def verdicts(tmp_path: Path, curves: list[dict], **kwargs) -> dict[str, dict]:
    report = wortsman.pool_registered([read_part(p) for p in parts(tmp_path, curves, **kwargs)])
    return {f["key"]: f for f in report.findings}


def test_the_family_and_its_level_are_the_registered_ones():
    assert wortsman.FAMILY == ("1s", "1q", "1g", "2", "3", "4", "5q", "5g") and wortsman.LOOKS == 5
    assert wortsman.ALPHA == pytest.approx(0.05 / 40) and wortsman.family().level == pytest.approx(0.99875)


def test_planted_effects_are_supported(tmp_path):
    found = verdicts(tmp_path, design(softmax=0.2, qk=0.2, gate=0.2, growth=0.5))
    assert list(found) == list(wortsman.FAMILY)
    assert {k: f["verdict"] for k, f in found.items()} == {
        "1s": "supported", "1q": "supported", "1g": "supported", "2": "supported", "3": "supported",
        "4": "supported", "5q": "inconclusive", "5g": "inconclusive"}  # equal slopes in every arm: R is noise
    # S = width x RANGE_MEAN_DISTANCE, so the mean slope of S per decade of T is -0.2 x that (the wobble has mean 0
    # over the seeds at each T, and the slope is linear in S)
    slope = -0.2 * RANGE_MEAN_DISTANCE
    assert found["1s"]["interval"]["estimate"] == pytest.approx(slope, abs=1e-9)
    assert found["1s"]["interval"]["level"] == pytest.approx(0.99875)
    assert found["3"]["interval"]["estimate"] == pytest.approx(-0.5, abs=1e-9)
    assert "16 lower / 0 tied / 0 higher" in found["2"]["value"] and "0.3 vs 1 in 16" in found["2"]["value"]
    assert found["2"]["value"].startswith("16 lower") and "p = 1.526e-05" in found["2"]["value"]
    # softmax: 2 diverged runs at the lowest T, 1 at each other T; each remedy: 1 per T -> 16 x (4 + 3 + 3); the
    # other 16 x 3 arms x 3 T x 9 LRs - 160 runs are stable
    assert found["4"]["value"].endswith("160 of 160; control: 0 of 1136 stable runs collapsed")
    assert "reference LR 0.3" in found["3"]["value"]


def test_remedy_effect_supported_and_not_supported(tmp_path):
    found = verdicts(tmp_path, design(softmax=0.2, qk=0.0, gate=0.4))
    # R = (0.2 - 0) x RANGE_MEAN_DISTANCE x log10(1 / 0.03) decades for QK-norm, (0.2 - 0.4) x the same for the gate
    assert found["5q"]["verdict"] == "supported" and found["5g"]["verdict"] == "not supported"
    assert found["5q"]["interval"]["estimate"] == pytest.approx(0.2 * RANGE_MEAN_DISTANCE * DECADES, abs=1e-9)
    assert found["5g"]["interval"]["estimate"] == pytest.approx(-0.2 * RANGE_MEAN_DISTANCE * DECADES, abs=1e-9)
    assert found["1q"]["verdict"] == "inconclusive" and found["1g"]["verdict"] == "supported"


def test_no_effect_is_inconclusive_and_reverse_growth_not_supported(tmp_path):
    found = verdicts(tmp_path, design(softmax=0.0, growth=-0.5, collapse_first=False))
    assert found["1s"]["verdict"] == "inconclusive"
    assert found["1s"]["interval"]["lo"] < 0 < found["1s"]["interval"]["hi"]
    assert "seeds to exclude 0" in found["1s"]["power"] or found["1s"]["power"].startswith("half-width")
    assert found["3"]["verdict"] == "not supported"
    assert found["4"]["verdict"] == "not supported" and found["4"]["value"].endswith("0 of 160; control: 0 of 1136 "
                                                                                   "stable runs collapsed")


def test_too_few_diverged_runs_and_untied_seeds_are_underpowered(tmp_path):
    curves = design(seeds=(100, 101, 108, 109))  # 4 seeds: 4 untied pairs cannot reach 0.00125; and no divergence below
    for c in curves:
        for lr in ("1.0", "3.0"):
            if c["arm"] != "softmax" or c["seed"] != 100 or c["temperature"] != 0.03:
                c["nonfinite_by_lr"][lr], c["final_loss_by_lr"][lr] = False, 5.0
    found = verdicts(tmp_path, curves)
    assert found["2"]["verdict"] == "underpowered" and found["2"]["value"].startswith("1 lower / 3 tied")
    assert found["4"]["verdict"] == "underpowered" and found["4"]["value"].startswith("2 of 2;")


def test_swapped_temperature_labels_flip_finding_one(tmp_path):
    """A planted bug: T = 0.03 and T = 1 exchanged. The slope changes sign and the verdict flips."""
    honest = verdicts(tmp_path, design(softmax=0.2))["1s"]
    swapped = design(softmax=0.2)
    for c in swapped:
        c["temperature"] = {0.03: 1.0, 1.0: 0.03}.get(c["temperature"], c["temperature"])
    for c in [c for c in swapped if c["arm"] == "uniform"]:
        c["temperature"] = 1.0  # the control stays at T = 1, where it is defined
    (tmp_path / "swapped").mkdir()
    bug = verdicts(tmp_path / "swapped", swapped)["1s"]
    assert honest["verdict"] == "supported" and bug["verdict"] == "not supported"
    assert bug["interval"]["estimate"] > 0 > honest["interval"]["estimate"]


def test_per_seed_slope_is_the_least_squares_fit_over_three_temperatures(tmp_path):
    paths = parts(tmp_path, design(softmax=0.2))
    ps = [read_part(p) for p in paths]
    curves = wortsman.all_curves(ps, wortsman.JUDGED_ARMS)
    slopes = wortsman.sensitivity_slopes(curves, "softmax")
    seed = 105
    s = [wortsman.range_sensitivity(curves, t, "softmax", seed) for t in TEMPS]
    x = np.log10(TEMPS)
    by_hand = float(np.sum((x - x.mean()) * (np.array(s) - np.mean(s))) / np.sum((x - x.mean()) ** 2))
    assert slopes[seed] == pytest.approx(by_hand, abs=1e-12) and len(slopes) == 16
    # S is over 3e-4 ... 0.3 only: the lowest T's divergence at lr 1 is not in it
    width = 0.3 + 0.2 * DECADES + noise(seed, 0.03, "softmax")
    assert s[0] == pytest.approx(width * RANGE_MEAN_DISTANCE, abs=1e-12)


def test_design_checks_come_first_and_a_failed_margin_says_not_shown_to_attend(tmp_path):
    out = tmp_path / "out"
    assert cli.main(["report", "--pool", *map(str, parts(tmp_path, design())), "--out", str(out), "--design",
                     "wortsman"]) == 0
    page = (out / "pooled.md").read_text()
    data = json.loads((out / "pooled.json").read_text())
    assert data["design"] == "wortsman" and data["attends"] and "shown to attend" in data["opening"]
    assert page.index("## Design checks") < page.index("## The registered family")
    assert "alpha = 0.00125" in page and "99.88%" in page
    for f in data["findings"]:
        assert f"| {f['key']} |" in page and f["value"] in page
    assert ARM_LABELS["output_gate"] in page

    (tmp_path / "b").mkdir()
    weak = parts(tmp_path / "b", design(), baselines={"unigram": 5.1, "bigram": 4.05})  # bigram within 0.1 nat
    out2 = tmp_path / "out2"
    assert cli.main(["report", "--pool", *map(str, weak), "--out", str(out2), "--design", "wortsman"]) == 0
    data = json.loads((out2 / "pooled.json").read_text())
    assert not data["attends"] and [b["criterion"] for b in data["baselines"]] == ["met", "not met", "met"]
    assert "not met against bigram: the model is not shown to attend" in data["opening"]
    assert "**The model is not shown to attend**" in (out2 / "pooled.md").read_text()


def test_refusals_name_the_problem(tmp_path, capsys):
    paths = parts(tmp_path, design())
    assert cli.main(["report", "--pool", *map(str, paths), "--out", str(tmp_path / "o"), "--earlier-looks", "3",
                     "--design", "wortsman"]) == 2
    assert "registered 4 earlier looks" in capsys.readouterr().err
    assert cli.main(["report", "--pool", *map(str, paths), "--out", str(tmp_path / "o")]) == 2  # not by the old family
    assert "pool them with --design wortsman" in capsys.readouterr().err and not (tmp_path / "o").exists()
    missing = [c for c in design() if not (c["arm"] == "qk_norm" and c["temperature"] == 0.1)]
    (tmp_path / "m").mkdir()
    with pytest.raises(PartError, match=r"part-01\.json: .*qk_norm arm at T in \[0\.03, 0\.1, 1\.0\], this part has "
                                        r"\[0\.03, 1\.0\]"):
        wortsman.pool_registered([read_part(p) for p in parts(tmp_path / "m", missing)])
    half = design()
    del half[0]["collapse_step_by_lr"]
    (tmp_path / "h").mkdir()
    with pytest.raises(PartError, match=r"curves\[0\]: has collapse_logged_by_lr, "
                                        r"divergence_step_by_lr, max_logit_ends_by_lr but not every one"):
        read_part(parts(tmp_path / "h", half)[0])


def test_the_earlier_pooled_page_is_pooled_py_s_and_unchanged(tmp_path):
    """Parts without the gated arm get `study.report.pooled`'s page: the committed one, byte for byte."""
    root = Path(__file__).resolve().parents[1] / "docs" / "results" / "scratch-pooled"
    committed = json.loads((root / "pooled.json").read_text())
    assert cli.main(["report", "--pool", *(p["path"] for p in committed["parts"]), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "pooled.json").read_text() == (root / "pooled.json").read_text()
    assert (tmp_path / "pooled.md").read_text() == (root / "pooled.md").read_text()


def test_the_runs_mechanism_fields_round_trip_through_the_report_json():
    """`lrcurves.mechanism_by_lr` written, `pooled.read_part` read back: the divergence step of a finite run (its
    training loss above L0 at step 300), the collapse before it and the max-logit growth are the report's."""
    from study.report import lrcurves, pooled

    def run(lr: float, diverges: bool) -> lrcurves.LRRun:
        return lrcurves.LRRun(f"lr {lr}", 0.03, "softmax", 100, lr, L0, 8.0 if diverges else 4.0,
                              train_loss=((0, 7.0), (100, 6.0), (300, 7.5), (400, 9.0)) if diverges else ((0, 7.0),),
                              max_logit=((0, 2.0), (500, 20.0), (1000, 200.0)), collapse_step=200 if diverges else None)

    original = lrcurves.Curve(0.03, "softmax", 100, {0.1: run(0.1, False), 1.0: run(1.0, True)})
    entry = {"temperature": 0.03, "arm": "softmax", "seed": 100, "init_loss": L0,
             "final_loss_by_lr": {str(lr): r.final_loss for lr, r in original.runs.items()},
             "nonfinite_by_lr": {str(lr): r.nonfinite for lr, r in original.runs.items()},
             **json.loads(json.dumps(lrcurves.mechanism_by_lr(original)))}
    back = pooled._curve(entry, [0.1, 1.0], Path("part.json"), "lr_curves.curves[0]")
    for lr, r in original.runs.items():
        b = back.runs[lr]
        assert (b.diverged, b.divergence_step, b.collapse_step, b.collapse_before_divergence) == (
            r.diverged, r.divergence_step, r.collapse_step, r.collapse_before_divergence)
        assert lrcurves.logit_growth(b) == pytest.approx(lrcurves.logit_growth(r)) == pytest.approx(2.0)
    assert back.runs[1.0].divergence_step == 300 and back.runs[1.0].collapse_before_divergence


def test_parts_with_a_gated_arm_outside_the_registered_design_get_the_earlier_page(tmp_path):
    """`make quick`'s tiny sweep runs the gated arm at T = 0.1 and 1 only: the default design pools it as before."""
    quick_like = [c for c in design() if c["temperature"] != 0.03]
    out = tmp_path / "out"
    assert cli.main(["report", "--pool", *map(str, parts(tmp_path, quick_like)), "--out", str(out)]) == 0
    assert json.loads((out / "pooled.json").read_text()).get("design") != "wortsman"
