"""`study bench --fused-stats`: the rows it measures, on tiny lengths (their values are the machine's)."""

import json

import pytest

from study.bench.command import main
from study.bench.fusedstats import TOP_K_PATHS, fused_markdown, run_fused_bench


def test_fused_bench_rows_and_table():
    result = run_fused_bench((16, 32), top_k_length=24, repeats=1, key_blocks_max_length=16)
    assert [(row["length"], row["statistics"]) for row in result["statistics"]] == [
        (16, "entropy + first key (fused call)"), (16, "every statistic (key blocks)"),
        (32, "entropy + first key (fused call)")]
    for row in result["statistics"]:
        assert row["unlogged_s"] > 0 and row["logged_s"] > 0
        assert row["time_ratio"] == row["logged_s"] / row["unlogged_s"]
        assert row["extra_peak_bytes"] == row["logged_peak_bytes"] - row["unlogged_peak_bytes"]
    assert [row["path"] for row in result["top_k"]] == list(TOP_K_PATHS)
    assert result["top_k"][0]["ratio_to_stock"] == 1.0
    table = fused_markdown(result)
    assert "| 32 | entropy + first key" in table and "gathered top-k" in table and "L = 24" in table


def test_fused_bench_command_writes_json_and_markdown(tmp_path):
    assert main(["--fused-stats", "16", "--top-k-length", "24", "--device", "cpu", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "fused.json").read_text())
    assert result["statistics"][0]["length"] == 16 and "machine" in result
    assert (tmp_path / "fused.md").read_text().startswith("| L |")


@pytest.mark.parametrize("argv, message", [
    (["--fused-stats", "512,x"], "--fused-stats '512,x'"),
    (["--fused-stats", "1"], "--fused-stats '1'"),
    (["--fused-stats", "16", "--top-k-length", "8"], "--top-k-length must be >= 16"),
])
def test_fused_bench_bad_arguments_named(argv, message):
    with pytest.raises(SystemExit, match=message):
        main([*argv, "--device", "cpu"])
