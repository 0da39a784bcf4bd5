"""Report files are written whole or not at all (issue 32, item 5): a full disk during a figure leaves no 0-byte PNG."""

from __future__ import annotations

import errno

import pytest

from study.atomic import write_atomically, write_text_atomically


def _full(f):
    f.write(b"")  # what matplotlib leaves when its first write fails
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_write_leaves_neither_a_file_nor_its_temporary(tmp_path):
    with pytest.raises(OSError, match="No space left"):
        write_atomically(tmp_path / "curves.png", _full)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    (tmp_path / "report.md").write_text("previous")
    with pytest.raises(OSError):
        write_atomically(tmp_path / "report.md", _full)
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"] and (tmp_path / "report.md").read_text() == "previous"
    write_text_atomically(tmp_path / "report.md", "new")
    assert (tmp_path / "report.md").read_text() == "new" and len(list(tmp_path.iterdir())) == 1


def test_a_figure_that_cannot_be_written_leaves_no_png(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from study.report import figures

    def savefig(self, f, **kwargs):
        _full(f)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    fig = plt.figure()
    with pytest.raises(OSError):
        figures._save(fig, tmp_path / "curves.png")
    assert list(tmp_path.iterdir()) == []
