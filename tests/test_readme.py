"""The Python examples of README.md and of the pages under docs/ run as written."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_python_blocks_run():
    blocks = python_blocks(README)
    assert blocks
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_docs_python_blocks_run(page):
    """Each page's blocks share one namespace, in order (a page may build on its earlier blocks)."""
    namespace: dict = {}
    for block in python_blocks(page):
        exec(compile(block, str(page), "exec"), namespace)
