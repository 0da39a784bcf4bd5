"""Sweep configuration (`configs/sweeps/<name>.yaml`) and the plan of runs it expands to.

A sweep is a grid over the axes of `study.sweep.axes` (temperature, top_k, normalizer, seed, learning_rate) on top
of a base `study fit` config. Each run is
exactly `study fit --config <base> <overrides> <grid values> <logger/checkpoint placement>`; its argument list is
kept in the plan, so any run can be reproduced by hand with `study fit <args>`.

Everything is validated here, before any run starts: unknown keys, empty grids, and values the attention spec
rejects (temperature <= 0, top_k < 1, unknown normaliser) raise `SweepConfigError` naming the problem.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study.errors import ConfigError
from study.errors import load_yaml as _load_yaml
from study.report.read import dotted_get
from study.sweep import axes
from study.sweep.identity import run_dependencies
from study.sweep.runargs import RunArgs, callback_override_key, check_callback_override, passthrough_settings
from study.sweep.spec_identity import shared_hash, spec_digest

TOP_KEYS = {
    "extends",
    "name",
    "base",
    "save_dir",
    "grid",
    "overrides",
    "pretrain",
    "guard",
    "checkpoint",
    "callbacks",
    "report",
    "quick",
    "threads",
    "probe",
    "arms",
    "analyze",
}
PRETRAIN_KEYS = {"overrides"}
SWEEP_OWNED = {"trainer.logger", "trainer.callbacks"}  # set per run by the sweep (runargs.py)
QUICK_KEYS = {"grid", "overrides", "pretrain", "description", "probe", "arms", "analyze"}
# `probe:` keys -> `study probe` options (model defaults to the pretrained model, else model.model_name_or_path)
PROBE_OPTIONS = {
    "model": "--model",
    "text": "--text",
    "temperatures": "--temperatures",
    "windows": "--windows",
    "batch_size": "--batch-size",
    "seq_len": "--seq-len",
    "single_layers": "--single-layers",
    "jacobian_rows": "--jacobian-rows",
    "hessian_iterations": "--hessian-iterations",
    "hessian_temperatures": "--hessian-temperatures",
    "fp64_windows": "--fp64-windows",
    "fp64_temperatures": "--fp64-temperatures",
    "threads": "--threads",
    "seed": "--seed",
}
# `analyze:` keys -> `study analyze` options (model: as for the probe; `figures: false` -> --no-figures)
ANALYZE_OPTIONS = {
    "model": "--model",
    "text": "--text",
    "windows": "--windows",
    "lengths": "--lengths",
    "max_length": "--max-length",
    "layers": "--layers",
    "ns": "--ns",
    "temperatures": "--temperatures",
    "epsilons": "--epsilons",
    "mc_samples": "--mc-samples",
    "vectors": "--vectors",
    "seed": "--seed",
    "threads": "--threads",
}
GUARD_KEYS = {"enabled", "action", "check_loss", "check_grads", "max_skips", "log_grad_norm"}
CHECKPOINT_KEYS = {"enabled", "every_n_train_steps"}


class SweepConfigError(ConfigError):
    """A sweep specification that cannot run; raised before any run starts."""


@dataclass
class Run:
    index: int | str  # "pretrain" for the pretraining run
    name: str
    dir: Path
    params: dict[str, Any]
    args: list[str]
    resolved: dict[str, Any] = field(default_factory=dict)
    # what the run reads besides its arguments (base config content, data, model): `study.sweep.identity`
    depends: dict[str, str] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.args).encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "dir": str(self.dir),
            "params": self.params,
            "fingerprint": self.fingerprint,
            "args": self.args,
            "resolved": self.resolved,
            "depends": self.depends,
        }


@dataclass
class Plan:
    name: str
    spec_path: Path
    sweep_dir: Path
    base: Path
    runs: list[Run]
    pretrain: Run | None
    report: bool
    quick: bool
    threads: int | None = None
    notes: list[str] = field(default_factory=list)  # what validation changed (merged duplicates), to print
    probe: list[str] | None = None  # `study probe` arguments (after pretraining, before the report)
    analyze: list[str] | None = None  # `study analyze` arguments (after the probe, before the report)
    # the spec's identity (`study.sweep.spec_identity`): what the runs share, and the spec file's bytes
    shared_hash: str = ""
    spec_digest: str = ""
    replace: list[Run] = field(default_factory=list)  # run folders on disk that failed before step 1 under other settings

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.name,
            "spec": str(self.spec_path),
            "base": str(self.base),
            "quick": self.quick,
            "grid_keys": list(axes.grid_keys()),
            "pretrain": self.pretrain.as_dict() if self.pretrain else None,
            "probe": self.probe,
            "analyze": self.analyze,
            "runs": [run.as_dict() for run in self.runs],
        }

    def hparams_domains(self) -> dict[str, list]:
        """Each axis's values over the runs, under the names the runs' HParams sessions use (the LightningModule's
        `hparam_summary`), for the sweep's one HParams experiment."""
        return {axis.hparam: [axis.hparam_value(run.params[axis.key]) for run in self.runs] for axis in axes.AXES}


