"""The `study` command.

    study fit|validate|test --config configs/default.yaml [--model.attention.temperature=0.5 ...]
        LightningCLI over `GPT2Module` and `TextDataModule`: every option of the Trainer, the model and the data
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
import sys

from lightning.pytorch.cli import LightningCLI

from study.data import TextDataModule
from study.model import GPT2Module

# verb -> module with `main(argv: list[str]) -> int`, imported only when used.
VERBS: dict[str, str] = {
    "sweep": "study.sweep",
    "report": "study.report",
    "analyze": "study.analysis.cli",
    "bench": "study.bench",
    "probe": "study.probe",
}


class StudyCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The model embeds exactly the tokenizer's vocabulary and checks the block size against its context.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.block_size", "model.block_size")


def lightning_main(args: list[str] | None = None, run: bool = True, **cli_kwargs) -> StudyCLI:
    """Build (and by default run) the LightningCLI; ``args`` replaces the command line when given."""
    kwargs = dict(
        save_config_kwargs={"overwrite": False},
        parser_kwargs={"parser_mode": "omegaconf"} if _has_omegaconf() else None,
    )
    kwargs.update(cli_kwargs)
    argv = sys.argv
    if args is not None:
        # LightningCLI warns when it gets `args` while sys.argv has arguments too (as under `study sweep`).
        sys.argv = argv[:1]
    try:
        return StudyCLI(GPT2Module, TextDataModule, args=args, run=run, **kwargs)
    finally:
        sys.argv = argv


def _has_omegaconf() -> bool:
    return importlib.util.find_spec("omegaconf") is not None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in VERBS:
        return importlib.import_module(VERBS[argv[0]]).main(argv[1:])
    lightning_main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
