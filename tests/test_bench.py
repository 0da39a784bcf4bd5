"""`study bench` on a tiny model: the report's structure, not the budgets (CI machines are too noisy for those)."""

from __future__ import annotations

import json
import math

import pytest

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
from study.bench.shapes import MONITOR_NAMES

TINY = Shape("tiny", n_layer=1, n_head=2, n_embd=16, vocab_size=64, batch_size=2, seq_len=16)


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_quick_core_on_a_tiny_model(tmp_path, capsys):
    settings = Settings(shapes=[TINY], rounds=2, chunk=1, warmup=1, top_ks=(2,), normalizers=("sparsemax",),
                        monitor_every=(1, 50), analysis_lengths=(32,), analysis_repeats=1, analysis_oracle_rows=8,
                        fresh_process=False)  # the fresh processes of resident memory: the slow test below
    result = run_benchmark(settings, progress=lambda *_: None, show_progress=True)
    # Off a terminal: one line per timing round (warm-up + 2) and per variant's memory pass, with the time left.
    lines = capsys.readouterr().err.splitlines()
    timing = [line for line in lines if line.startswith("[bench tiny timing] round ")]
    assert [line.split(" (")[1].split(")")[0] for line in timing] == ["1/3", "2/3", "3/3"], lines
    assert timing[0].startswith("[bench tiny timing] round warm-up (1/3) in ") and timing[-1].endswith("about 0:00 left")
    memory = [line for line in lines if line.startswith("[bench tiny memory] variant ")]
    n = len(result["models"][0]["rows"])
    assert len(memory) == n and memory[0].startswith(f"[bench tiny memory] variant stock sdpa (1/{n}) in ")
    assert all(line.endswith(" left") for line in memory)
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
        assert all(row["monitors"] == list(MONITOR_NAMES) for row in monitors)
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
    assert not full.per_monitor and settings_from_args(parse_args(["--per-monitor"])).per_monitor


def test_per_monitor_variants_run_one_monitor_each_and_are_not_budgeted():
    """`--per-monitor`: each monitor alone, logging every step, beside all of them; the budgets judge all of them."""
    from study.bench.budgets import budgets
    from study.bench.shapes import monitor_classes, variants
    from study.bench.timing import monitor_callbacks

    settings = Settings(shapes=[TINY], per_monitor=True)
    classes, _ = monitor_classes()
    alone = [v for v in variants(settings, True) if v.monitors]
    assert [(v.name, v.monitors, v.monitor_every) for v in alone] == [
        (f"T=0.5 + {name} every 1", (name,), 1) for name in MONITOR_NAMES]
    for v in alone:
        assert [type(c).__name__ for c in monitor_callbacks(classes, v.monitor_every, v.monitors)] == list(v.monitors)
    assert [type(c).__name__ for c in monitor_callbacks(classes, 1)] == list(MONITOR_NAMES)
    assert not [v for v in variants(Settings(shapes=[TINY]), True) if v.monitors]  # off by default
    rows = [{"name": v.name, "time": {"step_s": 1.0}, "memory": {"peak_bytes": 1}} for v in variants(settings, True)]
    assert not {b["variant"] for b in budgets(rows, settings)} & {v.name for v in alone}


def test_cli_verb_is_registered():
    from study.cli import VERBS

    assert VERBS["bench"] == "study.bench"
    assert callable(main)


TINY_LLAMA = Shape("tiny-llama", n_layer=2, n_head=4, n_embd=32, vocab_size=64, batch_size=2, seq_len=16,
                   arch="llama", n_kv_head=2, n_inner=64, one_at_a_time=True)


@pytest.mark.slow
def test_llama_shape_one_variant_at_a_time_with_bf16_parity(tmp_path, capsys):
    """The SmolLM2-like path (grouped-query Llama, variants taking turns) and the GPU suite's parity, on CPU."""
    settings = Settings(shapes=[TINY_LLAMA], rounds=2, chunk=2, warmup=1, top_ks=(4,), normalizers=("sparsemax",),
                        monitor_every=(), analysis_lengths=(16,), analysis_repeats=1, analysis_oracle_rows=4,
                        precision="bf16-mixed", parity=True)
    result = run_benchmark(settings, progress=lambda *_: None, show_progress=True)
    (model,) = result["models"]
    # One line per variant's fit, rounds x variants of them, with the time left.
    fits = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[bench tiny-llama timing] fit ")]
    total = 2 * len(model["rows"])
    assert len(fits) == total and fits[0].startswith(f"[bench tiny-llama timing] fit stock sdpa, round 1 (1/{total}) in ")
    assert fits[-1].endswith("about 0:00 left")
    assert model["steps"]["one_at_a_time"] and model["params"] > 0
    for row in model["rows"]:
        assert "error" not in row, row.get("error")
        assert row["time"]["steps"] == 4  # 2 rounds x 2 timed steps; each fit's warm-up step dropped
        assert _positive(row["ratio_vs_sdpa"])
    parity = {row["path"]: row for row in model["parity"]}
    assert set(parity) == {"stock sdpa", "study fused SDPA, T=1", "study explicit fp32, top-k=L (all keys)",
                           "study fused SDPA, T=0.5", "study explicit fp32, T=0.5, top-k=L", "study top-k k=4",
                           "study sparsemax"}
    # Exact-arithmetic equalities hold in fp32, and bf16 errors are real, finite measurements.
    assert parity["study explicit fp32, top-k=L (all keys)"]["fp32_vs_stock"] < 1e-4
    assert parity["study explicit fp32, T=0.5, top-k=L"]["fp32_vs_study fused SDPA, T=0.5"] < 1e-4
    assert all(r["verdict"] == "PASS" for r in parity.values()), parity
    assert all(math.isfinite(r["loss_error_vs_own_fp32"]) for r in parity.values())
    markdown = to_markdown(result)
    assert "Llama 2 layers x 32, 4 heads (2 key-value)" in markdown and "| study top-k k=4 |" in markdown


