"""`study --help` names every verb; `study fit --help` leads with the study's own options; abbreviations refused."""

from __future__ import annotations

import dataclasses

import pytest

from study.cli import VERBS, main


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
