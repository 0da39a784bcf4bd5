"""The package's layering, as docs/architecture.md states it: every import (function-local ones too) points to a
lower layer, and no module imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "study"

# Lower numbers are lower layers; a unit imports only units of lower layers (docs/architecture.md, tested below).
LAYERS: dict[str, int] = {
    "study.tags": 0,
    "study.progress": 0,
    "study.console": 0,
    "study.fit_help": 0,
    "study.errors": 0,
    "study.checkpoints": 0,
    "study.cachefolder": 0,
    "study.atomic": 0,
    "study.resident": 0,
    "study.memory": 0,
    "study.attention": 1,
    "study.metrics": 1,
    "study.callbacks": 2,
    "study.pretrained": 2,
    "study.hparams": 2,
    "study.corpus": 2,
    "study.sampler": 2,
    "study.data": 3,
    "study.provenance": 3,
    "study.model": 3,
    "study.trained_tokenizer": 3,
    "study.fit": 4,
    "study.frozen": 4,
    "study.report": 5,
    "study.bench": 6,
    "study.sweep": 6,
    "study.cli": 7,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    name = _module_name(path)
    return imports_of(path.read_text(), name, is_package=path.name == "__init__.py")


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except those under `if TYPE_CHECKING:` (annotations only, never executed)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(source: str, name: str, is_package: bool = False) -> set[str]:
    """Every `study...` module that the module `name` imports at run time, at any depth of its code
    (`from study import tags` counts as study.tags)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "study")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "study":
                continue
            for alias in node.names:  # `from study import tags` imports the module study.tags
                candidate = f"{module}.{alias.name}"
                found.add(candidate if _exists(candidate) else module)
    return found


def _exists(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: {m for m in _imports(path) if m != name} for name, path in MODULES.items()}


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES if m != "study"}
    assert units <= set(LAYERS), f"units without a layer in LAYERS (and docs/architecture.md): {units - set(LAYERS)}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "study"))
def test_imports_point_down(module):
    unit = _unit(module)
    upward = sorted(
        m for m in GRAPH[module] if _unit(m) != unit and _unit(m) != "study" and LAYERS[_unit(m)] >= LAYERS[unit]
    )
    assert not upward, f"{module} (layer {LAYERS[unit]}) imports {upward} from the same or a higher layer"


def test_no_import_cycle_between_modules():
    # Depth-first search for a back edge over the module graph (a package's __init__ re-exporting its own
    # modules is not a cycle of logic: edges into a package's own __init__ from its modules are left out).
    def edges(m: str) -> set[str]:
        return {t for t in GRAPH.get(m, ()) if t in MODULES and not (m.startswith(t + ".") and t != "study")}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges(m)):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(MODULES):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_checker_sees_local_upward_imports_and_ignores_type_checking():
    """The checker can fail: a function-local import is an arrow, an annotation-only one is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from study.model import CausalLMModule\n"
        "def f():\n    from study.callbacks import base\n"
    )
    assert imports_of(source, "study.attention.fake") == {"study.callbacks.base"}
    assert imports_of("from . import tap\n", "study.attention", is_package=True) == {"study.attention.tap"}


def test_the_study_command_and_the_report_load_neither_lightning_nor_transformers():
    """`study report` on a laptop without the training stack's import time: the verbs are imported only when used."""
    import subprocess
    import sys

    code = "import sys, study.cli, study.report; print(sorted({'lightning', 'transformers', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"


def test_docs_architecture_table_matches_the_layers_and_the_imports():
    """docs/architecture.md's table states each unit's layer and what it imports; both are checked here, so the
    page cannot drift from the code."""
    import re

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `study/([\w/]+?)(?:\.py|/)` \|.*\| ([^|]*) \|$", page, flags=re.M)
    documented = {f"study.{unit}": int(layer) for layer, unit, _ in rows}
    assert documented == LAYERS
    for _, unit, listed in rows:
        imported = {_unit(m).removeprefix("study.") for name in MODULES if _unit(name) == f"study.{unit}"
                    for m in GRAPH[name] if _unit(m) not in (f"study.{unit}", "study")}
        named = set() if listed.strip() == "nothing" else {w.strip() for w in listed.split(",")}
        assert imported <= named | {"the verbs"}, f"study/{unit}: imports {sorted(imported - named)}, not in the table"


def test_each_recipe_of_docs_architecture_is_executed_by_a_test_it_names():
    """Each "Where to add things" recipe names the test that builds that extension outside the package's own lists
    (a normaliser, a monitor, an analysis, a sweep axis added in the test alone); the named test must exist, so the
    file counts the page gives are what that test needed."""
    import ast
    import re

    root = PACKAGE.parent
    page = (root / "docs" / "architecture.md").read_text()
    recipes = re.split(r"^### ", page.split("## Where to add things", 1)[1], flags=re.M)[1:]
    assert [r.split(" (")[0] for r in recipes] == ["A normaliser", "A monitor", "An analysis", "A sweep axis"]
    for recipe in recipes:
        named = re.findall(r"Executed: `(tests/[\w/]+\.py)::(test_\w+)`", recipe)
        assert named, f"the recipe {recipe.splitlines()[0]!r} names no test that executes it"
        for path, function in named:
            tree = ast.parse((root / path).read_text())
            tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
            assert function in tests, f"{path} has no {function} (named by the recipe {recipe.splitlines()[0]!r})"
