"""Lightning hooks are typed and marked `@override`: a misspelt hook name is an error here, not a silent no-op."""

from __future__ import annotations

import inspect
import subprocess
import sys

import lightning as L
import pytest

import study.callbacks as callbacks_package
from study.data import TextDataModule
from study.model import CausalLMModule

HOOKS = {name for name, value in vars(L.Callback).items() if callable(value) and not name.startswith("_")}


def _callback_classes() -> list[type]:
    import pkgutil

    found = set()
    for info in pkgutil.iter_modules(callbacks_package.__path__):
        module = __import__(f"study.callbacks.{info.name}", fromlist=["_"])
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, L.Callback) and cls.__module__.startswith("study.callbacks"):
                found.add(cls)
    return sorted(found, key=lambda c: c.__qualname__)


CLASSES = _callback_classes()


def test_every_callback_of_the_package_is_found():
    names = {c.__name__ for c in CLASSES}
    assert {"TapMonitor", "AttentionEntropyMonitor", "GradientNormMonitor", "AttentionMapMonitor", "NonFiniteGuard",
            "NormalizerParameterMonitor", "AttentionJacobianMonitor", "TensorBoardLayout"} <= names  # fmt: skip


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


def test_callbacks_never_import_the_model():
    code = "import sys, study.callbacks; print([m for m in ('study.model', 'study.data') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
