"""The `study` command.

    study fit|validate|test --config configs/default.yaml [--model.attention.temperature=0.5 ...]
        LightningCLI over `CausalLMModule` and `TextDataModule`: every option of the Trainer, the model and the data
        from YAML or the command line (`study fit --help`, `study fit --print_config`).

    study sweep --config configs/sweeps/default.yaml [--quick]    the study's grid of runs, then its report
    study report logs/<sweep>                                      findings table and figures from the logs
    study analyze --model <hub | dir | .ckpt> --text <file | shakespeare>   the paper's Algorithms 1-5
    study bench [--quick]                                          speed and memory against stock transformers
    study probe --model <dir | hub> --out <dir>                    per-layer and single-layer gradients, Jacobian, Hessian vs T

Each verb is a module with its own `main(argv)` (`VERBS`), imported only when used: `study report` never loads
Lightning or transformers. This module is the top of the package; nothing imports it.
"""

from __future__ import annotations

import importlib
import sys
from argparse import ArgumentError

from study.errors import ConfigError, one_line

# verb -> module with `main(argv: list[str]) -> int`, imported only when used. The Lightning verbs get their own
# name as the first argument, as LightningCLI takes it.
VERBS: dict[str, str] = {
    "fit": "study.fit",
    "validate": "study.fit",
    "test": "study.fit",
    "sweep": "study.sweep",
    "report": "study.report",
    "analyze": "study.frozen.analysis.command",
    "bench": "study.bench",
    "probe": "study.frozen.probe.command",
}
LIGHTNING_VERBS = ("fit", "validate", "test")
# Verbs with a --verbose of their own (the sweep's shows every run's output live); it also shows tracebacks.
VERBS_WITH_VERBOSE = ("sweep",)


def main(argv: list[str] | None = None) -> int:
    """`study <verb> ...`. A bad input or a failed run ends in one line on stderr; `--verbose` shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    verb = argv[0] if argv and not argv[0].startswith("-") else "fit"
    if verb not in VERBS_WITH_VERBOSE:
        argv = [a for a in argv if a != "--verbose"]
    try:
        module = importlib.import_module(VERBS.get(verb, "study.fit"))
        # `study --help`, `study --print_config ...`, `study <unknown>`: LightningCLI answers (and names the verbs).
        return module.main(argv if verb in LIGHTNING_VERBS or verb not in VERBS else argv[1:])
    except Exception as err:
        if verbose:
            raise
        print(f"study {verb}: {one_line(err)}  (--verbose shows the traceback)", file=sys.stderr)
        return 2 if isinstance(err, (ArgumentError, ConfigError)) else 1


if __name__ == "__main__":
    sys.exit(main())
