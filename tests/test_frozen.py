"""`study.frozen.load`: text windows spread across documents, and the text checks every frozen-model command shares."""

from __future__ import annotations

import pytest

from study.frozen.load import FrozenInputError, check_seq_len, documents, read_text, text_windows


def words(text: str, add_special_tokens: bool = False) -> dict:
    """A tokenizer stand-in: one token per word, its number."""
    return {"input_ids": [int(w) for w in text.split()]}


def test_windows_are_dealt_across_documents_without_overlap():
    docs = [(f"play{d}", " ".join(str(1000 * d + i) for i in range(200))) for d in range(4)]
    windows = text_windows(words, docs, count=20, seq_len=16, seed=3)
    assert windows.ids.shape == (20, 16)
    assert [name for name, _ in windows.sources[:4]] == ["play0", "play1", "play2", "play3"]  # interleaved
    for name in ("play0", "play1", "play2", "play3"):
        starts = sorted(start for doc, start in windows.sources if doc == name)
        assert len(starts) == 5 and all(b - a >= 16 for a, b in zip(starts, starts[1:]))  # never overlapping
        assert starts[-1] - starts[0] >= 100  # spread over the play, not consecutive blocks
    for (name, start), ids in zip(windows.sources, windows.ids.tolist()):
        assert ids == [1000 * int(name[-1]) + start + i for i in range(16)]
    assert text_windows(words, docs, 20, 16, seed=3).sources == windows.sources  # seeded


def test_a_short_document_passes_its_share_on_and_too_little_text_is_named():
    docs = [("short", " ".join(map(str, range(20)))), ("long", " ".join(map(str, range(400))))]
    windows = text_windows(words, docs, count=6, seq_len=16)
    assert [name for name, _ in windows.sources].count("short") == 1
    with pytest.raises(FrozenInputError, match="room for 26 windows of 16 tokens; 30 asked"):
        text_windows(words, docs, count=30, seq_len=16)


def test_text_checks(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("one two")
    (folder / "b.txt").write_text("three")
    with pytest.raises(FrozenInputError, match="is not text"):
        documents(str(binary))
    with pytest.raises(FrozenInputError, match="empty text"):
        documents(str(empty))
    with pytest.raises(FrozenInputError, match="text file not found"):
        documents(str(tmp_path / "none.txt"))
    assert documents(str(folder)) == [("a.txt", "one two"), ("b.txt", "three")]
    assert read_text(str(folder), min_chars=3) == "one two"
    with pytest.raises(FrozenInputError, match="--seq-len 100000 is longer than the context length of m \\(64 tokens\\)"):
        check_seq_len(100000, 64, "m")
    check_seq_len(64, 64, "m")
