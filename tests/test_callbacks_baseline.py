"""BaselineValidation: a validation epoch at step 0, before any update, equal to validating the untouched model."""

import pytest
import torch

from study.attention import AttentionSpec
from study.callbacks import AttentionJacobianMonitor, BaselineValidation
from tests.callback_helpers import make_trainer, scalars, token_loader


def module(temperature: float = 0.3):
    from study.model import CausalLMModule

    torch.manual_seed(0)
    return CausalLMModule(AttentionSpec(temperature=temperature), n_layer=2, n_embd=32, n_head=2, n_positions=32,
                          vocab_size=64, learning_rate=1e-2, warmup_steps=1)  # fmt: skip


def test_step0_validation_is_the_untrained_model_and_training_still_validates(tmp_path):
    # The reference: the same model validated with no training at all.
    make_trainer(tmp_path / "ref", []).validate(module(), token_loader(seed=1, vocab=64), verbose=False)
    reference = scalars(tmp_path / "ref")["val/loss"][0][1]

    callbacks = [BaselineValidation(), AttentionJacobianMonitor(every_n_steps=10)]
    make_trainer(tmp_path / "fit", callbacks, max_steps=3, val_check_interval=3).fit(
        module(), token_loader(n=6, vocab=64), token_loader(seed=1, vocab=64)
    )
    logged = scalars(tmp_path / "fit")
    assert [s for s, _ in logged["val/loss"]] == [0, 3]  # at the optimizer steps done, as the monitors log it
    assert logged["val/loss"][0][1] == pytest.approx(reference, rel=1e-6)
    assert logged["val/loss"][1][1] != pytest.approx(reference, rel=1e-3)  # it trained (lr 1e-2)
    assert [s for s, _ in logged["val/attention/jacobian/mean"]] == [0, 3]  # monitors get their baseline too
    assert [s for s, _ in logged["train/loss"]] == [0, 1, 2]


def test_no_validation_batches_means_no_baseline(tmp_path):
    make_trainer(tmp_path, [BaselineValidation()], max_steps=1, limit_val_batches=0).fit(module(), token_loader(vocab=64))
    assert "val/loss" not in scalars(tmp_path)


def test_a_seeded_baseline_runs_only_in_runs_of_that_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "1")  # what seed_everything(1) sets
    for name, seed in (("other", 0), ("mine", 1)):
        make_trainer(tmp_path / name, [BaselineValidation(seed=seed)], max_steps=2, val_check_interval=2).fit(
            module(), token_loader(n=4, vocab=64), token_loader(seed=1, vocab=64)
        )
    assert [s for s, _ in scalars(tmp_path / "other")["val/loss"]] == [2]
    assert [s for s, _ in scalars(tmp_path / "mine")["val/loss"]] == [0, 2]
    with pytest.raises(ValueError, match="seed must be None or an integer, got '0'"):
        BaselineValidation(seed="0")
