"""`study fit | validate | test`: LightningCLI over `CausalLMModule` and `TextDataModule`.

Every option of the Trainer, the model and the data comes from YAML or the command line (`study fit --help`,
`study fit --print_config`). Bad input ends in one line naming it, before anything heavy is built: a YAML syntax
error as file:line:column, an unknown option or a bad value with its key, a damaged `--ckpt_path` with what to do.
A run that a `NonFiniteGuard` stopped is not a success (exit code 1).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from study.callbacks.nonfinite import NonFiniteGuard
from study.checkpoints import checkpoint_problem
from study.console import silence_library_notices
from study.data import TextDataModule
from study.errors import ConfigError, load_yaml, one_line
from study.model import CausalLMModule


class StudyCLI(LightningCLI):
    def instantiate_classes(self) -> None:
        """Build the model, the data and the trainer; a failure here is bad input (a value the classes refuse, a
        model or file that is not there), raised as `ConfigError` so that `study` exits 2, not 1 (a run that failed)."""
        try:
            super().instantiate_classes()
        except Exception as err:  # noqa: BLE001 - every failure to build from the config is the config's
            raise ConfigError(one_line(err)) from err

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


def _parser_kwargs() -> dict:
    # Parse errors raise (ArgumentError) instead of printing the whole usage and exiting: `main` makes them one
    # line, and a sweep records them in the run's status.
    kwargs: dict = {"exit_on_error": False}
    if _has_omegaconf():
        kwargs["parser_mode"] = "omegaconf"
    return kwargs


def _has_omegaconf() -> bool:
    return importlib.util.find_spec("omegaconf") is not None


def main(argv: list[str]) -> int:
    """`study fit|validate|test ...` (the verb first, as LightningCLI takes it); errors propagate to `study.cli`."""
    for path in _config_files(argv):
        load_yaml(path)  # a YAML syntax error as file:line:column, before LightningCLI's usage text
    _check_ckpt_path(argv)
    cli = lightning_main(argv)
    diverged = _diverged(cli)
    if diverged:
        print(f"study fit: stopped, {diverged}", file=sys.stderr)
        return 1
    untrained = trained_nothing(cli.trainer) if argv and argv[0] == "fit" else None
    if untrained:
        print(f"study fit: {untrained}", file=sys.stderr)
        return 1
    return 0


def trained_nothing(trainer) -> str | None:
    """Why a fit that returned trained no step (`max_steps=0`, `limit_train_batches=0`, ...); None if it trained.

    Lightning ends such a fit quietly, as if it had finished; a run with no step is not a result.
    """
    if trainer is None or trainer.global_step > 0 or trainer.interrupted:
        return None
    return (
        f"trained no step (max_steps={trainer.max_steps}, limit_train_batches={trainer.limit_train_batches}): "
        "the run is not a result"
    )


def _check_ckpt_path(argv: list[str]) -> None:
    """A `--ckpt_path` file that does not load is named, with what to do, before anything is built."""
    paths = [a.split("=", 1)[1] for a in argv if a.startswith("--ckpt_path=")]
    paths += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--ckpt_path"]
    for path in paths:
        if Path(path).is_file() and (problem := checkpoint_problem(path)):
            what = "it is not a checkpoint to trust" if problem.startswith("UnpicklingError") else "it is damaged"
            raise ConfigError(
                f"--ckpt_path {path} does not load ({problem}); {what}: remove it and resume from an earlier "
                "checkpoint of the run (or start over)"
            )


def _config_files(argv: list[str]) -> list[str]:
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    files += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    return [f for f in files if Path(f).is_file()]


def _diverged(cli: StudyCLI) -> str | None:
    """The reason a `NonFiniteGuard` stopped the run, if one did (a diverged run is not a success)."""
    trainer = getattr(cli, "trainer", None)
    for callback in getattr(trainer, "callbacks", None) or []:
        if isinstance(callback, NonFiniteGuard) and callback.diverged:
            return callback.diverged["reason"]
    return None
