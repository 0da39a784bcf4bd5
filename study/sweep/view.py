"""`study tensorboard [logs/<sweep>]`: TensorBoard on one sweep, with the address that colours its runs by T.

TensorBoard colours runs in the browser, from its address, never from the logs: ``?runColorGroup=regex:R`` gives
every run whose capture groups in ``R`` are equal one colour (TensorBoard's `groupRuns`: the key is the list of
captured groups). The regular expression is built from the sweep's plan (``plan.json``): the main arm (the setting
of the plan's first run, i.e. the first value of every axis of the grid) is grouped by its temperature, so its
seeds share their T's colour; every other setting (an SGD arm, a top-k arm, another normaliser) is one group of its
own whatever its T, so a diverged SGD run at T = 1 never takes the colour of the T = 1 runs. The main arm's mean
over seeds at each T (`study.sweep.seed_means`) takes its T's colour.

The address is printed last, after TensorBoard's own notices (its plain ``http://localhost:6006/`` among them),
where the eye lands. It also sets ``smoothing=0``: a sweep's runs are short (a dozen steps, one or two validation
points), and smoothing draws values that were never measured.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from study import tags
from study.sweep import axes

DEFAULT_SWEEP = Path("logs/default")
DEFAULT_PORT = 6006
TEMPERATURE_GROUP = r"(T[^_]+)"  # a temperature's name part: T0.01, T1, T1e-05 (`axes.exact` never writes "_")
SEED_PATTERN = r"s\d+"


def _split(name: str, params: dict[str, Any]) -> tuple[str, str] | None:
    """(the name between its T part and its seed part, the name after its seed part) or None when the name does
    not have the T-first, seed-after-the-always-named-axes shape that `axes.run_name` gives."""
    named = [a for a in axes.AXES if a.always_named]
    keys = [a.key for a in named]
    if "temperature" not in keys or "seed" not in keys or keys[0] != "temperature":
        return None
    if any(a.key not in params for a in named):
        return None
    t_label = named[0].label(params["temperature"])
    before_seed = "_".join(a.label(params[a.key]) for a in named[: keys.index("seed")])
    seed_label = axes.axis("seed").label(params["seed"])
    if not name.startswith(f"{before_seed}_{seed_label}"):
        return None
    return name[len(t_label) : len(before_seed) + 1], name[len(before_seed) + 1 + len(seed_label) :]


def main_arm(runs: Iterable[tuple[str, dict[str, Any]]]) -> set[str]:
    """The names of the runs of the main arm: the plan's first run's setting, any temperature and seed (empty if
    no run has the plan's name shape). The colour groups and the sweep's closing line read the same set."""
    runs = list(runs)
    splits = [(name, _split(name, params)) for name, params in runs]
    first = next((split for _, split in splits if split is not None), None)
    return {name for name, split in splits if first is not None and split == first}


def run_color_regex(runs: Iterable[tuple[str, dict[str, Any]]]) -> str | None:
    """The ``runColorGroup`` regular expression for a plan's runs ((name, params) in plan order): the first run's
    setting grouped by T, every other setting (its name less T and seed) one group; None if no run has the
    plan's name shape. Python's and JavaScript's `re` read it the same way (groups, ``\\d``, escapes)."""
    settings: list[tuple[str, str]] = []
    for name, params in runs:
        split = _split(name, params)
        if split is not None and split not in settings:
            settings.append(split)
    if not settings:
        return None
    (main_middle, main_tail), others = settings[0], settings[1:]
    # The main arm's mean runs (`tags.seed_mean_run`: Mean_over_seeds/T0.1) capture their T in the same group as the
    # main arm's runs, so each T's mean takes its runs' colour (TensorBoard's key is the list of all groups)
    alternatives = ["^(?:" + re.escape(tags.SEED_MEAN_RUN + "/") + ")?" + TEMPERATURE_GROUP
                    + "(?:" + re.escape(main_middle) + SEED_PATTERN + re.escape(main_tail) + ")?$"]  # fmt: skip
    # Each other setting captures its name less T and seed: its own group key, never equal to a temperature's
    alternatives += ["^T[^_]+(" + re.escape(middle) + ")" + SEED_PATTERN + "(" + re.escape(tail) + ")$"
                     for middle, tail in others]  # fmt: skip
    return "|".join(alternatives)


def color_groups(regex: str, names: Iterable[str]) -> dict[str, tuple[str | None, ...] | None]:
    """{run name: its group key as TensorBoard forms it (the captured groups; None: no match, its own colour)}."""
    pattern = re.compile(regex)
    return {name: (m.groups() if (m := pattern.search(name)) else None) for name in names}


def plan_runs(sweep_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The (name, params) of the runs in ``<sweep_dir>/plan.json``, in plan order."""
    path = Path(sweep_dir) / "plan.json"
    try:
        plan = json.loads(path.read_text())
        return [(str(run["name"]), dict(run["params"])) for run in plan["runs"]]
    except FileNotFoundError:
        raise ValueError(f"{sweep_dir} has no plan.json: not a sweep folder (`study sweep` writes one)") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a readable sweep plan ({type(err).__name__}: {err})") from None


def address(regex: str | None, host: str = "localhost", port: int = DEFAULT_PORT) -> str:
    """The Time Series page of TensorBoard at ``host:port``, unsmoothed, its runs grouped by ``regex``."""
    query = {"smoothing": "0"}
    if regex is not None:
        query["runColorGroup"] = "regex:" + regex
    return f"http://{host}:{port}/?{urllib.parse.urlencode(query, safe=':', quote_via=urllib.parse.quote)}#timeseries"


def command_line(sweep_dir: Path) -> str:
    """The command that opens a sweep in TensorBoard, as the sweep's closing line prints it."""
    return f"study tensorboard {sweep_dir}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="study tensorboard",
        description="TensorBoard on one sweep's logs; prints, last, the address that colours the runs by T "
        "(the main arm) with the other arms apart.",
    )
    parser.add_argument("sweep", nargs="?", type=Path, default=DEFAULT_SWEEP,
                        help=f"a sweep folder (default: {DEFAULT_SWEEP}); HParams shows one sweep at a time")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default: {DEFAULT_PORT})")
    parser.add_argument("--host", default="localhost", help="the address TensorBoard binds (default: localhost)")
    parser.add_argument("--print-address", action="store_true", help="print the address only; start nothing")
    return parser  # fmt: skip


