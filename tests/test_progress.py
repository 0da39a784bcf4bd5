"""Progress lines: one per unit with an estimate off a terminal, silent when disabled."""

import io

from study.progress import format_seconds, progress


def test_lines_with_estimate():
    stream = io.StringIO()
    assert list(progress([3, 5, 7], "analyze", unit="layer", stream=stream)) == [3, 5, 7]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[analyze] layer 3 (1/3) in ")
    assert lines[0].endswith("left") and lines[-1].endswith("about 0:00 left")
    quiet = io.StringIO()
    assert list(progress(iter([1, 2]), "probe", stream=quiet, enabled=False)) == [1, 2]
    assert quiet.getvalue() == ""
    unknown = io.StringIO()
    list(progress(iter([1]), "probe", stream=unknown))
    assert "(1/?)" in unknown.getvalue() and "left" not in unknown.getvalue()


def test_format_seconds():
    assert (format_seconds(0), format_seconds(75.3), format_seconds(3725)) == ("0:00", "1:15", "1:02:05")
