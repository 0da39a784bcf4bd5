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
