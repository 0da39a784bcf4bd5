"""The `study` command.

    study fit|validate|test --config configs/default.yaml [--model.attention.temperature=0.5 ...]
        LightningCLI over `CausalLMModule` and `TextDataModule`: every option of the Trainer, the model and the data
        from YAML or the command line (`study fit --help`, `study fit --print_config`).

    study sweep --config configs/sweeps/default.yaml [--quick]    the study's grid of runs, then its report
    study report logs/<sweep>                                      findings table and figures from the logs
    study analyze --model <hub | dir | .ckpt> --text <file | shakespeare>   the paper's Algorithms 1-5
    study bench [--quick]                                          speed and memory against stock transformers
    study probe --model <dir | hub> --out <dir>                    loss, W_q/W_k gradients, Jacobian, Hessian vs T

Verbs other than LightningCLI's are modules with their own `main(argv)` (`VERBS`), imported only when used.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from argparse import ArgumentError
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from study.console import silence_library_notices
from study.data import TextDataModule
from study.model import CausalLMModule
from study.sweep.spec import SweepSpecError, load_yaml

# verb -> module with `main(argv: list[str]) -> int`, imported only when used.
VERBS: dict[str, str] = {
    "sweep": "study.sweep",
    "report": "study.report",
    "analyze": "study.analysis.command",
    "bench": "study.bench",
    "probe": "study.probe",
}


class StudyCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The model embeds exactly the tokenizer's vocabulary and checks the block size against its context.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.block_size", "model.block_size")
        # tokenizer "auto" / "model" reads the loaded model's own tokenizer.
        parser.link_arguments("model.model_name_or_path", "data.model_name_or_path")


def lightning_main(args: list[str] | None = None, run: bool = True, **cli_kwargs) -> StudyCLI:
    """Build (and by default run) the LightningCLI; ``args`` replaces the command line when given.

    ``args`` become the process's own command line (``sys.argv[1:]``) while the CLI is built and run, and
    LightningCLI parses ``sys.argv``. Lightning's DDP launcher starts the other ranks by re-executing
    ``sys.argv``: they must get the very `study fit ...` command this process runs, not a truncated one.
    """
    kwargs = dict(save_config_kwargs={"overwrite": False}, parser_kwargs=_parser_kwargs())
    kwargs.update(cli_kwargs)
    silence_library_notices()
    argv = sys.argv
    if args is not None:
        sys.argv = [argv[0], *args]
    try:
        return StudyCLI(CausalLMModule, TextDataModule, args=None, run=run, **kwargs)
    finally:
        sys.argv = argv


class _ParseOnly(StudyCLI):
    """Parses and validates a `study fit` command line without building the model, the data or the trainer."""

    def _set_seed(self) -> None:  # LightningCLI's private step: parsing must not seed (or print) anything
        return None

    def instantiate_classes(self) -> None:
        return None


def check_fit_args(args: list[str]) -> str | None:
    """None if `study fit <args>` parses (every key known, every value of its type), else the parser's message.

    A sweep calls this for every run before the first one starts: a typo such as `trainer.max_stepz` in the
    overrides is refused up front instead of failing each run after it has started.
    """
    argv = sys.argv
    sys.argv = [argv[0], *args]
    try:
        _ParseOnly(
            CausalLMModule,
            TextDataModule,
            args=None,
            run=False,
            parser_kwargs=_parser_kwargs(),
            save_config_callback=None,
        )
    except Exception as err:  # noqa: BLE001 - the parser's own message is the answer
        return one_line(err)
    finally:
        sys.argv = argv
    return None


def one_line(err: BaseException) -> str:
    """An error as one line: the innermost cause's message, after the option it concerns when that is known.

    jsonargparse wraps a value error raised while building a class (e.g. `temperature must be > 0`) in a union
    error several frames deep; the first message of the chain is the one a person needs.
    """
    chain = [err]
    while chain[-1].__cause__ is not None or (
        chain[-1].__context__ is not None and not chain[-1].__suppress_context__
    ):
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    root = chain[-1]
    lines = [line.strip() for line in str(root).strip().splitlines() if line.strip()]
    message = lines[0] if lines else type(root).__name__
    key = _option_of(chain)
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


def _parser_kwargs() -> dict:
    # Parse errors raise (ArgumentError) instead of printing the whole usage and exiting: `main` makes them one
    # line, and a sweep records them in the run's status.
    kwargs: dict = {"exit_on_error": False}
    if _has_omegaconf():
        kwargs["parser_mode"] = "omegaconf"
    return kwargs


def _has_omegaconf() -> bool:
    return importlib.util.find_spec("omegaconf") is not None


def main(argv: list[str] | None = None) -> int:
    """`study <verb> ...`. A bad input or a failed run ends in one line on stderr; `--verbose` shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    verb = argv[0] if argv and not argv[0].startswith("-") else "fit"
    try:
        if argv and argv[0] in VERBS:
            return importlib.import_module(VERBS[argv[0]]).main(argv[1:])
        for path in _config_files(argv):
            load_yaml(path)  # a YAML syntax error as file:line:column, before LightningCLI's usage text
        _check_ckpt_path(argv)
        cli = lightning_main(argv)
    except Exception as err:
        if verbose:
            raise
        print(f"study {verb}: {one_line(err)}  (--verbose shows the traceback)", file=sys.stderr)
        return 2 if isinstance(err, (ArgumentError, SweepSpecError)) else 1
    diverged = _diverged(cli)
    if diverged:
        print(f"study fit: stopped, {diverged}", file=sys.stderr)
        return 1
    return 0


def _check_ckpt_path(argv: list[str]) -> None:
    """A `--ckpt_path` file that does not load is named, with what to do, before anything is built."""
    from study.sweep.runner import checkpoint_problem

    paths = [a.split("=", 1)[1] for a in argv if a.startswith("--ckpt_path=")]
    paths += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--ckpt_path"]
    for path in paths:
        if Path(path).is_file() and (problem := checkpoint_problem(path)):
            raise ValueError(
                f"--ckpt_path {path} does not load ({problem}); it is damaged: remove it and resume from an earlier "
                "checkpoint of the run (or start over)"
            )


def _config_files(argv: list[str]) -> list[str]:
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    files += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    return [f for f in files if Path(f).is_file()]


def _diverged(cli: StudyCLI) -> str | None:
    """The reason a `NonFiniteGuard` stopped the run, if one did (a diverged run is not a success)."""
    from study.callbacks.nonfinite import NonFiniteGuard

    trainer = getattr(cli, "trainer", None)
    for callback in getattr(trainer, "callbacks", None) or []:
        if isinstance(callback, NonFiniteGuard) and callback.diverged:
            return callback.diverged["reason"]
    return None


if __name__ == "__main__":
    sys.exit(main())
