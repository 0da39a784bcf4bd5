"""Lightning hooks are typed and marked `@override`: a misspelt hook name is an error here, not a silent no-op.

Every Lightning callback anywhere in `study/` is checked (the monitors, the bench's and the sweep's timers), and
none may hide inside a function, where this scan could not see it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest

import study
from study.data import TextDataModule
from study.model import CausalLMModule

HOOKS = {name for name, value in vars(L.Callback).items() if callable(value) and not name.startswith("_")}
PACKAGE = Path(study.__file__).parent


def _callback_classes() -> list[type]:
    found = set()
    for info in pkgutil.walk_packages(study.__path__, "study."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, L.Callback) and cls.__module__.startswith("study."):
                found.add(cls)
    return sorted(found, key=lambda c: c.__qualname__)


CLASSES = _callback_classes()


def test_every_callback_of_the_package_is_found():
    names = {c.__name__ for c in CLASSES}
    assert {"TapMonitor", "AttentionEntropyMonitor", "GradientNormMonitor", "AttentionMapMonitor", "NonFiniteGuard",
            "NormalizerParameterMonitor", "AttentionJacobianMonitor", "TensorBoardLayout", "StepTimerStart", "StepTimerStop", "PeakMemoryStart",
            "PeakMemoryStop"} <= names  # fmt: skip


def test_no_callback_is_defined_inside_a_function():
    """A class made inside a function exists only when it runs: the scan above would miss its hooks."""
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ClassDef) and (
                    any("Callback" in ast.unparse(base) for base in node.bases)
                    or any(isinstance(m, ast.FunctionDef) and m.name in HOOKS for m in node.body)
                ):
                    hidden.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not hidden, f"Lightning callbacks defined inside functions: {hidden}"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_callback_hooks_exist_in_lightning_and_are_marked(cls):
    for name, member in vars(cls).items():
        if name.startswith("on_"):
            assert name in HOOKS, f"{cls.__name__}.{name}: Lightning's Callback has no such hook (misspelt?)"
        if name in HOOKS:
            assert getattr(member, "__override__", False), f"{cls.__name__}.{name} is not marked @override"
            ours = inspect.signature(member).parameters
            theirs = inspect.signature(getattr(L.Callback, name)).parameters
            assert list(ours) == list(theirs), f"{cls.__name__}.{name}{tuple(ours)} != Lightning's {tuple(theirs)}"
            assert all(p.annotation is not inspect.Parameter.empty for n, p in ours.items() if n != "self"), name


@pytest.mark.parametrize("cls, base", [(CausalLMModule, L.LightningModule), (TextDataModule, L.LightningDataModule)])
def test_module_hooks_are_marked(cls, base):
    hooks = {n for n in dir(base) if not n.startswith("_") and callable(getattr(base, n, None))}
    defined = [n for n in vars(cls) if n in hooks]
    assert defined
    for name in defined:
        assert getattr(vars(cls)[name], "__override__", False), f"{cls.__name__}.{name} is not marked @override"
    for name in vars(cls):
        if name.startswith("on_"):
            assert name in hooks, f"{cls.__name__}.{name}: {base.__name__} has no such hook (misspelt?)"


@pytest.mark.slow
def test_callbacks_never_import_the_model():
    code = "import sys, study.callbacks; print([m for m in ('study.model', 'study.data') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