def test_parity_catches_a_path_that_differs_from_stock(monkeypatch):
    """A wrong path (here: stock eager silently at T=0.9) must fail parity, not pass on tolerance."""
    import study.bench.parity as parity_module
    from study.bench.shapes import Variant

    real = parity_module.paths

    def broken(settings, seq_len):
        rows = real(settings, seq_len)
        name, _, equals = rows[1]
        return [rows[0], (name, Variant("fast", "temperature", "study", {"temperature": 0.9}), equals)]

    monkeypatch.setattr(parity_module, "paths", broken)
    settings = Settings(shapes=[TINY], precision="32-true")
    rows = parity_module.check_parity(TINY, settings)
    assert rows[0]["verdict"] == "PASS" and rows[1]["verdict"] == "MISS"


def test_gpu_suite_arguments():
    gpu = settings_from_args(parse_args(["--gpu-suite", "--device", "cpu"]))
    assert [s.name for s in gpu.shapes] == ["gpt2-124m-L512", "gpt2-124m-L1024", "gpt2-124m-L2048"]
    assert [s.seq_len for s in gpu.shapes] == [512, 1024, 2048]
    assert {s.batch_size * s.seq_len for s in gpu.shapes} == {8192}
    assert gpu.parity and gpu.precision == "bf16-mixed"
    smol = SHAPES["smollm2"]
    assert (smol.n_layer, smol.n_head, smol.n_kv_head, smol.vocab_size) == (30, 9, 3, 49152)


def _live_tensors() -> tuple[int, int]:
    """(count, bytes) of the tensors Python can reach, storage counted once."""
    import gc
    import warnings

    import torch

    gc.collect()
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    # An earlier test in this worker (torch.compile's tracing) can leave fake tensors, which hold no memory and
    # have no data pointer: only tensors with real storage count.
    tensors = [t for t in tensors if not isinstance(t, torch._subclasses.FakeTensor) and not t.is_meta]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return len(tensors), sum(storages.values())


@pytest.mark.slow
def test_the_memory_pass_keeps_nothing_from_one_variant_to_the_next(tmp_path):
    """Each variant's fit (model, AdamW state, trainer) is gone once its memory pass is measured: the tensors left
    alive after four variants are those left after one."""
    from study.bench.memory import measure_memory
    from study.bench.shapes import variants

    settings = Settings(shapes=[TINY], top_ks=(2,), normalizers=("sparsemax",), monitor_every=(1,), fresh_process=False)
    chosen = variants(settings, monitors_available=False)[:4]
    measure_memory(TINY, chosen[0], settings, [], str(tmp_path))
    after_one = _live_tensors()
    for variant in chosen[1:]:
        assert measure_memory(TINY, variant, settings, [], str(tmp_path))["peak_bytes"] > 0
    assert _live_tensors() == after_one


@pytest.mark.slow
def test_each_variant_reports_the_peak_resident_memory_of_its_own_process(tmp_path):
    settings = Settings(shapes=[TINY], rounds=1, chunk=1, warmup=1, top_ks=(2,), normalizers=(), monitor_every=(),
                        analysis_lengths=(32,), analysis_repeats=1, analysis_oracle_rows=8)  # fmt: skip
    result = run_benchmark(settings, progress=lambda *_: None)
    rows = result["models"][0]["rows"]
    assert [r["name"] for r in rows] == ["stock sdpa", "stock eager", "temperature T=0.5", "top-k k=2"]
    for row in rows:
        memory = row["memory"]
        # torch and Lightning alone hold a few hundred MB resident; the step adds to it; the profiler counts
        # only the step's tensors
        assert 100 * 2**20 < memory["base_rss_bytes"] <= memory["max_rss_bytes"] < 4 * 2**30, memory
        assert memory["peak_bytes"] < memory["max_rss_bytes"]
    markdown = to_markdown(result)
    assert "max RSS MB" in markdown and f"| {rows[0]['memory']['max_rss_bytes'] / 2**20:.0f} | 1.000 |" in markdown


@pytest.mark.slow
def test_interception_bench_times_both_copies_of_each_shape(tmp_path):
    """`study bench --interception` on its smallest settings: one row per shape, the ratio of the two medians,
    the machine's load in the table."""
    from study.bench import command
    from study.bench.interception import INTERCEPTION_SHAPES, interception_markdown, measure_shape

    row = measure_shape("litgpt-tiny", rounds=1, chunk=1, warmup=0)
    assert row["steps"] == 1 and row["ratio"] == pytest.approx(row["intercepted_s"] / row["unpatched_s"])
    markdown = interception_markdown({"rows": [row], "load_before": (1.0, 1.0, 1.0), "load_after": (2.0, 1.0, 1.0),
                                      "cpus": 2, "threads": 1, "torch": "x"})
    assert "| litgpt-tiny | 1 |" in markdown and "before (1.0, 1.0, 1.0), after (2.0, 1.0, 1.0)" in markdown
    assert set(INTERCEPTION_SHAPES) == {"litgpt-tiny", "small"}
    assert command.parse_args(["--interception", "--rounds", "1"]).interception