def _merge_duplicates(key: str, values: list, notes: list[str]) -> list:
    kept: dict[Any, Any] = {}
    for value in values:
        same = axes.axis(key).same(value)
        if same in kept:
            notes.append(
                f"grid `{key}` lists {kept[same]!r} and {value!r}, the same setting: merged into one run"
            )
            continue
        kept[same] = value
    return list(kept.values())


def _check_keys(section: str, given: dict, allowed: set[str]) -> None:
    if not isinstance(given, dict):
        raise SweepConfigError(f"`{section}` must be a mapping, got {type(given).__name__}")
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise SweepConfigError(f"unknown key(s) {unknown} in `{section}`; allowed: {sorted(allowed)}")


def _check_overrides(section: str, overrides: Any) -> dict[str, Any]:
    overrides = overrides or {}
    if not isinstance(overrides, dict):
        raise SweepConfigError(f"`{section}` must be a mapping of dotted `study fit` keys to values")
    for key in overrides:
        if (
            not isinstance(key, str)
            or not key
            or key.split(".")[0] not in ("trainer", "model", "data", "seed_everything")
        ):
            raise SweepConfigError(
                f"`{section}` key {key!r} is not a `study fit` option (expected trainer.*, model.*, data.* or seed_everything)"
            )
    return dict(overrides)


def _check_callback_overrides(section: str, overrides: dict[str, Any], base_config: dict) -> None:
    """`trainer.callbacks.<ClassName>.<init_arg>` keys must name one callback of the base config and an argument
    it takes (before any run starts, with the closest name when misspelt)."""
    callbacks = (base_config.get("trainer") or {}).get("callbacks") or []
    for key in overrides:
        try:
            if callback_override_key(key):
                check_callback_override(callbacks, key)
        except ValueError as err:
            raise SweepConfigError(f"`{section}`: {err}") from None


def _check_grid(grid: Any, notes: list[str]) -> dict[str, list]:
    if not isinstance(grid, dict) or not grid:
        raise SweepConfigError("`grid` is empty: give at least one of " + ", ".join(axes.grid_keys()))
    _check_keys("grid", grid, set(axes.grid_keys()))
    out: dict[str, list] = {}
    for axis in axes.AXES:
        values = grid.get(axis.key)
        if values is None:
            if axis.key in grid:  # `temperature: null` ran the base config's value, not a grid over anything
                raise SweepConfigError(f"grid `{axis.key}` is null: give a value or a list (null inside a list, "
                                     f"[null], where the axis allows it), or leave the key out")
            continue
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise SweepConfigError(f"grid `{axis.key}` is an empty list")
        values = _merge_duplicates(axis.key, values, notes)
        for value in values:
            try:
                axis.check(value)
            except ValueError as err:
                raise SweepConfigError(f"grid `{axis.key}` value {value!r} is invalid: {err}") from None
        out[axis.key] = values
    return out


