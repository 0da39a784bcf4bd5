"""Files and folders written whole, and through nothing a user planted: the one way the package writes its outputs.

A file is written into a temporary file beside its target and renamed over it once complete, so a kill or a full
disk leaves the previous file whole (or none), never a truncated report.md or a 0-byte PNG. The temporary file is
created exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`) under a name with 64 random bits, and written through the
descriptor that created it: no process can plant a link at the name in advance (the name is not known; the create
fails on anything already there), and the rename replaces a link at the target instead of following it. A
predictable name (`.status.json.tmp`, `.last.ckpt.<pid>.tmp`: the pid is in run.lock) is opened by path and
follows whatever link was put there first.

A folder written whole (`replace_folder`: the report) is built in a folder created the same way beside its
target and renamed into place; the old one is renamed aside first and removed, so a kill leaves the old folder or
the new one, or neither while the two renames run.

An OSError while writing (a full disk) is raised again naming the target, whatever library did the writing:
matplotlib's PNG writer, handed a file object, hides ENOSPC behind `'_idat' object has no attribute 'fileno'`.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")

_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def unpredictable_name(name: str) -> str:
    """A hidden temporary name for ``name`` that no other process can know in advance."""
    return f".{name}.{secrets.token_hex(8)}.tmp"


def create_file_exclusively(folder: Path, name: str) -> tuple[int, Path]:
    """A new, empty file beside ``folder / name``, created by this call (never an existing file or a link);
    its descriptor (open for writing) and path. The mode follows the umask, as an ordinary `open` would."""
    while True:
        path = Path(folder) / unpredictable_name(name)
        try:
            return os.open(path, _EXCLUSIVE, 0o666), path
        except FileExistsError:  # 64 random bits taken: draw again
            continue


def create_folder_exclusively(folder: Path, name: str) -> Path:
    """A new, empty folder beside ``folder / name``, created by this call (`mkdir` fails on anything there)."""
    while True:
        path = Path(folder) / unpredictable_name(name)
        try:
            path.mkdir(mode=0o777)
            return path
        except FileExistsError:
            continue


def os_error_within(err: BaseException) -> OSError | None:
    """The OSError that ``err`` is or was raised while handling (its cause or context), else None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def naming(err: BaseException, path: Path) -> BaseException:
    """``err`` as an OSError naming ``path`` when an OSError lies under it (the library's own error otherwise)."""
    found = os_error_within(err)
    if found is None or isinstance(err, KeyboardInterrupt):
        return err
    return OSError(found.errno, found.strerror or str(found), str(path))


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(f)`` into an exclusively created temporary file beside ``path``, then rename it onto ``path``; on
    any failure the temporary file is removed, ``path`` is as it was, and an OSError names ``path``."""
    path = Path(path)
    fd, tmp = create_file_exclusively(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        named = naming(err, path)
        if named is err:
            raise
        # not `from err`: a message is made from the innermost cause (`study.errors.one_line`), which names no file
        raise named from None


def write_text_atomically(path: Path, text: str) -> None:
    write_atomically(path, lambda f: f.write(text.encode()))


def save_figure(fig, path: Path, dpi: int) -> None:
    """A matplotlib figure written whole to ``path``, in the format its suffix names."""
    path = Path(path)
    write_atomically(path, lambda f: fig.savefig(f, format=path.suffix.lstrip("."), dpi=dpi))


def replace_folder(built: Path, target: Path) -> None:
    """Put the complete folder ``built`` (beside ``target``) in place of ``target``: renames, never a copy, and
    the old folder (or a link at ``target``, not followed) removed only once the new one is there."""
    built, target = Path(built), Path(target)
    old = None
    if os.path.lexists(target):
        old = target.with_name(unpredictable_name(f"{target.name}.old"))
        os.rename(target, old)
    os.rename(built, target)
    if old is not None:
        remove_entry(old, ignore_errors=True)  # the new folder is in place: a leftover of the old one harms nothing


def remove_entry(path: Path, ignore_errors: bool = False) -> None:
    """Remove whatever is at ``path``: a link (the link, never what it leads to) or a file, or a folder with its
    contents; nothing when there is nothing."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=ignore_errors)


def build_folder_whole(final: Path, write: Callable[[Path], T]) -> T:
    """``write(folder)`` into a new, empty folder beside ``final``, which is then swapped in (`replace_folder`);
    its result. On any failure (a kill, a full disk) the new folder is removed and ``final`` is as it was; an
    OSError under it names the file as the user will look for it (under ``final``, not the folder being built)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    out = create_folder_exclusively(final.parent, final.name)
    try:
        result = write(out)
        replace_folder(out, final)
    except BaseException as err:
        shutil.rmtree(out, ignore_errors=True)
        found = os_error_within(err)
        if found is not None and found.filename and Path(found.filename).is_relative_to(out):
            raise OSError(found.errno, found.strerror, str(final / Path(found.filename).relative_to(out))) from err
        raise
    return result


def replaced_folder_refused(out: Path, owned: tuple[str, ...], noun: str) -> str | None:
    """Why ``out`` may not be replaced as a whole by what ``noun`` ("report") writes (one line), or None: ``out`` a
    link or not a folder, or an entry in it that ``noun`` does not write (``owned``: name patterns; one ending in
    "/" names a folder, the others files), which the swap would delete."""
    out = Path(out)
    if out.is_symlink():
        return f"{out} is a link: the {noun} replaces its folder as a whole; give the folder it leads to"
    if not out.exists():
        return None
    if not out.is_dir():
        return f"{out} is not a folder"
    files = [p for p in owned if not p.endswith("/")]
    folders = [p.rstrip("/") for p in owned if p.endswith("/")]

    def owns(entry: Path) -> bool:
        if entry.is_symlink() or entry.is_file():
            return any(fnmatch(entry.name, f) for f in files)
        return entry.is_dir() and any(fnmatch(entry.name, f) for f in folders)

    others = sorted(p.name for p in out.iterdir() if not owns(p))
    if others:
        return (f"{out} holds {others[0]}, which no {noun} writes: the {noun} replaces the folder as a whole; "
                "give an empty or new folder")
    return None


def links_out_of(folder: Path) -> list[Path]:
    """The symbolic links inside ``folder`` (at any depth, not followed) that lead out of it or nowhere: a planted
    `run.lock`, `sweep.log`, `checkpoints` or `report` link would make a command truncate, append to or write
    files outside its folder. The folder itself and its parents may be links (logs on a scratch disk); links that
    stay inside it (Lightning's `save_last: link`) are fine."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    root = folder.resolve()
    found = []
    for parent, dirs, files in os.walk(folder):  # followlinks=False: a linked folder is listed, not entered
        for name in (*dirs, *files):
            path = Path(parent) / name
            if path.is_symlink():
                target = path.resolve()
                if not target.exists() or not target.is_relative_to(root):
                    found.append(path)
    return sorted(found)


def links_refused(folder: Path) -> str | None:
    """One line naming the first link out of ``folder`` (and how many more), or None when there is none."""
    links = links_out_of(folder)
    if not links:
        return None
    more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
    return f"{links[0]} is a link out of {folder}: nothing is written through it; remove the link{more}"


__all__ = [
    "build_folder_whole",
    "create_file_exclusively",
    "create_folder_exclusively",
    "links_out_of",
    "links_refused",
    "naming",
    "os_error_within",
    "remove_entry",
    "replace_folder",
    "replaced_folder_refused",
    "save_figure",
    "unpredictable_name",
    "write_atomically",
    "write_text_atomically",
]