def main(argv: list[str]) -> int:
    """Start TensorBoard on the sweep, pass its notices through, then print the coloured address; wait for it."""
    args = _parser().parse_args(argv)
    if not args.sweep.is_dir():
        print(f"study tensorboard: no sweep folder {args.sweep} (`study sweep` writes logs/<name>)", file=sys.stderr)
        return 2
    url = address(run_color_regex(plan_runs(args.sweep)), args.host, args.port)
    if args.print_address:
        print(url)
        return 0
    binary = shutil.which("tensorboard", path=str(Path(sys.executable).parent)) or shutil.which("tensorboard")
    if binary is None:
        print("study tensorboard: the tensorboard command is not installed beside this Python", file=sys.stderr)
        return 1
    command = [binary, "--logdir", str(args.sweep), "--port", str(args.port), "--host", args.host]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as server:
        try:
            for line in server.stdout:
                print(line, end="", flush=True)
                if " at http" in line:  # TensorBoard's "serving" notice: the last it prints at start
                    bold, plain = ("\033[1;32m", "\033[0m") if sys.stdout.isatty() else ("", "")
                    print(f"\nRuns coloured by T (other arms apart), unsmoothed:\n{bold}{url}{plain}\n", flush=True)
            return server.wait()
        except KeyboardInterrupt:  # Ctrl+C reaches TensorBoard too (one process group): its way to quit
            server.terminate()
            server.wait()
            return 0
