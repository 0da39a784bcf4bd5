"""`study --help` names every verb; `study fit --help` leads with the study's own options; abbreviations refused."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from study.cli import VERBS, main

ROOT = Path(__file__).resolve().parents[1]


def test_study_help_lists_every_verb_and_the_readme_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for verb in VERBS:  # one line each
        assert sum(line.startswith(f"  {verb} ") for line in lines) == 1, verb
    readme = open("README.md").read()
    examples = [line.strip().split("  #")[0].strip() for line in lines[lines.index("examples:") + 1 :]]
    assert len(examples) == 2 and all(f".venv/bin/{e.split('--parallel')[0].strip()}" in readme for e in examples)
    assert main([]) == 2 and "verbs:" in capsys.readouterr().out  # `study` alone: the same page
    assert main(["frob"]) == 2 and "unknown verb 'frob'" in capsys.readouterr().err


def test_fit_help_answers_without_importing_lightning():
    """Importing Lightning alone takes seconds (about 10 under load): `study fit --help` is the committed page."""
    from study import fit_help

    script = ("import sys; from study.cli import main; code = main(['fit', '--help']); "
              "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'torch', 'transformers')); "
              "print('IMPORTED', heavy, code)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    page, _, imported = done.stdout.rpartition("IMPORTED")
    assert imported.strip() == "[] 0"
    assert page.strip() == fit_help.page("fit").strip() and "usage: study fit --config" in page
    assert "usage: study validate --config" in fit_help.page("validate") and fit_help.VERB not in fit_help.page("test")


@pytest.mark.slow  # imports Lightning: the generator reads the classes
def test_the_committed_help_page_is_the_generated_one():
    from study.fit import HELP_MODULE, help_module_text

    assert HELP_MODULE.read_text() == help_module_text(), (
        "study/fit_help.py is stale: python -c 'from study.fit import write_help_module; write_help_module()'")


@pytest.mark.slow  # builds the LightningCLI parser
def test_the_help_pages_options_are_the_parsers():
    """Every --model.* and --data.* option of the parser is on the page, and nothing else is; the trainer's usual
    options exist; the attention spec's options are its fields (`--model.attention` takes the spec whole)."""
    from study import fit_help
    from study.data import TextDataModule
    from study.fit import TRAINER_OPTIONS, _ParseOnly, _parser_kwargs
    from study.model import CausalLMModule

    argv = sys.argv
    sys.argv = [argv[0], "--config", "configs/default.yaml"]
    try:
        cli = _ParseOnly(CausalLMModule, TextDataModule, args=None, run=False, parser_kwargs=_parser_kwargs(),
                         save_config_callback=None)
    finally:
        sys.argv = argv
    parser = {o.rstrip("+") for action in cli.parser._actions for o in action.option_strings}
    on_page = set(re.findall(r"^  (--[\w.]+)", fit_help.PAGE, flags=re.MULTILINE))
    for prefix in ("--model.", "--data."):
        ours = {o for o in on_page if o.startswith(prefix) and not o.startswith("--model.attention.")}
        theirs = {o for o in parser if o.startswith(prefix) and not o.startswith("--model.attention")}
        assert ours == theirs, (prefix, ours ^ theirs)
    assert {f"--trainer.{o}" for o in TRAINER_OPTIONS} <= parser and "--model.attention" in parser
    fields = {f"--model.attention.{f.name}" for f in dataclasses.fields(__import__("study.attention").attention.AttentionSpec) if f.init}
    assert {o for o in on_page if o.startswith("--model.attention.")} == fields
    assert {"--config", "--print_config"} <= parser


@pytest.mark.slow  # imports Lightning and transformers: seconds
def test_fit_help_leads_with_the_study_options(capsys):
    from study.attention import AttentionSpec

    assert main(["fit", "--help"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 150  # a page, not LightningCLI's ~700 lines
    head = "\n".join(out.splitlines()[:12])
    assert "--model.attention.temperature" in head and "--model.attention.top_k" in head
    for field in dataclasses.fields(AttentionSpec):
        if field.init:
            assert f"--model.attention.{field.name} " in out, field.name
    for option in ("--model.model_name_or_path", "--model.learning_rate", "--data.source", "--help-all"):
        assert option in out, option


@pytest.mark.slow  # builds the LightningCLI parser
def test_abbreviated_options_are_refused():
    """argparse would take --trainer.max_step for --trainer.max_steps; the study refuses it with the full name."""
    from study.fit import check_fit_args

    message = check_fit_args(["--config", "configs/default.yaml", "--trainer.max_step=3"])
    assert message is not None and "did you mean --trainer.max_steps" in message
    assert check_fit_args(["--config", "configs/default.yaml", "--trainer.max_steps=300"]) is None


@pytest.mark.slow
def test_fit_help_all_is_lightning_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--help-all"])
    assert exit_.value.code == 0 and "--trainer.max_steps" in capsys.readouterr().out
