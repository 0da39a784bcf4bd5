"""Theorem 1 as an effect size in the report: intervals over windows from synthetic per-window values, the
N*-against-heads table with the layers' indices, one figure per L, report.json's block."""

from __future__ import annotations

import math

import numpy as np
import pytest

from study.report import critical_effect as C


def results(windows: int = 5) -> dict:
    rng = np.random.default_rng(0)
    ns = [1, 4, 16]
    ks = [[0.9 - 0.2 * j + 0.01 * rng.standard_normal() for j in range(3)] for _ in range(windows)]
    ratio = [[8.0 / 2**j * math.exp(0.05 * rng.standard_normal()) for j in range(3)] for _ in range(windows)]
    return {"choices": {"layers": [0, 15, 29]}, "model": {"layers": 30, "heads": 9},
            "alg3_effect_size": {"heads": 27, "by_length": [{"length": 64, "ns": ns, "n_over_length": [n / 64 for n in ns],
                                                              "ks": ks, "d_over_e": ratio}]},
            "alg3_n_star_by_heads": [
                {"layer_positions": [0], "heads": 9, "lengths": [64], "n_star": [{"0.01": 1}],
                 "n_star_over_length": [{"0.01": 1 / 64}]},
                {"layer_positions": [0, 1, 2], "heads": 27, "lengths": [64], "n_star": [{"0.01": None}],
                 "n_star_over_length": [{"0.01": None}]}]}


def test_effect_sizes_have_intervals_over_windows():
    res = results()
    curve = C.effect_sizes(res)[0]
    ks = [w[0] for w in res["alg3_effect_size"]["by_length"][0]["ks"]]
    first = curve["points"][0]
    assert first["ks"].n == 5 and first["ks"].estimate == pytest.approx(np.mean(ks))
    assert first["ks"].lo < first["ks"].estimate < first["ks"].hi
    ratio = [w[0] for w in res["alg3_effect_size"]["by_length"][0]["d_over_e"]]
    assert first["d_over_e"].estimate == pytest.approx(math.exp(np.mean(np.log(ratio))))  # geometric mean
    assert C.effect_sizes(results(windows=2))[0]["points"][0]["ks"] is None  # 2 windows: no interval


def test_section_table_figure_and_json(tmp_path):
    res = results()
    names = C.draw(res, tmp_path)
    assert names == ["theorem1_effect_L64.png"] and (tmp_path / names[0]).stat().st_size > 0
    text = "\n".join(C.section(res, names))
    assert "| 0 | 9 | 0.0156 |" in text and "| 0, 15, 29 | 27 | > L |" in text  # layer indices, not positions
    assert "N/L = 0.0625 (nearest the paper's 0.06)" in text and f"]({names[0]})" in text
    data = C.effect_json(res)
    point = data["curves"][0]["points"][1]
    assert point["n"] == 4 and set(point["ks"]) == {"estimate", "lo", "hi", "n", "level"}
    assert data["n_star_by_heads"][1]["layers"] == [0, 15, 29]
    assert C.section({}, []) == [] and C.effect_json(None)["curves"] == []


def test_build_report_writes_the_section_figure_and_json(tmp_path):
    """End to end through build_report: a sweep folder whose only data is `study analyze`'s results.json."""
    import json

    from study.report import build_report

    (tmp_path / "plan.json").write_text(json.dumps({"sweep": "frozen only", "runs": []}))
    (tmp_path / "analyze").mkdir()
    (tmp_path / "analyze" / "results.json").write_text(json.dumps(results()))
    path = build_report(tmp_path)
    assert "## Theorem 1: effect size and the KS design" in path.read_text()
    assert (path.parent / "theorem1_effect_L64.png").stat().st_size > 1000
    data = json.loads((path.parent / "report.json").read_text())
    assert data["theorem1_effect_size"]["curves"][0]["points"][0]["ks"]["n"] == 5


# ---- N* is design-dependent: d/E at 9, 27 and 54 pooled heads beside it -------------------------------------------
LENGTHS = [64, 128, 256]
CRITICAL_NS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def planted_layers(layers: int = 6, heads: int = 9, windows: int = 8) -> list[dict]:
    """Per-head d and E of 6 layers x 9 heads as Algorithm 3's layer step hands them on: E spread over heads, d = E x
    (1 + 0.5 / (N/L)) x a head factor, with window noise. d/E falls smoothly towards 1 as N/L grows."""
    import torch

    rng = np.random.default_rng(4)
    out = []
    for _ in range(layers):
        e_head = np.exp(0.3 * rng.standard_normal(heads))
        d_head = np.exp(0.2 * rng.standard_normal(heads))
        dw = np.empty((windows, len(LENGTHS), len(CRITICAL_NS), heads))
        ew = np.empty_like(dw)
        for li, n_len in enumerate(LENGTHS):
            for g, n in enumerate(CRITICAL_NS):
                for w in range(windows):
                    e = e_head * np.exp(0.05 * rng.standard_normal(heads))
                    ew[w, li, g] = e
                    dw[w, li, g] = e * (1 + 0.5 / (n / n_len)) * d_head * np.exp(0.05 * rng.standard_normal(heads))
        d, e = torch.tensor(dw), torch.tensor(ew)
        out.append({"d_windows": d, "e_windows": e, "d": d.mean(0), "e": e.mean(0)})
    return out


