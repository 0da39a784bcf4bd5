"""The `study fit` arguments of one run of a sweep: its base config, settings, logger, checkpoints and guard.

Each run is exactly `study fit --config <base> <settings> --trainer.logger=... --trainer.callbacks=...`; the
arguments and the config they resolve to are kept in the plan, so any run can be reproduced by hand.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study import tags
from study.hparams import EXPERIMENT_FILE

GUARD_CLASS = "study.callbacks.nonfinite.NonFiniteGuard"
# `trainer.callbacks.<ClassName>.<init_arg>`: an override of one init argument of a base-config callback, found by
# its class name (e.g. `trainer.callbacks.AttentionMapMonitor.layers: [0, 1]` for a smaller model than the base's).
CALLBACK_PREFIX = "trainer.callbacks."
CHECKPOINT_CLASS = "lightning.pytorch.callbacks.ModelCheckpoint"
FLUSH_CLASS = "study.callbacks.logflush.LogFlush"


def _cli_value(value: Any) -> str:
    # `study fit` parses `--key=value` as YAML; JSON is valid YAML for numbers, null, strings, lists and dicts.
    # Plain strings go as they are: a str-typed option would keep JSON's quotes.
    return value if isinstance(value, str) else json.dumps(value)


def passthrough_settings(passthrough: list[str]) -> dict[str, Any]:
    """The settings that extra `study sweep` arguments (`--trainer.devices=4`, `--model.x 1`) give every run, parsed
    as `study fit` parses them (YAML values), so the plan records what the runs really get."""
    import yaml

    settings: dict[str, Any] = {}
    i = 0
    while i < len(passthrough):
        key, has_value, value = passthrough[i].removeprefix("--").partition("=")
        if not has_value and i + 1 < len(passthrough) and not passthrough[i + 1].startswith("--"):
            value, i = passthrough[i + 1], i + 1
        settings[key] = yaml.safe_load(value) if (has_value or value) else True
        i += 1
    return settings


def callback_override_key(key: str) -> tuple[str, str] | None:
    """(class name, init argument) of a `trainer.callbacks.<ClassName>.<init_arg>` override, else None."""
    if not key.startswith(CALLBACK_PREFIX):
        return None
    parts = key.removeprefix(CALLBACK_PREFIX).split(".")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"{key!r}: a callback override is `trainer.callbacks.<ClassName>.<init_arg>`")
    return parts[0], parts[1]


def callback_class_name(callback: dict) -> str:
    return str(callback.get("class_path", "")).rsplit(".", 1)[-1]


def check_callback_override(callbacks: list[dict], key: str) -> None:
    """Refuse an override naming a callback the base config does not have (or has twice), or an init argument its
    class does not take, with the closest name; the class is imported only to read its signature."""
    import difflib
    import importlib
    import inspect

    name, arg = callback_override_key(key)
    matches = [cb for cb in callbacks if callback_class_name(cb) == name]
    if len(matches) != 1:
        present = sorted({callback_class_name(cb) for cb in callbacks})
        close = difflib.get_close_matches(name, present, n=1)
        why = "several of" if matches else "no"
        hint = f"; did you mean {close[0]!r}?" if close and not matches else ""
        raise ValueError(f"{key!r}: the base config has {why} callback {name!r} (it has {present}){hint}")
    module, _, cls = matches[0]["class_path"].rpartition(".")
    params = inspect.signature(getattr(importlib.import_module(module), cls)).parameters
    if arg not in params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        close = difflib.get_close_matches(arg, list(params), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{key!r}: {name} takes no argument {arg!r} (it takes {sorted(params)}){hint}")


def _set_dotted(config: dict, key: str, value: Any) -> None:
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


@dataclass
class RunArgs:
    """What every run of a sweep shares: the base config and the spec's guard, checkpoint and callbacks sections."""

    base: Path
    base_config: dict[str, Any]
    guard: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    extra_callbacks: list[dict] = field(default_factory=list)
    passthrough: list[str] = field(default_factory=list)

    def callbacks(self, run_dir: Path, overrides: dict[str, Any] | None = None) -> list[dict]:
        """The run's callbacks: the base config's, with `overrides` (`trainer.callbacks.<ClassName>.<init_arg>`:
        value) applied, checkpoints placed in the run folder, then the guard and the spec's extra callbacks."""
        callbacks = copy.deepcopy((self.base_config.get("trainer") or {}).get("callbacks") or [])
        for key, value in (overrides or {}).items():
            name, arg = callback_override_key(key)
            for cb in callbacks:
                if callback_class_name(cb) == name:
                    cb.setdefault("init_args", {})[arg] = value
        return self._placed(run_dir, callbacks)

    def _placed(self, run_dir: Path, callbacks: list[dict]) -> list[dict]:
        # Every ModelCheckpoint writes into the run folder. The one that keeps last.ckpt (for resuming) saves every
        # `checkpoint.every_n_train_steps`; it must not monitor a metric: Lightning skips a monitored checkpoint,
        # last.ckpt included, until that metric exists, so a run killed before its first validation could not resume.
        if self.checkpoint.get("enabled", True) is False:
            # No checkpoint files at all (a large model's are GB each): a killed run restarts from step 0.
            callbacks = [cb for cb in callbacks if not cb.get("class_path", "").endswith("ModelCheckpoint")]
            return self._with_guard_and_extras(callbacks)
        resume = None
        for cb in callbacks:
            if cb.get("class_path", "").rsplit(".", 1)[-1] == "ModelCheckpoint":
                init = cb.setdefault("init_args", {})
                init["dirpath"] = str(run_dir / "checkpoints")
                # An exception checkpoint is taken mid-batch; resumed from it, the run logged its steps shifted by
                # one (measured). Sweeps resume from the periodic last.ckpt instead.
                init["save_on_exception"] = False
                if init.get("save_last") and not init.get("monitor"):
                    resume = init
                else:
                    init["save_last"] = False
        if resume is None:
            resume = {"dirpath": str(run_dir / "checkpoints"), "save_last": True, "save_top_k": 0}
            callbacks.append({"class_path": CHECKPOINT_CLASS, "init_args": resume})
        resume.update({k: v for k, v in self.checkpoint.items() if v is not None and k != "enabled"})
        return self._with_guard_and_extras(callbacks)

    def _with_guard_and_extras(self, callbacks: list[dict]) -> list[dict]:
        # One guard per run: the spec's `guard` section replaces the base config's guard (or removes it).
        base_guards = [cb for cb in callbacks if cb.get("class_path", "").endswith("NonFiniteGuard")]
        if self.guard or not base_guards:
            callbacks = [cb for cb in callbacks if cb not in base_guards]
            if self.guard.get("enabled", True):
                init_args = {k: v for k, v in self.guard.items() if k != "enabled"}
                callbacks.append({"class_path": GUARD_CLASS, "init_args": init_args})
        # Logs on disk up to each checkpoint, before any extra callback may stop the process (study.callbacks.logflush)
        callbacks.append({"class_path": FLUSH_CLASS})
        callbacks.extend(copy.deepcopy(self.extra_callbacks))
        return callbacks

    def args(self, run_dir: Path, settings: dict[str, Any], pretraining: bool = False) -> tuple[list[str], dict]:
        """The run's `study fit` arguments and the config they resolve to.

        The pretraining run logs under Lightning's logger prefix (`pretrain-train/loss`, ...), so that TensorBoard
        draws its curves in their own charts, not beside the fine-tuning runs' (which start again at step 0), and
        writes no HParams session: it is the base of the sweep's settings, not a row among them.
        """
        logger = {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            # explicit name/version: a resumed run appends to the same event directory
            "init_args": {
                "save_dir": str(run_dir.parent),
                "name": "",
                "version": run_dir.name,
                "default_hp_metric": False,
                **({"prefix": tags.PRETRAIN_PREFIX} if pretraining else {}),
            },
        }
        args = ["--config", str(self.base)]
        resolved = copy.deepcopy(self.base_config)
        callback_settings = {}
        for key, value in settings.items():
            if callback_override_key(key):  # part of --trainer.callbacks below
                callback_settings[key] = value
                continue
            args.append(f"--{key}={_cli_value(value)}")
            _set_dotted(resolved, key, value)
        callbacks = self.callbacks(run_dir, callback_settings)
        args += [f"--trainer.logger={_cli_value(logger)}", f"--trainer.callbacks={_cli_value(callbacks)}"]
        # The sweep declares one HParams experiment for all its runs (`Plan.hparams_domains`) in a file that each
        # run copies into its own events (an events folder of its own would show in TensorBoard as an empty run).
        experiment = False if pretraining else str(run_dir.parent / EXPERIMENT_FILE)
        args.append(f"--model.hparams_experiment={_cli_value(experiment)}")
        _set_dotted(resolved, "model.hparams_experiment", experiment)
        if pretraining:
            args.append("--model.hparams_session=false")
            _set_dotted(resolved, "model.hparams_session", False)
        _set_dotted(resolved, "trainer.logger", logger)
        _set_dotted(resolved, "trainer.callbacks", callbacks)
        args += list(self.passthrough)
        for key, value in passthrough_settings(self.passthrough).items():
            _set_dotted(resolved, key, value)
        return args, resolved
