"""`study.frozen`: text windows spread across documents (`windows`), and the text checks every frozen-model command
shares (`text`, `load`)."""

from __future__ import annotations

import pytest

from study.errors import ConfigError
from study.frozen.load import check_seq_len
from study.frozen.text import documents, read_text
from study.frozen.windows import text_windows


def words(text: str, add_special_tokens: bool = False) -> dict:
    """A tokenizer stand-in: one token per word, its number."""
    return {"input_ids": [int(w) for w in text.split()]}


def test_windows_are_spread_across_documents_without_overlap():
    docs = [(f"play{d}", " ".join(str(1000 * d + i) for i in range(200))) for d in range(4)]
    windows = text_windows(words, docs, count=20, seq_len=16, seed=3)
    assert windows.ids.shape == (20, 16)
    for name in ("play0", "play1", "play2", "play3"):
        starts = sorted(start for doc, start in windows.sources if doc == name)
        assert len(starts) == 5 and all(b - a >= 16 for a, b in zip(starts, starts[1:]))  # never overlapping
        assert starts[-1] - starts[0] >= 100  # spread over the play, not consecutive blocks
    for (name, start), ids in zip(windows.sources, windows.ids.tolist()):
        assert ids == [1000 * int(name[-1]) + start + i for i in range(16)]
    assert text_windows(words, docs, 20, 16, seed=3).sources == windows.sources  # seeded
    turns = windows.taking_turns()
    assert [name for name, _ in turns.sources[:4]] == ["play0", "play1", "play2", "play3"]  # the documents in turn
    assert sorted(turns.sources) == sorted(windows.sources)
    for (name, start), ids in zip(turns.sources, turns.ids.tolist()):
        assert ids == [1000 * int(name[-1]) + start + i for i in range(16)]


def test_windows_go_in_proportion_to_length_and_too_little_text_is_named():
    docs = [("short", " ".join(map(str, range(100)))), ("long", " ".join(map(str, range(400))))]
    windows = text_windows(words, docs, count=5, seq_len=16)
    assert [name for name, _ in windows.sources].count("short") == 1  # 100 of 500 tokens: 1 of 5 windows
    assert len(text_windows(words, docs, count=31, seq_len=16).sources) == 31  # 6 + 25 whole windows fit
    with pytest.raises(ConfigError, match="32 windows of L=16 tokens need 512 tokens; the text has room for 31 whole "
                                          "windows \\(500 tokens in 2 text"):
        text_windows(words, docs, count=32, seq_len=16)


def test_text_checks(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("one two")
    (folder / "b.txt").write_text("three")
    with pytest.raises(ConfigError, match="is not text"):
        documents(str(binary))
    with pytest.raises(ConfigError, match="empty text"):
        documents(str(empty))
    with pytest.raises(ConfigError, match="text file not found"):
        documents(str(tmp_path / "none.txt"))
    assert documents(str(folder)) == [("a.txt", "one two"), ("b.txt", "three")]
    assert read_text(str(folder), min_chars=3) == "one two"
    with pytest.raises(ConfigError, match="--seq-len 100000 is longer than the context length of m \\(64 tokens\\)"):
        check_seq_len(100000, 64, "m")
    check_seq_len(64, 64, "m")
