"""`study bench` on a tiny model: the report's structure, not the budgets (CI machines are too noisy for those)."""

from __future__ import annotations

import json
import math

from study.bench import (
    SHAPES,
    Settings,
    Shape,
    main,
    parse_args,
    run_benchmark,
    settings_from_args,
    to_markdown,
    write,
)

TINY = Shape("tiny", n_layer=1, n_head=2, n_embd=16, vocab_size=64, batch_size=2, seq_len=16)


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_quick_core_on_a_tiny_model(tmp_path):
    settings = Settings(shapes=[TINY], rounds=2, chunk=1, warmup=1, top_ks=(2,), normalizers=("sparsemax",),
                        monitor_every=(1, 50), analysis_lengths=(32,), analysis_repeats=1, analysis_oracle_rows=8)
    result = run_benchmark(settings, progress=lambda *_: None)
    json_path, md_path = write(result, tmp_path)

    loaded = json.loads(json_path.read_text())
    assert set(loaded) >= {"machine", "settings", "notes", "models", "analysis"}
    (model,) = loaded["models"]
    names = [row["name"] for row in model["rows"]]
    assert names[:5] == ["stock sdpa", "stock eager", "temperature T=0.5", "top-k k=2", "sparsemax"]
    for row in model["rows"]:
        assert "error" not in row, row.get("error")
        assert row["time"]["steps"] == 2
        for key in ("ratio_vs_sdpa", "ratio_vs_eager", "tokens_per_s"):
            assert _positive(row[key]), (row["name"], key, row[key])
        assert _positive(float(row["memory"]["peak_bytes"]))
    assert model["rows"][0]["ratio_vs_sdpa"] == 1.0
    for budget in model["budgets"]:
        assert _positive(budget["ratio"]) and budget["verdict"] in ("PASS", "MISS")
    monitors = [row for row in model["rows"] if row["group"] == "monitors"]
    if monitors:  # appear as soon as study.callbacks has the monitors
        assert {row["monitor_every"] for row in monitors} == {1, 50}
        assert any(b["budget"].startswith("monitors every 50") for b in model["budgets"])
    else:
        assert any("study.callbacks lacks" in note for note in loaded["notes"])
    (analysis,) = loaded["analysis"]
    assert analysis["L"] == 32 and _positive(analysis["speedup"])

    markdown = md_path.read_text()
    assert markdown == to_markdown(result)
    assert "| stock sdpa | sdpa |" in markdown and "| budget |" in markdown and "loop oracle" in markdown


def test_arguments():
    quick = settings_from_args(parse_args(["--quick"]))
    assert [s.name for s in quick.shapes] == ["small"] and quick.device in ("cpu", "cuda")
    full = settings_from_args(parse_args(["--top-k", "8", "--peak-flops", "1e12"]))
    assert [s.name for s in full.shapes] == ["small", "gpt2-vocab"] and full.top_ks == (8,) and full.peak_flops == 1e12
    assert SHAPES["small"].vocab_size == 8192 and SHAPES["gpt2-vocab"].vocab_size == 50257


def test_cli_verb_is_registered():
    from study.cli import VERBS

    assert VERBS["bench"] == "study.bench"
    assert callable(main)
