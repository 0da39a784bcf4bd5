"""How bad input is reported: `ConfigError` for a file or spec that cannot run, YAML read with `file:line:column`
errors, and any exception as the one line a person needs (`one_line`). No imports from the rest of the package."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or specification that cannot run; raised before any run starts."""


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
