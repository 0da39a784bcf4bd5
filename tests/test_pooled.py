"""The pooled from-scratch page (study.report.pooled): pooling against hand arithmetic, finding 1 over Wortsman's
range against the whole grid, the stratified sign test, the baselines' margins, the refusals, and a page whose
numbers are the JSON's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from study import cli
from study.report.pooled import (
    PartError,
    fixed_effect,
    pool,
    pooled_markdown,
    random_effects,
    read_part,
    write_pooled,
)
from study.report.stats import fmt, percent

GRID = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0]
L0 = 7.0
HASH = "sha256 0123456789abcdef"


def losses(seed: int, diverge_from: float, floor: float = 4.0, width: float = 0.3
           ) -> tuple[dict[float, float | None], dict[float, bool]]:
    """A basin with its best at lr 0.03 (``floor`` + 0.01 x seed), rising by ``width`` per decade away from it,
    non-finite at every LR >= ``diverge_from``."""
    finals, nonfinite = {}, {}
    for lr in GRID:
        nonfinite[lr] = lr >= diverge_from
        finals[lr] = None if nonfinite[lr] else floor + width * abs(math.log10(lr / 0.03)) + 0.01 * seed
    return finals, nonfinite


def entry(t: float, arm: str, seed: int, diverge_from: float, floor: float = 4.0, width: float = 0.3) -> dict:
    finals, nonfinite = losses(seed, diverge_from, floor, width)
    return {"temperature": t, "arm": arm, "seed": seed, "sensitivity": None, "largest_stable_lr": None, "init_loss": L0,
            "final_loss_by_lr": {str(lr): finals[lr] for lr in GRID},
            "nonfinite_by_lr": {str(lr): nonfinite[lr] for lr in GRID}}


SETTINGS = {"model.n_layer": 2, "model.n_embd": 64, "data.vocab_size": 2048, "trainer.max_steps": 200}


def part_json(name: str, curves: list[dict], source_hash: str | None = HASH, grid: list[float] = GRID,
              baselines: dict | None = None, settings: dict | None = None, commit: str = "96ad315a1b2c") -> dict:
    data = {"schema": 1, "title": name, "source": f"logs/{name}", "model": None,
            "lr_curves": {"grid": grid, "temperatures": sorted({c["temperature"] for c in curves}), "curves": curves,
                          "settings": dict(settings or SETTINGS), "incomplete": [],
                          "findings": [{"key": k, "verdict": "inconclusive", "value": f"{name} {k} value"}
                                       for k in ("1", "2", "3a", "3b", "4a", "4b")]}}
    if baselines is not None:
        data["lr_curves"]["baselines"] = baselines
    if source_hash is not None:
        runs = len(curves) * len(grid)
        data["origin"] = {"sources": {source_hash: runs}, "mixed": False, "commits": {commit: runs},
                          "dirty_source_runs": 0, "machines": {"AMD EPYC, AVX512, 1 thread": runs}}
    return data


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['title']}.json"
    path.write_text(json.dumps(data))
    return path


def divergence_at_one(seeds: range) -> list[dict]:
    """Softmax curves where the lowest T diverges from lr 1 and T = 1 from lr 3 only; identical losses otherwise."""
    return [entry(t, "softmax", s, 1.0 if t == 0.03 else 3.0) for s in seeds for t in (0.03, 1.0)]


def test_fixed_and_random_effects_by_hand():
    means, ses = [-0.5, -0.2, -0.1], [0.1, 0.2, 0.1]
    w = [1 / 0.1**2, 1 / 0.2**2, 1 / 0.1**2]  # 100, 25, 100
    fixed_value = (100 * -0.5 + 25 * -0.2 + 100 * -0.1) / 225  # -65 / 225
    z = 1.959963984540054  # the normal's 97.5% quantile (a 95% interval)
    got = fixed_effect(means, ses, 0.95)
    assert got.estimate == pytest.approx(fixed_value) and got.se == pytest.approx(1 / 15)
    assert (got.lo, got.hi) == pytest.approx((fixed_value - z / 15, fixed_value + z / 15))

    q = sum(wi * (y - fixed_value) ** 2 for wi, y in zip(w, means))
    assert q == pytest.approx(8.2222222, rel=1e-6)  # 100 (0.2111)^2 + 25 (0.0889)^2 + 100 (0.1889)^2
    c = 225 - (100**2 + 25**2 + 100**2) / 225
    tau2 = (q - 2) / c
    w_star = [1 / (s**2 + tau2) for s in ses]
    random_value = sum(wi * y for wi, y in zip(w_star, means)) / sum(w_star)
    se = 1 / math.sqrt(sum(w_star))
    got = random_effects(means, ses, 0.95)
    assert got.q == pytest.approx(q) and got.df == 2 and got.tau2 == pytest.approx(tau2)
    assert got.estimate == pytest.approx(random_value) and got.se == pytest.approx(se)
    assert (got.lo, got.hi) == pytest.approx((random_value - z * se, random_value + z * se))
    assert got.i2 == pytest.approx((q - 2) / q)


def test_random_effects_is_fixed_and_i2_is_zero_when_q_below_df():
    means, ses = [0.0, 0.01, -0.01], [0.1, 0.1, 0.1]
    got = random_effects(means, ses, 0.95)
    assert got.q == pytest.approx(100 * (0.01**2 + 0.01**2)) and got.q < got.df
    assert got.tau2 == 0.0 and got.i2 == 0.0
    fixed = fixed_effect(means, ses, 0.95)
    assert (got.estimate, got.lo, got.hi) == pytest.approx((fixed.estimate, fixed.lo, fixed.hi))


def test_finding1_over_wortsman_range_is_flat_when_only_lr_one_diverges(tmp_path):
    report = pool([read_part(write(tmp_path, part_json("a", divergence_at_one(range(4)))))])
    assert report.finding1.lr_range == [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]
    assert report.finding1.strata[0].mean == 0.0 and report.finding1.strata[0].n == 4
    assert report.finding1.verdict == "inconclusive"  # an interval [0, 0] lies on neither side
    assert report.finding1_old.lr_range == GRID
    assert report.finding1_old.strata[0].mean < 0  # the whole grid: lr 1 alone makes the slope negative
    assert report.finding1_old.verdict == "not judged (old definition)"
    assert report.finding2.lower == 4 and report.finding2.deciding == {"0.3 vs 1": 4}


def test_stratified_sign_test_sums_counts_over_strata(tmp_path):
    # part a: 4 seeds lower (0.3 vs 1), 1 tied; part b: 3 lower, 1 higher (1 vs 0.3)
    a = divergence_at_one(range(4)) + [entry(t, "softmax", 4, 3.0) for t in (0.03, 1.0)]
    b = divergence_at_one(range(10, 13)) + [entry(0.03, "softmax", 13, 3.0), entry(1.0, "softmax", 13, 1.0)]
    report = pool([read_part(write(tmp_path, part_json("a", a))), read_part(write(tmp_path, part_json("b", b)))])
    f2 = report.finding2
    assert [(s.lower, s.tied, s.higher) for s in f2.strata] == [(4, 1, 0), (3, 0, 1)]
    assert (f2.lower, f2.tied, f2.higher) == (7, 1, 1)
    assert f2.p == pytest.approx((8 + 1) / 2**8)  # P(X >= 7 of 8) = (C(8,7) + C(8,8)) / 256
    assert report.alpha == pytest.approx(0.05 / (2 * 4)) and report.looks == 4
    assert f2.verdict == "inconclusive"  # 0.035 > 0.00625
    assert f2.deciding == {"0.3 vs 1": 7, "1 vs 0.3": 1}
    assert pool([read_part(write(tmp_path, part_json("a", a)))], earlier_looks=0).alpha == pytest.approx(0.05 / 2)


def test_baseline_margins_and_the_tenth_of_a_nat(tmp_path):
    curves = divergence_at_one(range(4))
    curves += [entry(1.0, "uniform", s, 3.0, floor=4.5) for s in range(4)]
    curves[1] = entry(1.0, "softmax", 0, 0.001)  # seed 0 at T = 1: every run non-finite
    data = part_json("a", curves, baselines={"unigram": 7.5, "bigram": 4.05})
    report = pool([read_part(write(tmp_path, data))])
    margins = {b.baseline: b for b in report.baselines}
    assert report.no_stable_seeds == ["a seed 0"]
    # softmax's best at T = 1: 4.0 + 0.01 seed (seeds 1, 2, 3)
    assert margins["unigram"].interval.estimate == pytest.approx(7.5 - 4.02) and margins["unigram"].criterion == "met"
    assert margins["bigram"].interval.estimate == pytest.approx(0.03) and margins["bigram"].criterion == "not met"
    assert margins["uniform attention"].interval.estimate == pytest.approx(0.5)  # paired: the same seed's offset
    assert margins["uniform attention"].criterion == "met" and margins["uniform attention"].n == 3
    no_baselines = pool([read_part(write(tmp_path, part_json("b", divergence_at_one(range(3)))))])
    assert [b.criterion for b in no_baselines.baselines] == ["not logged"] * 3


def test_old_committed_json_is_refused_naming_the_field():
    with pytest.raises(PartError, match=r"scratch\.json: lr_curves\.curves\[0\]\.final_loss_by_lr: missing"):
        read_part("docs/results/scratch.json")


@pytest.mark.parametrize(("breaks", "field"), [
    (lambda d: d.pop("schema"), "schema"),
    (lambda d: d.pop("lr_curves"), "lr_curves"),
    (lambda d: d["lr_curves"]["curves"][0]["nonfinite_by_lr"].pop("3.0"), r"curves\[0\]\.nonfinite_by_lr"),
    (lambda d: d["lr_curves"]["curves"][0].update(arm="topk"), r"curves\[0\]\.arm"),
    # not from one clean commit, or not one experiment
    (lambda d: d.pop("origin"), r"origin: missing"),
    (lambda d: d["origin"]["sources"].update({"unrecorded": 3}), r"origin\.sources: 3 run\(s\) recorded no source hash"),
    (lambda d: d["origin"].update(dirty_source_runs=2), r"origin\.dirty_source_runs: 2 run\(s\)"),
    (lambda d: d["origin"]["commits"].update({"abcdef012345": 1}), r"origin\.commits: expected the runs of one commit"),
    (lambda d: d["lr_curves"].pop("settings"), r"lr_curves\.settings: missing"),
    (lambda d: d["lr_curves"]["settings"].update({"model.n_layer": "mixed"}), r"lr_curves\.settings: its runs differ in model\.n_layer"),
])  # fmt: skip
def test_a_bad_part_is_refused_naming_file_and_field(tmp_path, breaks, field):
    data = part_json("bad", divergence_at_one(range(3)))
    breaks(data)
    with pytest.raises(PartError, match=rf"bad\.json: .*{field}"):
        read_part(write(tmp_path, data))


def test_parts_of_different_source_hashes_or_grids_are_refused(tmp_path):
    a = read_part(write(tmp_path, part_json("a", divergence_at_one(range(3)))))
    b = read_part(write(tmp_path, part_json("b", divergence_at_one(range(10, 13)), source_hash="sha256 fedcba9876543210")))
    with pytest.raises(PartError, match=r"a\.json has sha256 0123456789abcdef, .*b\.json has sha256 fedcba9876543210"):
        pool([a, b])
    short = GRID[:-1]
    curves = [{**c, "final_loss_by_lr": {k: v for k, v in c["final_loss_by_lr"].items() if k != "3.0"},
               "nonfinite_by_lr": {k: v for k, v in c["nonfinite_by_lr"].items() if k != "3.0"}}
              for c in divergence_at_one(range(20, 23))]
    c = read_part(write(tmp_path, part_json("c", curves, grid=short)))
    with pytest.raises(PartError, match=r"c\.json: lr_curves\.grid .* differs from .*a\.json"):
        pool([a, c])


def test_page_and_cli_carry_the_json_numbers(tmp_path, capsys):
    def wobbly(seeds: range, steepen: float) -> list[dict]:  # a wider basin at the lowest T, more so per seed
        return [entry(t, "softmax", s, 1.0 if t == 0.03 and s != 1 else 3.0,
                      width=0.3 + steepen * (s + 1) * (t == 0.03)) for s in seeds for t in (0.03, 1.0)]

    a = write(tmp_path, part_json("a", wobbly(range(4), 0.02) + [entry(1.0, "uniform", s, 3.0, 4.5) for s in range(4)],
                                  baselines={"unigram": 7.5, "bigram": 5.0}))
    b = write(tmp_path, part_json("b", wobbly(range(10, 13), 0.1)))
    out = tmp_path / "out"
    assert cli.main(["report", "--pool", str(a), str(b), "--out", str(out)]) == 0
    data = json.loads((out / "pooled.json").read_text())
    page = (out / "pooled.md").read_text()
    assert page == pooled_markdown(pool([read_part(a), read_part(b)]))
    f1, f2 = data["finding1"], data["finding2"]
    numbers = [fmt(f1["seed_level"]["estimate"]), fmt(f1["seed_level"]["lo"]), fmt(f1["seed_level"]["hi"]),
               fmt(data["finding1_old"]["seed_level"]["estimate"]), fmt(data["alpha"]), percent(data["level"]),
               fmt(f2["p"]), f"T = 1 in {f2['lower']} seeds", f"tied in {f2['tied']}", data["source_hash"],
               *(fmt(b["interval"]["estimate"]) for b in data["baselines"] if b["interval"]),
               *(fmt(s["mean"]) for s in data["finding1"]["strata"])]
    numbers += [fmt(f1["fixed"]["estimate"]), fmt(f1["random"]["estimate"]), fmt(f1["random"]["tau2"]),
                percent(f1["random"]["i2"]), fmt(f1["random"]["q"])]
    for number in numbers:
        assert number in page, number
    assert "a 3a value" in page and "b 4b value" in page  # the parts' own verdicts carried
    assert data["looks"] == 4 and "the fourth analysis of the same two claims" in page


def test_cli_refuses_symlinked_outputs_and_a_sweep_folder_with_pool(tmp_path, capsys):
    a = write(tmp_path, part_json("a", divergence_at_one(range(3))))
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere.md"
    elsewhere.write_text("keep")
    (out / "pooled.md").symlink_to(elsewhere)
    assert cli.main(["report", "--pool", str(a), "--out", str(out)]) == 2
    assert "symbolic link" in capsys.readouterr().err and elsewhere.read_text() == "keep"
    assert cli.main(["report", str(tmp_path), "--pool", str(a), "--out", str(out)]) == 2
    assert cli.main(["report", "--pool", str(a)]) == 2  # --out is required
    assert not (out / "pooled.json").exists()
    with pytest.raises(PartError, match="symbolic link"):
        write_pooled([a], out)


def test_parts_of_different_settings_are_refused_and_one_title_twice_is_told_apart(tmp_path):
    a = read_part(write(tmp_path, part_json("a", divergence_at_one(range(3)))))
    b = read_part(write(tmp_path, part_json("b", divergence_at_one(range(10, 13)),
                                            settings={**SETTINGS, "model.n_layer": 4})))
    with pytest.raises(PartError, match=r"b\.json: model\.n_layer 4 differs from .*a\.json's 2: not one experiment"):
        pool([a, b])
    twin = tmp_path / "twin"
    twin.mkdir()
    c = read_part(write(twin, part_json("a", divergence_at_one(range(10, 13)))))
    c.path = str(twin / "a-rerun.json")
    assert [s.name for s in pool([a, c]).finding1.strata] == ["a (a)", "a (a-rerun)"]


def test_a_seed_in_two_parts_is_refused(tmp_path):
    a = read_part(write(tmp_path, part_json("a", divergence_at_one(range(5)))))
    b = read_part(write(tmp_path, part_json("b", divergence_at_one(range(4, 8)))))
    with pytest.raises(PartError, match=r"seed 4 is in .*a\.json and in .*b\.json"):
        pool([a, b])


def test_parts_of_two_commits_are_refused(tmp_path):
    a = read_part(write(tmp_path, part_json("a", divergence_at_one(range(3)))))
    b = read_part(write(tmp_path, part_json("b", divergence_at_one(range(10, 13)), commit="0123456789ab")))
    with pytest.raises(PartError, match="2 commits"):
        pool([a, b])


def test_every_curve_and_seed_left_out_is_named(tmp_path):
    curves = divergence_at_one(range(4))
    curves = [c for c in curves if not (c["seed"] == 3 and c["temperature"] == 0.03)]  # seed 3 has T = 1 only
    curves += [entry(1.0, "uniform", 1, 0.001)]  # a uniform curve with no stable run
    data = part_json("a", curves)
    data["lr_curves"]["incomplete"] = [{"temperature": 0.03, "arm": "softmax", "seed": 3, "missing_lrs": [3.0]}]
    report = pool([read_part(write(tmp_path, data))])
    assert report.finding1.strata[0].n == 3
    assert report.left_out == ["a: softmax T=0.03 seed 3 (no run at lr 3)",
                               "a: softmax seed 3 (no complete curve at both T = 0.03 and T = 1)"]
    assert report.no_stable_seeds == ["a seed 1 (uniform attention)"]
    page = pooled_markdown(report)
    assert "softmax seed 3 (no complete curve" in page and "a seed 1 (uniform attention)" in page
