"""The text a frozen model is measured on, read one way for `study probe` and `study analyze`.

Text is ``shakespeare`` (the embedded corpus's held-out plays, one document each), a text file (one document) or a
folder of ``*.txt`` files (one document each). A binary or empty text fails with a `ConfigError` naming it.
"""

from __future__ import annotations

from pathlib import Path

from study.errors import ConfigError

SHAKESPEARE = "shakespeare"


def _checked(path: Path) -> str:
    from study.corpus import text_problem

    problem = text_problem(path)
    if problem is not None and "empty" not in problem:  # binary or not UTF-8: refuse it
        raise ConfigError(problem)
    return path.read_text(errors="replace")


def documents(spec: str) -> list[tuple[str, str]]:
    """(name, text) of every document of ``spec``: the held-out plays of the embedded corpus ('shakespeare'), a text
    file, or a folder of ``*.txt`` files. Binary files and empty text are refused, naming them."""
    if spec == SHAKESPEARE:
        from study.corpus import shakespeare_files

        try:
            files = shakespeare_files()["validation"]  # held-out plays: text the embedded model never trained on
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from err
        docs = [(Path(f).name.removesuffix("_gut.txt"), Path(f).read_text(errors="replace")) for f in files]
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            files = sorted(path.glob("*.txt"))
            if not files:
                raise ConfigError(f"text folder {spec} holds no *.txt files")
            docs = [(f.name, _checked(f)) for f in files]
        elif path.is_file():
            docs = [(path.name, _checked(path))]
        else:
            raise ConfigError(f"text file not found: {spec} (a file, a folder of .txt files, or 'shakespeare')")
    docs = [(name, text) for name, text in docs if text.strip()]
    if not docs:
        raise ConfigError(f"empty text: {spec} has no characters to tokenise")
    return docs


def read_text(spec: str, min_chars: int | None = None) -> str:
    """The documents of ``spec`` joined by newlines; with ``min_chars``, only as many documents as reach it."""
    parts, size = [], 0
    for _, text in documents(spec):
        parts.append(text)
        size += len(text)
        if min_chars is not None and size >= min_chars:
            break
    return "\n".join(parts)
