"""`study bench --lengths`: the length sweep's rows, its memory measurement and its command line."""

from __future__ import annotations

import json

import pytest

from study.attention import blockwise_settings
from study.bench import main
from study.bench.lengths import HEADS, LengthSettings, lengths_markdown, run_length_sweep, total_units


@pytest.mark.slow
def test_blockwise_peak_is_a_fraction_of_the_dense_peak_and_long_dense_rows_are_skipped():
    settings = LengthSettings(lengths=(384, 512), dense_max_length=384, units=("call",), fresh_process=False)
    ticks = []
    with blockwise_settings(block_scores=HEADS * 384 * 48):  # 48 rows a block at L = 384, 36 at L = 512
        result = run_length_sweep(settings, tick=ticks.append)
    rows = {(r["spec"], r["path"], r["L"]): r for r in result["rows"]}
    assert len(ticks) == len(result["rows"]) == total_units(settings) == 10
    assert rows[("top-k k=8", "dense explicit", 512)]["skipped"] == "dense path above L = 384"
    assert rows[("sparsemax", "blockwise", 384)]["blocks"] == 8
    assert rows[("sparsemax", "blockwise", 512)]["blocks"] == 15
    for spec in ("top-k k=8", "sparsemax"):
        dense, blocks = rows[(spec, "dense explicit", 384)], rows[(spec, "blockwise", 384)]
        # Dense holds several (9, 384, 384) fp32 score-sized tensors (5.3 MB each) at once; a block an eighth.
        assert dense["peak_bytes"] > 3 * 9 * 384 * 384 * 4
        assert blocks["peak_bytes"] < 0.5 * dense["peak_bytes"]
        assert blocks["seconds"] > 0 and dense["seconds"] > 0
    assert rows[("stock", "stock sdpa", 512)]["peak_bytes"] < rows[("sparsemax", "blockwise", 512)]["peak_bytes"]
    markdown = lengths_markdown(result)
    assert "| top-k k=8 | dense explicit | " in markdown and markdown.count(" - |") == 2  # the two skipped cells
    assert "Blocks of query rows per blockwise call: L = 384: 8, L = 512: 15." in markdown


def test_the_command_writes_both_files_with_a_layer_row(tmp_path, capsys):
    assert main(["--lengths", "64", "--out", str(tmp_path), "--quiet", "--device", "cpu", "--in-process"]) == 0
    result = json.loads((tmp_path / "lengths.json").read_text())
    units = {(r["unit"], r["path"]) for r in result["rows"]}
    assert ("layer", "blockwise") in units and ("call", "stock sdpa") in units
    assert all(r["peak_bytes"] > 0 for r in result["rows"])
    assert "one SmolLM2 decoder layer" in (tmp_path / "lengths.md").read_text()
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("lengths", ["1", "64,x", "0,64"])
def test_bad_lengths_are_refused_naming_them(lengths, tmp_path):
    with pytest.raises(SystemExit, match=lengths.split(",")[-1]):
        main(["--lengths", lengths, "--out", str(tmp_path), "--quiet"])


@pytest.mark.slow
def test_each_row_reports_the_resident_memory_its_forward_and_backward_add(tmp_path):
    """A fresh process per row: its peak resident memory, and what the measured steps added to it. At L = 2048 one
    dense call holds several (9, 2048, 2048) fp32 tensors (151 MB each) at once, which the resident memory sees
    too; the blockwise path adds much less."""
    assert main(["--lengths", "2048", "--units", "call", "--specs", "top-k k=8", "--out", str(tmp_path), "--quiet",
                 "--device", "cpu"]) == 0  # fmt: skip
    result = json.loads((tmp_path / "lengths.json").read_text())
    rows = {r["path"]: r for r in result["rows"]}
    assert set(rows) == {"stock sdpa", "dense explicit", "blockwise"}
    for row in rows.values():
        assert 0 <= row["extra_rss_bytes"] < row["max_rss_bytes"]
    assert rows["dense explicit"]["extra_rss_bytes"] > 2 * 9 * 2048 * 2048 * 4
    # resident memory does not fall as far as the live tensors do (allocator fragmentation: issue 35, still open)
    assert rows["blockwise"]["extra_rss_bytes"] < rows["dense explicit"]["extra_rss_bytes"]
    assert "extra resident MB" in (tmp_path / "lengths.md").read_text()


@pytest.mark.slow
def test_the_gathered_path_is_top_k_with_no_tap_at_a_fraction_of_the_dense_peak():
    """The gathered rows run softmax top-k as an unlogged step does (selection, then gather): its peak (k keys and
    values per row, one block of selection scores) is a fraction of the dense explicit path's, which holds several
    (9, 1024, 1024) fp32 score tensors; sparsemax has no gathered path and says so."""
    settings = LengthSettings(lengths=(1024,), units=("call",), fresh_process=False,
                              paths=("dense explicit", "gathered"))
    rows = {(r["spec"], r["path"]): r for r in run_length_sweep(settings)["rows"]}
    assert rows[("sparsemax", "gathered")]["skipped"] == "the gathered path is softmax top-k's"
    dense = rows[("top-k k=8", "dense explicit")]["peak_bytes"]
    assert dense > 3 * 9 * 1024 * 1024 * 4 and rows[("top-k k=8", "gathered")]["peak_bytes"] < 0.5 * dense
    with pytest.raises(ValueError, match="paths must be among"):
        LengthSettings(paths=("fused",))


def test_the_gathered_rows_gather_at_every_length_and_only_softmax_top_k():
    """A short row would keep the dense path by the default rule: the bench's gathered rows force gathering, so a
    row named gathered is that path; sparsemax and specs without top-k have none (a top-k spec with a temperature
    does)."""
    from study.attention import tap
    from study.attention.blockwise import gathers_top_k
    from study.bench.lengths import _path_settings, _softmax_top_k

    assert not gathers_top_k(9, 64, 64, 8)
    with _path_settings("gathered"):
        assert gathers_top_k(9, 64, 64, 8) and not tap.active_taps()
    assert _softmax_top_k({"top_k": 8}) and _softmax_top_k({"top_k": 8, "temperature": 0.5})
    assert not _softmax_top_k({"normalizer": "sparsemax"})
    assert not _softmax_top_k({"top_k": 8, "normalizer": "sparsemax"})
