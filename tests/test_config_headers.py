"""Every config says what it runs in a short header; why each choice was made lives in docs/ (sweeps.md,
realmodel.md, findings.md), where it can be kept with the measurements it rests on."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
MAX_HEADER_LINES = 12


def header_lines(text: str) -> int:
    """Comment lines before the first line that is neither a comment nor blank."""
    count = 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        count += stripped.startswith("#")
    return count


def test_header_lines_counts_comments_before_the_first_key():
    assert header_lines("# a\n# b\n\nname: x\n# not the header\n") == 2
    assert header_lines("name: x\n") == 0


@pytest.mark.parametrize("path", CONFIGS, ids=[p.relative_to(ROOT / "configs").as_posix() for p in CONFIGS])
def test_a_config_opens_with_a_short_header(path):
    assert header_lines(path.read_text()) <= MAX_HEADER_LINES, (
        f"{path.relative_to(ROOT)} opens with more than {MAX_HEADER_LINES} comment lines: move the reasons to docs/")