def folder_name(what: str, name: Any) -> str:
    """``name`` if it is one plain folder name (a single path component, not `.`/`..`, no separator, no NUL), so
    that what is written under it stays inside save_dir; else `SweepConfigError` naming it."""
    text = str(name) if isinstance(name, (str, int, float)) and not isinstance(name, bool) else None
    if (
        not text
        or text in (".", "..")
        or any(sep in text for sep in ("/", "\\", "\0"))
        or Path(text).is_absolute()
        or Path(text).name != text
    ):
        raise SweepConfigError(
            f"{what} {name!r} is not a plain folder name: it must be one path component inside save_dir "
            "(no '/', '\\', '.' or '..')"
        )
    return text


def _find_file(path: str, spec_path: Path, what: str = "base config") -> Path:
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    beside = spec_path.parent / path
    if beside.is_file():
        return beside
    raise SweepConfigError(f"{what} {path!r} not found (looked in the working directory and beside {spec_path})")


def load_yaml(path: str | Path) -> Any:
    """`study.errors.load_yaml`, its error a `SweepConfigError` (file:line:column: ...)."""
    try:
        return _load_yaml(path)
    except ConfigError as err:
        raise SweepConfigError(str(err)) from None


def probe_args(section: Any, default_model: str | None, out: Path) -> list[str] | None:
    """`study probe` arguments from the spec's `probe:` section (None when absent or `enabled: false`)."""
    if section is None:
        return None
    _check_keys("probe", section, set(PROBE_OPTIONS) | {"enabled"})
    if not section.get("enabled", True):
        return None
    temperatures = section.get("temperatures")
    if temperatures is not None:
        temperatures = temperatures if isinstance(temperatures, list) else [temperatures]
        bad = [t for t in temperatures if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0]
        if not temperatures or bad:
            raise SweepConfigError(f"`probe.temperatures` must be numbers > 0, got {section.get('temperatures')!r}")
    model = section.get("model") or default_model
    if not model:
        raise SweepConfigError("`probe.model` is required when the sweep has no pretraining and neither its overrides nor its base config name a model.model_name_or_path")
    # No TensorBoard events: under the sweep's folder they would show as one more run (probe.json and probe.png
    # are what the report reads).
    args = ["--model", str(model), "--out", str(out), "--no-tensorboard"]
    for key, flag in PROBE_OPTIONS.items():
        value = section.get(key)
        if key == "model" or value is None:
            continue
        args += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    return args


def analyze_args(section: Any, default_model: str | None, out: Path) -> list[str] | None:
    """`study analyze` arguments from the spec's `analyze:` section (None when absent or `enabled: false`); its
    numbers are checked by `study analyze` itself before the model loads."""
    if section is None:
        return None
    _check_keys("analyze", section, set(ANALYZE_OPTIONS) | {"enabled", "figures"})
    if not section.get("enabled", True):
        return None
    model = section.get("model") or default_model
    if not model:
        raise SweepConfigError("`analyze.model` is required when the sweep has no pretraining and neither its overrides nor its base config name a model.model_name_or_path")
    args = ["--model", str(model), "--text", str(section.get("text") or "shakespeare"), "--out", str(out)]
    for key, flag in ANALYZE_OPTIONS.items():
        value = section.get(key)
        if key in ("model", "text") or value is None:
            continue
        args += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    if section.get("figures", True) is False:
        args.append("--no-figures")
    return args


MERGED_KEYS = ("grid", "overrides")  # under `extends`, merged key by key; every other top-level key is replaced


