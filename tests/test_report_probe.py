"""The probe's findings and report section (`study.report.probe`) on synthetic probe.json data where the answer is
known: a single-layer slope of -1 is supported, -0.3 and -4.7 are not (with their side), an fp32 value far from
fp64 is numerically unreliable, and depth compounding is described as such."""

from __future__ import annotations

import math

import pytest

from study.report import findings as F
from study.report import probe as P
from study.report.probe_section import section
from study.report.stats import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED

TEMPS = (0.001, 0.003, 0.01, 0.03, 0.1, 1.0, 10.0)
WINDOWS = 20


def noise(w: int) -> float:
    return 1 + 0.05 * math.sin(3.7 * w + 1.3)  # window-to-window spread, the same at every T (paired)


def jacobian() -> dict:
    return {"saturated_fraction": 0.1, "entry_max_times_4T": 0.99, "entry_frac_above_0.5": 0.4,
            "entry_frac_above_0.9": 0.1, "max_times_2T": 0.97}  # fmt: skip


def single(layer: int, power: float, fp64_scale: float = 1.0) -> dict:
    results = []
    for t in TEMPS:
        windows = [{"grad_attn_qk": t**power * noise(w), "loss": 3.0} for w in range(WINDOWS)]
        r = {"temperature": t, "windows": windows, "jacobian": jacobian(), "grad_attn_qk": t**power}
        if t <= 0.01:
            r["fp64"] = {"grad_attn_qk": [windows[w]["grad_attn_qk"] * fp64_scale for w in range(2)]}
        results.append(r)
    return {"layer": layer, "results": results}


def probe(*singles: dict, layers: int = 4) -> dict:
    results = []
    for t in TEMPS:
        # T in every layer: layer l's gradient crosses (layers - l) low-T layers, each one multiplying it by T^-1
        per_layer = {kind: [[t ** -(layers - layer) * noise(w) for w in range(WINDOWS)] for layer in range(layers)]
                     for kind in ("attn_qk", "attn_v", "attn_out", "mlp", "residual")}  # fmt: skip
        windows = [{"grad_attn_qk": t ** -layers * noise(w)} for w in range(WINDOWS)]
        results.append({"temperature": t, "windows": windows, "layers": per_layer, "jacobian": jacobian(),
                        "grad_attn_qk": t ** -layers})  # fmt: skip
    return {"model": "tiny", "text": "shakespeare", "windows": WINDOWS, "seq_len": 64, "results": results,
            "single_layer": list(singles)}  # fmt: skip


def test_single_layer_slope_is_judged_two_sided_in_the_regime():
    found = F.probe_findings(probe(single(0, -1.0), single(1, -0.3), single(2, -4.7)))
    assert [f.verdict for f in found] == [SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED]
    assert "shallower than T^-1" in found[1].value and "steeper than T^-1" in found[2].value
    assert all(f.paper_value == "1/T" and f.experiment == "probe" for f in found)
    assert found[0].value.startswith("-1 [") and "T <= 0.1" in found[0].statistic
    assert F.probe_findings(None) == []


def test_the_verdict_uses_only_the_low_t_regime():
    """A gradient that follows 1/T for T <= 0.1 and flattens above (saturation elsewhere) is judged on the regime."""
    bent = single(0, -1.0)
    for r in bent["results"]:
        if r["temperature"] > 0.1:
            for w in r["windows"]:
                w["grad_attn_qk"] = 0.1**-1 * 1.01
    assert F.probe_findings(probe(bent))[0].verdict == SUPPORTED
    flat_at_low_t = single(0, 0.0)
    assert F.probe_findings(probe(flat_at_low_t))[0].verdict == NOT_SUPPORTED


def test_fp32_far_from_fp64_is_numerically_unreliable():
    (found,) = F.probe_findings(probe(single(0, -1.0, fp64_scale=3.0)))
    assert found.verdict == P.UNRELIABLE and "fp32/fp64 0.333 at T=0.001" in found.value
    (close,) = F.probe_findings(probe(single(0, -1.0, fp64_scale=1.01)))
    assert close.verdict == SUPPORTED


def test_too_few_temperatures_in_the_regime_is_inconclusive():
    short = single(0, -1.0)
    short["results"] = [r for r in short["results"] if r["temperature"] in (0.1, 1.0, 10.0)]
    (found,) = F.probe_findings(probe(short))
    assert found.verdict == INCONCLUSIVE and "too few" in found.value


def test_local_slopes_and_per_layer_slopes():
    levels = {0.01: [100.0, 100.0], 0.1: [10.0, 10.0], 1.0: [10.0, 10.0]}
    assert P.local_slopes(levels) == [(0.01, 0.1, pytest.approx(-1.0)), (0.1, 1.0, pytest.approx(0.0))]
    slopes = P.layer_slopes(probe(layers=4))
    assert slopes["attn_qk"] == pytest.approx([-4.0, -3.0, -2.0, -1.0])
    assert slopes["mlp"] == pytest.approx([-4.0, -3.0, -2.0, -1.0])


def test_depth_compounding_is_described_for_every_parameter_type():
    text = P.depth_statement(P.layer_slopes(probe(layers=4)))
    assert "layer 0 grows like T^-4" in text and "layer 3 like T^-1" in text and "(1 per layer of depth)" in text
    assert "the steeper its slope: gradients compound through depth" in text and "nothing there is specific to the attention logits" in text
    flat = probe(layers=4)
    for r in flat["results"]:
        for kind in r["layers"]:
            r["layers"][kind] = [[r["temperature"] ** -1 for _ in range(WINDOWS)] for _ in range(4)]
    assert "about the same slope at every depth" in P.depth_statement(P.layer_slopes(flat))


def test_section_has_the_tables_and_draws_the_figure(tmp_path):
    data = probe(single(0, -1.0), single(3, -0.5))
    lines = "\n".join(section(data, P.draw_layers(data, tmp_path) and P.FIGURE))
    assert (tmp_path / P.FIGURE).stat().st_size > 1000
    for heading in ("## Probe (frozen model, no training)", "### Local slopes", "### fp32 against the fp64 reference",
                    "### Corollary 3 entrywise", "### Per-layer slopes against T"):  # fmt: skip
        assert heading in lines, heading
    assert "| 0.001 - 0.003 (regime) | -4 | -1 | -0.5 |" in lines
    assert "| 1 - 10 | -4 | -1 | -0.5 |" in lines
    assert section(None) == []


def test_every_layer_description_leaves_out_temperatures_where_fp32_is_unreliable():
    data = probe(layers=4)
    first = data["results"][0]  # T = 0.001
    first["fp64"] = {"grad_attn_qk": [w["grad_attn_qk"] * 40 for w in first["windows"][:2]]}
    assert P.described_temperatures(data) == [0.003, 0.01, 0.03, 0.1, 1.0]
    text = "\n".join(section(data))
    assert "numerically unreliable at T=0.001 (fp32/fp64 = 0.025)" in text and "fitted on T = 0.003, 0.01" in text
    assert P.layer_slopes(data)["attn_qk"] == pytest.approx([-4.0, -3.0, -2.0, -1.0])
