"""Progress lines: one per unit with an estimate off a terminal, silent when disabled."""

import io

from study.progress import Progress, format_seconds, progress


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


def test_progress_driven_by_advance():
    stream = io.StringIO()
    with Progress("bench small timing", total=2, unit="round", stream=stream) as bar:
        bar.advance("warm-up")
        bar.advance("1")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[bench small timing] round warm-up (1/2) in ") and lines[0].endswith(" left")
    assert lines[1].endswith("about 0:00 left")
    quiet = io.StringIO()
    with Progress("probe", total=1, stream=quiet, enabled=False) as bar:
        bar.advance("x")
    assert quiet.getvalue() == "" and bar.done == 1


def test_a_terminal_gets_a_bar_not_lines():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    assert list(progress([1, 2], "probe", unit="T", stream=stream)) == [1, 2]
    drawn = stream.getvalue()
    assert "[probe]" not in drawn and "probe:" in drawn and "/2 [" in drawn  # tqdm: "probe:   0%| | 0/2 [..."