def load_sweep_config(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The sweep config at `path`; with `extends: <sweep config>` (found as `base` is), that config's keys under
    this one's: `grid` and `overrides` merged axis by axis and key by key, every other key replaced. A replication
    names only what it changes (its grid, its name), so the study it repeats keeps one definition."""
    path = Path(path)
    if not path.is_file():
        raise SweepConfigError(f"sweep config {str(path)!r} not found")
    spec = load_yaml(path) or {}
    if not isinstance(spec, dict):
        raise SweepConfigError(f"{path}: a sweep config is a mapping of keys, got {type(spec).__name__}")
    _check_keys("sweep config", spec, TOP_KEYS)
    parent_name = spec.pop("extends", None)
    if parent_name is None:
        return spec
    if not isinstance(parent_name, str):
        raise SweepConfigError(f"{path}: `extends` must name a sweep config file, got {parent_name!r}")
    parent_path = _find_file(parent_name, path, "sweep config named by `extends`").resolve()
    if parent_path in _seen or parent_path == path.resolve():
        raise SweepConfigError(f"{path}: `extends` makes a cycle through {parent_path}")
    parent = load_sweep_config(parent_path, (*_seen, path.resolve()))
    if "base" in parent and "base" not in spec:  # the parent's `base` is found from the parent's folder
        parent["base"] = str(_find_file(parent["base"], parent_path))
    merged = {**parent, **spec}
    for key in MERGED_KEYS:
        if isinstance(parent.get(key), dict) and isinstance(spec.get(key), dict):
            merged[key] = {**parent[key], **spec[key]}
    return merged


def _apply_quick(
    spec: dict, name: str, overrides: dict, grid: dict, pretrain: dict | None
) -> tuple[str, dict, dict | None, dict | None]:
    """The spec's `quick` section over the full one: (name, grid, pretrain, probe); `overrides` updated in place."""
    q = spec.get("quick")
    if not q:
        raise SweepConfigError("--quick given but the sweep config has no `quick` section")
    _check_keys("quick", q, QUICK_KEYS)
    overrides.update(_check_overrides("quick.overrides", q.get("overrides")))
    grid = {**grid, **(q.get("grid") or {})}
    if q.get("pretrain") is not None:  # a quick pipeline may pretrain even when the full one does not
        _check_keys("quick.pretrain", q["pretrain"], PRETRAIN_KEYS)
        pretrain = copy.deepcopy(pretrain or {})
        pretrain.setdefault("overrides", {}).update(q["pretrain"].get("overrides") or {})
    probe = {**(spec.get("probe") or {}), **q["probe"]} if q.get("probe") is not None else spec.get("probe")
    if "arms" in q:
        spec["arms"] = q["arms"]
    return f"{name}-quick", grid, pretrain, probe


def _quick_analyze(spec: dict) -> Any:
    """The `analyze:` section for --quick: the quick section's keys over the full one's."""
    q = spec.get("quick") or {}
    if q.get("analyze") is None:
        return spec.get("analyze")
    return {**(spec.get("analyze") or {}), **q["analyze"]}


def _run_sections(spec: dict) -> tuple[dict, dict, list[dict]]:
    """The spec's `guard`, `checkpoint` and `callbacks` sections, checked (the guard by building one)."""
    guard = spec.get("guard") or {}
    _check_keys("guard", guard, GUARD_KEYS)
    checkpoint = spec.get("checkpoint") or {}
    _check_keys("checkpoint", checkpoint, CHECKPOINT_KEYS)
    every = checkpoint.get("every_n_train_steps")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise SweepConfigError(f"`checkpoint.every_n_train_steps` must be a positive integer or null, got {every!r}")
    if checkpoint.get("enabled", True) is False and checkpoint.get("every_n_train_steps") is not None:
        raise SweepConfigError("`checkpoint` sets every_n_train_steps with enabled: false (no checkpoint is written)")
    extra_callbacks = spec.get("callbacks") or []
    if not isinstance(extra_callbacks, list) or not all(
        isinstance(c, dict) and "class_path" in c for c in extra_callbacks
    ):
        raise SweepConfigError("`callbacks` must be a list of {class_path: ..., init_args: {...}} entries")
    if guard:
        try:
            from study.callbacks.nonfinite import NonFiniteGuard

            NonFiniteGuard(**{k: v for k, v in guard.items() if k != "enabled"})
        except (TypeError, ValueError) as err:
            raise SweepConfigError(f"`guard` is invalid: {err}") from None
    return guard, checkpoint, extra_callbacks


def _number(value: Any) -> float | None:
    """A setting's number (`1e-3` given on the command line is a YAML string), None if it is not one."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_run_settings(what: str, resolved: dict) -> None:
    """Values that `study fit` would take but that make a run meaningless, refused before anything is built:
    each was accepted silently (or refused only after the model and the data were built)."""
    max_steps = _number(dotted_get(resolved, "trainer.max_steps"))
    if max_steps == 0:
        raise SweepConfigError(f"{what}: trainer.max_steps 0 trains no step (-1: no step limit)")
    interval = dotted_get(resolved, "trainer.val_check_interval")
    if isinstance(interval, int) and not isinstance(interval, bool) and max_steps and max_steps > 0 and interval > max_steps:
        raise SweepConfigError(f"{what}: trainer.val_check_interval {interval} > trainer.max_steps {int(max_steps)}: the "
                             "run never validates after training (its result would be the step-0 baseline)")
    lr = _number(dotted_get(resolved, "model.learning_rate"))
    if lr is not None and not lr > 0:  # not a number at all: `study fit`'s own parser names it
        raise SweepConfigError(f"{what}: model.learning_rate must be a positive number, got {lr:g}")
    pretrained = dotted_get(resolved, "model.model_name_or_path")
    if dotted_get(resolved, "model.attention.output_gate") is True and pretrained:
        raise SweepConfigError(f"{what}: model.attention.output_gate true on the pretrained model {pretrained!r}: a new "
                               "gate would change what it computes; the gate is for models built from scratch")
    top_k, block = dotted_get(resolved, "model.attention.top_k"), _number(dotted_get(resolved, "data.block_size"))
    if isinstance(top_k, int) and not isinstance(top_k, bool) and block is not None and top_k >= block:
        raise SweepConfigError(f"{what}: model.attention.top_k {top_k} >= data.block_size {int(block)}: it selects "
                             "every key, the same run as top_k null (all)")


def build_plan(
    spec_path: str | Path,
    quick: bool = False,
    passthrough: list[str] | None = None,
    save_dir: str | None = None,
) -> Plan:
    """Validate the spec and expand it into runs (nothing is created on disk)."""
    spec_path = Path(spec_path)
    digest = spec_digest(spec_path) if spec_path.is_file() else ""  # before it is read: an edit after it is seen
    spec = load_sweep_config(spec_path)
    if "base" not in spec:
        raise SweepConfigError("`base` (the `study fit` config the runs build on) is missing")
    base = _find_file(spec["base"], spec_path)
    base_config = load_yaml(base) or {}
    name = folder_name("sweep name", spec.get("name") or spec_path.stem)
    overrides = _check_overrides("overrides", spec.get("overrides"))
    grid_in = dict(spec.get("grid") or {})
    pretrain_spec = spec.get("pretrain")
    probe_spec = spec.get("probe")
    if quick:
        name, grid_in, pretrain_spec, probe_spec = _apply_quick(spec, name, overrides, grid_in, pretrain_spec)
    _check_callback_overrides("overrides", overrides, base_config)
    notes: list[str] = []
    grid = _check_grid(grid_in, notes)
    arms = spec.get("arms") or []
    if not isinstance(arms, list) or not all(isinstance(a, dict) and a for a in arms):
        raise SweepConfigError("`arms` must be a list of grids (each a mapping of axes to values) added beside `grid`")
    # An arm is the main grid with some axes replaced (an SGD arm, a learning-rate sweep at two temperatures):
    # its runs add to the main grid's, and its replaced axes name its runs.
    grids = [(grid, set(grid))] + [(_check_grid({**grid_in, **arm}, notes), set(grid) | set(arm)) for arm in arms]
    # An arm may replace an override (its learning rates over the main runs' one); the main grid may not.
    owned = sorted(key for key in overrides if key in {axes.axis(k).option for k in grid})
    if owned:
        raise SweepConfigError(f"`overrides` sets {owned}, which the grid varies; put its values in `grid` only")
    passed = passthrough_settings(list(passthrough or []))
    owned = sorted(
        key for key in passed
        if key in {axes.axis(k).option for g, _ in grids for k in g} | SWEEP_OWNED or key.startswith("trainer.callbacks.")
    )
    if owned:
        raise SweepConfigError(f"extra arguments set {owned}, which the sweep sets per run (the grid, its logger and "
                             "callbacks); change the spec instead")
    root = save_dir or spec.get("save_dir") or "logs"
    if not isinstance(root, str):
        raise SweepConfigError(f"`save_dir` must be one folder path, got {root!r}")
    sweep_dir = Path(root) / name
    sections = _run_sections(spec)
    run_args = RunArgs(base, base_config, *sections, list(passthrough or []))
    args_for = run_args.args

    pretrain = None
    pretrained_path = None
    if pretrain_spec is not None:
        _check_keys("pretrain", pretrain_spec, PRETRAIN_KEYS)
        p_over = _check_overrides("pretrain.overrides", pretrain_spec.get("overrides"))
        _check_callback_overrides("pretrain.overrides", p_over, base_config)
        p_dir = sweep_dir / "pretrain"
        p_args, p_resolved = args_for(p_dir, p_over, pretraining=True)
        check_run_settings("the pretraining run", p_resolved)
        if dotted_get(p_resolved, "model.attention.output_gate") is True:  # `save_pretrained` keeps no study module
            raise SweepConfigError("the pretraining run: model.attention.output_gate true, but the fine-tuning runs load "
                                   "its saved model without the gate; train gated models from scratch in the grid")
        p_depends = run_dependencies(base, p_resolved, sweep_dir)
        pretrain = Run("pretrain", "pretrain", p_dir, {}, p_args, p_resolved, p_depends)
        pretrained_path = str(p_dir / "hf")

    runs = []
    # An axis the grid leaves out keeps the value the runs get anyway (an override's, else the base config's).
    given = {**overrides, **passed}  # what every run gets, whichever way it was given
    fixed = {axis.key: given.get(axis.option, axis.base_value(base_config)) for axis in axes.AXES}
    combos = [(g, named, combo) for g, named in grids
              for combo in itertools.product(*(g.get(axis.key, [None]) for axis in axes.AXES))]  # fmt: skip
    for index, (run_grid, named, combo) in enumerate(combos):
        params = {axis.key: (value if axis.key in run_grid else fixed[axis.key]) for axis, value in zip(axes.AXES, combo)}
        rname = folder_name("run name", axes.run_name(params, swept=named))  # e.g. a normaliser "a/b:C"
        settings = dict(overrides)
        if pretrained_path:
            settings["model.model_name_or_path"] = pretrained_path
        settings.update({axis.option: params[axis.key] for axis in axes.AXES if axis.key in run_grid})
        run_dir = sweep_dir / rname
        args, resolved = args_for(run_dir, settings)
        # cannot happen with exact names; never let two runs share a folder silently
        if any(r.name == rname for r in runs):
            raise SweepConfigError(f"two runs would share the folder {run_dir}")
        check_run_settings(f"run {rname}", resolved)
        runs.append(Run(index, rname, run_dir, params, args, resolved, run_dependencies(base, resolved, sweep_dir)))
    threads = spec.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise SweepConfigError(f"`threads` must be null or a positive integer, got {threads!r}")
    model = pretrained_path or overrides.get("model.model_name_or_path") or dotted_get(base_config, "model.model_name_or_path")
    probe = probe_args(probe_spec, model, sweep_dir / "probe")
    analyze = analyze_args(_quick_analyze(spec) if quick else spec.get("analyze"), model, sweep_dir / "analyze")
    # what every run shares: the grid's values left out (a seed added keeps it), the axes it varies kept
    shared = {"name": name, "base": str(base), "overrides": overrides, "passthrough": list(passthrough or []),
              "pretrain": pretrain_spec, "sections": sections, "axes": [sorted(named) for _, named in grids],
              "probe": probe, "analyze": analyze}
    return Plan(
        name,
        spec_path,
        sweep_dir,
        base,
        runs,
        pretrain,
        bool(spec.get("report", True)),
        quick,
        threads,
        notes,
        probe,
        analyze,
        shared_hash(shared),
        digest,
    )
