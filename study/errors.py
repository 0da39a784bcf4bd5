"""How bad input is reported: `ConfigError` for a file or spec that cannot run, `BadValue` for one value outside
what its key allows (with `check_int`, `check_number`, `check_choice`, the checks every class runs on its own
arguments), YAML read with `file:line:column` errors, and any exception as the one line a person needs
(`one_line`). No imports from the rest of the package."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or specification that cannot run; raised before any run starts."""


class BadValue(ConfigError):
    """One value its key does not allow, named as ``key = value: must be ...``; raised before anything is built."""

    def __init__(self, key: str, value: Any, rule: str) -> None:
        self.key, self.value, self.rule = key, value, rule
        super().__init__(f"{key} = {shown(value)}: {rule}")


def shown(value: Any) -> str:
    """A value as it would be written on the command line (a string quoted, so an empty one shows)."""
    return repr(value) if isinstance(value, str) else str(value)


def _bounds(minimum: float | None, maximum: float | None, low_open: bool, high_open: bool) -> str:
    if minimum is not None and maximum is not None:
        return f"in {'(' if low_open else '['}{minimum:g}, {maximum:g}{')' if high_open else ']'}"
    if minimum is not None:
        return f"{'>' if low_open else '>='} {minimum:g}"
    if maximum is not None:
        return f"{'<' if high_open else '<='} {maximum:g}"
    return ""


def check_int(key: str, value: Any, minimum: int | None = None, maximum: int | None = None,
              none: bool = False) -> int | None:
    """``value`` if it is an integer within [minimum, maximum] (None too when ``none``), else `BadValue`."""
    if value is None and none:
        return None
    rule = " ".join(filter(None, ["must be an integer", _bounds(minimum, maximum, False, False)]))
    if none:
        rule += " or null"
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(key, value, rule)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise BadValue(key, value, rule)
    return value


def check_number(key: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                 low_open: bool = False, high_open: bool = False, none: bool = False) -> float | None:
    """``value`` if it is a finite number within its bounds (``low_open``/``high_open``: the bound itself excluded;
    None too when ``none``), else `BadValue`."""
    if value is None and none:
        return None
    rule = " ".join(filter(None, ["must be a finite number", _bounds(minimum, maximum, low_open, high_open)]))
    if none:
        rule += " or null"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadValue(key, value, rule)
    below = minimum is not None and (value <= minimum if low_open else value < minimum)
    above = maximum is not None and (value >= maximum if high_open else value > maximum)
    if below or above:
        raise BadValue(key, value, rule)
    return float(value)


def check_choice(key: str, value: Any, choices: tuple) -> Any:
    """``value`` if it is one of ``choices``, else `BadValue` listing them."""
    if value not in choices:
        raise BadValue(key, value, f"choose one of {', '.join(map(shown, choices))}")
    return value


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (PyYAML keeps the last silently) and reads
    `1e-300` as the number it is (YAML 1.1, PyYAML's dialect, wants a dot in a float: `1e-300` was a string)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (also on line {seen[key].start_mark.line + 1})", mark
                )
            seen[key] = key_node  # type: ignore[index]
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content; a syntax error or a non-text file raises `ConfigError` as `file:line:column: ...`."""
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text (YAML) file") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader: no Python object is built
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context = getattr(err, "context", None)
        raise ConfigError(
            f"{where}: YAML syntax error: {problem}" + (f" ({context})" if context else "")
        ) from None


def one_line(err: BaseException) -> str:
    """An error as one line: the innermost cause's message, after the option it concerns when that is known.

    jsonargparse wraps a value error raised while building a class (e.g. `temperature must be > 0`) in a union
    error several frames deep; the first message of the chain is the one a person needs. A `ConfigError` at the root
    names what it is about itself (a file, a model): no option is put before it (a link between options could name
    the wrong one).
    """
    chain = [err]
    while chain[-1].__cause__ is not None or (
        chain[-1].__context__ is not None and not chain[-1].__suppress_context__
    ):
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    root = chain[-1]
    lines = [line.strip() for line in str(root).strip().splitlines() if line.strip()]
    message = lines[0] if lines else type(root).__name__
    key = None if isinstance(root, ConfigError) else _option_of(chain)  # a ConfigError names its subject itself
    return f"--{key}: {message}" if key and key not in message else message


def _option_of(chain: list[BaseException]) -> str | None:
    """The dotted option (`model.attention`) the error concerns: named in jsonargparse's message, or the key it
    was instantiating when the error was raised."""
    for exc in chain:
        found = re.search(r'(?:Parser key|Key) "([\w.]+)"', str(exc))
        if found:
            return found.group(1)
    for exc in chain:
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if "jsonargparse" in frame.f_code.co_filename:
                dest = getattr(frame.f_locals.get("component"), "dest", None)
                if isinstance(dest, str):
                    return dest
            tb = tb.tb_next
    return None
