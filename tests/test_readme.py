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


def _anchor(heading: str) -> str:
    # GitHub's rule: lower case, punctuation dropped, spaces to hyphens.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", [README, *PAGES], ids=["README.md", *(p.name for p in PAGES)])
def test_relative_links_resolve(page):
    """Every relative link of the front door and the pages names a file that exists (and a heading that exists)."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
