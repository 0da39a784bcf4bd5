"""The `study` command.

    study | study --help                                           every verb, one line each, and two examples
    study fit|validate|test --config configs/default.yaml [--model.attention.temperature=0.5 ...]
        LightningCLI over `CausalLMModule` and `TextDataModule`: every option of the Trainer, the model and the data
        from YAML or the command line (`study fit --help`, `study fit --print_config`).

    study sweep --config configs/sweeps/default.yaml [--quick]    the study's grid of runs, then its report
    study report logs/<sweep>                                      findings table and figures from the logs
    study analyze --model <hub | dir | .ckpt> --text <file | shakespeare>   the paper's Algorithms 1-5
    study bench [--quick]                                          speed and memory against stock transformers
    study probe --model <dir | hub> --out <dir>                    per-layer and single-layer gradients, Jacobian, Hessian vs T
    study tensorboard [logs/<sweep>]                               TensorBoard on a sweep; prints the address coloured by T

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
    "tensorboard": "study.sweep.view",
}
LIGHTNING_VERBS = ("fit", "validate", "test")
# One line per verb for `study --help` (and `study` alone), in the order a researcher meets them.
SUMMARIES: dict[str, str] = {
    "fit": "one run under an attention spec (LightningCLI; `study fit --help` lists the study's options)",
    "validate": "validate a model or checkpoint under a spec (LightningCLI)",
    "test": "test a model or checkpoint under a spec (LightningCLI)",
    "sweep": "a grid of runs (temperature x top-k x seeds, arms), the probe and the analysis, then the report",
    "report": "findings, scorecard, figures and report.md from a sweep's logs (no model loaded)",
    "probe": "per-layer and single-layer gradients, Jacobian and Hessian against T on a frozen model",
    "analyze": "the paper's Algorithms 1-5 on a frozen causal LM",
    "bench": "speed and memory of the attention options against stock transformers",
    "tensorboard": "TensorBoard on one sweep, then the address that colours its runs by T (other arms apart)",
}
# The README's two commands: the main job and one run.
EXAMPLES = (
    "study sweep --config configs/sweeps/default.yaml --parallel 2     # the main job (make demo); --quick: small GPT-2",
    "study fit --config configs/smollm2.yaml --model.attention.temperature=0.1 --model.attention.top_k=8",
)


def usage() -> str:
    """`study --help`: every verb with one line, and the README's two commands."""
    width = max(map(len, VERBS)) + 2
    return "\n".join([
        "usage: study <verb> [options]   (`study <verb> --help` for a verb's options)",
        "",
        "Attention normalisation in training (arXiv 2508.17821): softmax temperature T, top-k and other normalisers.",
        "",
        "verbs:",
        *(f"  {verb:<{width}}{SUMMARIES[verb]}" for verb in VERBS),
        "",
        "examples:",
        *(f"  {line}" for line in EXAMPLES),
    ])  # fmt: skip
# Verbs with a --verbose of their own (the sweep's shows every run's output live); it also shows tracebacks.
VERBS_WITH_VERBOSE = ("sweep",)


def close_process_group() -> None:
    """Destroy the default process group that a DDP run (Lightning's launcher or torchrun) left open.

    Lightning does not destroy it at the end of `fit`; left to interpreter finalisation, Gloo's worker threads can
    still hold work objects, and the process dies of SIGABRT ("terminate called without an active exception") after
    its work is done, which torchrun reports as a failed job (pytorch/pytorch#190489). Called after a verb returns
    only: on an exception the other ranks may be inside a collective, and destroying could deadlock (as torchtitan).
    """
    if "torch" not in sys.modules:  # a verb that never imported torch (`--help`) has no process group
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """`study <verb> ...`. A bad input or a failed run ends in one line on stderr; `--verbose` shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if not argv[0].startswith("-") and argv[0] not in VERBS:
        print(f"study: unknown verb {argv[0]!r}; the verbs are {', '.join(VERBS)} (study --help)", file=sys.stderr)
        return 2
    verbose = "--verbose" in argv
    verb = argv[0] if argv and not argv[0].startswith("-") else "fit"
    if verb not in VERBS_WITH_VERBOSE:
        argv = [a for a in argv if a != "--verbose"]
    if verb in LIGHTNING_VERBS and ("-h" in argv or "--help" in argv) and "--help-all" not in argv:
        from study import fit_help  # the page generated from the parser's classes: no Lightning to import

        print(fit_help.page(verb))
        return 0
    try:
        module = importlib.import_module(VERBS.get(verb, "study.fit"))
        # `study --print_config ...`, `study --config ...`: no verb is `fit`, as LightningCLI takes it.
        code = module.main(argv if verb in LIGHTNING_VERBS or verb not in VERBS else argv[1:])
        close_process_group()
        return code
    except Exception as err:
        if verbose:
            raise
        print(f"study {verb}: {one_line(err)}  (--verbose shows the traceback)", file=sys.stderr)
        return 2 if isinstance(err, (ArgumentError, ConfigError)) else 1


if __name__ == "__main__":
    sys.exit(main())