def test_head_sample_spreads_over_the_layers_and_nests():
    from study.frozen.analysis.critical import head_sample

    assert head_sample(54, 9) == list(range(0, 54, 6)) and head_sample(54, 27) == list(range(0, 54, 2))
    assert set(head_sample(54, 9)) <= set(head_sample(54, 27)) <= set(head_sample(54, 54)) == set(range(54))


def test_n_star_rows_are_design_dependent_beside_d_over_e_at_9_27_54_heads():
    """Through Algorithm 3's own results step (the per-window KS tests and the per-count block) into the report: both
    N* rows carry the label, outside the family, value kept, and d/E at 9, 27 and 54 heads equals the hand
    computation from the same per-head values (mean over the sampled heads of d over that of E, geometric mean over
    windows)."""
    from types import SimpleNamespace

    from study.frozen.analysis import critical
    from study.report import frozen as Z
    from study.report.stats import DESIGN_DEPENDENT, tests_something

    layers = planted_layers()
    settings = SimpleNamespace(grids=SimpleNamespace(lengths=LENGTHS, critical_ns=CRITICAL_NS), alphas=[0.01, 0.05])
    res = critical._results(settings, layers)
    res["choices"] = {"alphas": [0.01, 0.05], "lengths": LENGTHS}
    block = res["alg3_effect_size_by_heads"]
    assert block["heads_total"] == 54 and [s["heads"] for s in block["subsets"]] == [9, 27, 54]

    d = np.concatenate([layer["d_windows"].numpy() for layer in layers], axis=-1)  # (windows, L, N, 54)
    e = np.concatenate([layer["e_windows"].numpy() for layer in layers], axis=-1)

    def by_hand(heads: int, n: int) -> float:
        idx = critical.head_sample(54, heads)
        g = CRITICAL_NS.index(n)
        ratios = d[:, -1, g, idx].mean(-1) / e[:, -1, g, idx].mean(-1)
        return float(np.exp(np.mean(np.log(ratios))))

    rows = C.effect_by_heads(res)
    assert [(r["heads"], r["length"], r["windows"]) for r in rows] == [(9, 256, 8), (27, 256, 8), (54, 256, 8)]
    for r in rows:
        at = {p["n"]: p["d_over_e"] for p in r["points"]}
        for n in (16, 128):  # N/L = 0.0625 and 0.5 at L = 256: the two points a row shows
            assert at[n].estimate == pytest.approx(by_hand(r["heads"], n), rel=1e-9)
            assert at[n].lo < at[n].estimate < at[n].hi and at[n].n == 8
        # the effect size is the same curve at every count: 1 + 0.5 / (N/L) times the heads' mean factor
        assert at[16].estimate == pytest.approx(9.0, rel=0.35) and at[128].estimate == pytest.approx(2.0, rel=0.35)
    found = {f.claim.split(" (")[0]: f for f in Z.frozen_findings(res)}
    for claim in ("3. critical N* ~ 0.06 L", "3. critical N* grows in proportion to L"):
        f = found[claim]
        assert f.verdict == DESIGN_DEPENDENT and not tests_something(f)
        assert "from 9, 27 and 54 heads sampled evenly out of the 54 pooled" in f.value
        for r in rows:
            at = {p["n"]: p["d_over_e"] for p in r["points"]}
            assert f"{r['heads']} heads (N*/L " in f.value and f"0.0625: {at[16]} | 0.5: {at[128]}" in f.value
        assert "its rule, which would read" in f.rule
    text = "\n".join(C.section(res, []))
    assert "| heads pooled | N*/L (alpha 0.01) | N*/L (alpha 0.05) | d/E at N/L ~ 0.03 |" in text
    assert C.effect_json(res)["effect_by_heads"][0]["heads"] == 9


def test_an_older_results_json_says_the_counts_are_missing_and_gives_every_head():
    note = C.design_note(results(), 0.01)
    assert note.startswith("design-dependent") and "not in this results.json" in note and "all 27 pooled heads" in note
    assert C.design_note({}, 0.01).endswith("no per-window d/E in this results.json")
