"""AttentionJacobianMonitor: spectral norm and largest entry of the softmax Jacobian against autograd, and the tags
beside 1/(4T) and 1/(2T) (the entrywise Corollary 3 itself: tests/test_metrics_attention.py)."""

import math

import pytest
import torch

from study.attention import AttentionSpec, causal_allowed
from study.callbacks import AttentionJacobianMonitor, GradientNormMonitor
from study.callbacks.base import TRAIN
from study.callbacks.jacobian import NEAR_BOUND
from tests.callback_helpers import LlamaModule, PlainAttention, make_trainer, scalars, token_loader


def autograd_jacobian(row: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.autograd.functional.jacobian(lambda x: torch.softmax(x / temperature, -1), row.to(torch.float64))


def test_jacobian_equals_autograd():
    """The logged sums are autograd's spectral norm and largest |entry| x 4T of softmax(l / T) on the sampled rows."""
    torch.manual_seed(0)
    temperature, length = 0.3, 12
    logits = torch.randn(2, 3, length, length) * 2
    allowed = causal_allowed(length, length, torch.device("cpu"))[None, None]
    weights = (logits / temperature).masked_fill(~allowed, -math.inf).softmax(-1)
    monitor = AttentionJacobianMonitor(rows=1000)  # more than there are rows: every valid row is taken
    monitor._open(TRAIN)
    monitor.observe(0, weights, allowed, AttentionSpec(temperature=temperature))
    monitor._close()
    monitor.before_reduce(TRAIN)  # the norms of the sampled rows are computed at log time, all layers at once
    sums = monitor._sums[TRAIN][0]

    spectral, ratio = [], []
    for b, h, t in [(b, h, t) for b in range(2) for h in range(3) for t in range(1, length)]:
        jac = autograd_jacobian(logits[b, h, t, : t + 1], temperature)
        spectral.append(torch.linalg.matrix_norm(jac, ord=2).item())
        ratio.append(jac.abs().max().item() * 4 * temperature)
    spectral, ratio = torch.tensor(spectral, dtype=torch.float64), torch.tensor(ratio, dtype=torch.float64)
    assert sums["rows"].item() == len(spectral)
    assert sums["jacobian"].item() == pytest.approx(spectral.sum().item(), rel=1e-4)
    assert sums["jacobian_max"].item() == pytest.approx(spectral.max().item(), rel=1e-4)
    assert sums["entry_ratio"].item() == pytest.approx(ratio.sum().item(), rel=1e-6)
    assert sums["entry_ratio_max"].item() == pytest.approx(ratio.max().item(), rel=1e-6)
    assert sums["near_quarter"].item() == (ratio >= NEAR_BOUND).sum().item()
    assert spectral.max() <= 1 / (2 * temperature) + 1e-6


def test_bad_row_count_is_refused():
    with pytest.raises(ValueError, match="rows must be an integer >= 1, got 0"):
        AttentionJacobianMonitor(rows=0)


def test_jacobian_tags_on_llama_and_plain(tmp_path):
    """Jacobian tags beside 1/(4T) and 1/(2T), on a Llama and on a plain `attend` model, train and validation; the
    gradient monitor beside it logs no Jacobian tag of its own."""
    temperature = 0.5
    for name, module in (
        ("llama", LlamaModule(AttentionSpec(temperature=temperature))),
        ("plain", PlainAttention(AttentionSpec(temperature=temperature))),
    ):
        callbacks = [AttentionJacobianMonitor(every_n_steps=2), GradientNormMonitor(every_n_steps=2)]
        make_trainer(tmp_path / name, callbacks, max_steps=2).fit(module, token_loader(), token_loader(seed=1))
        logged = scalars(tmp_path / name)
        for prefix, steps in (("", (0, 1)), ("val/", (2,))):  # every 2 steps of 2: 0, and 1, the last
            assert logged[f"{prefix}attention/jacobian/bound_quarter_T"] == [
                (step, pytest.approx(1 / (4 * temperature))) for step in steps
            ]
            assert logged[f"{prefix}attention/jacobian/bound_half_T"] == [
                (step, pytest.approx(1 / (2 * temperature))) for step in steps
            ]
            for layer in (0, 1):
                value = logged[f"{prefix}attention/jacobian/layer_{layer}"][0][1]
                assert 0 < value <= 1 / (2 * temperature) + 1e-6
            assert logged[f"{prefix}attention/jacobian/max"][0][1] <= 1 / (2 * temperature) + 1e-6
            assert 0 < logged[f"{prefix}attention/jacobian/entry_ratio_mean"][0][1] <= 1.0
            assert logged[f"{prefix}attention/jacobian/entry_ratio_max"][0][1] <= 1.0 + 1e-9
            assert 0 <= logged[f"{prefix}attention/jacobian/frac_near_quarter_T"][0][1] <= 1.0
        assert [s for s, _ in logged["grad_norm/total"]] == [0, 1]  # every_n_steps=2 over steps 0, 1: 0 and the last
        assert "val/grad_norm/total" not in logged
        kinds = {t.split("/")[1] for t in logged if t.startswith("grad_norm/")}
        assert {"attn_q", "attn_k", "attn_v", "attn_out"} <= kinds


def test_gradient_monitor_alone_opens_no_tap(tmp_path):
    """One concern per callback: the gradient monitor writes gradient norms only, and never taps attention."""
    monitor = GradientNormMonitor(every_n_steps=1)
    assert not hasattr(monitor, "observe")
    make_trainer(tmp_path, [monitor], max_steps=1).fit(LlamaModule(AttentionSpec()), token_loader(), token_loader(seed=1))
    # `Summary` holds the copies of the run-level norms that lead TensorBoard's pages (`tags.LEADING`)
    assert {t.split("/")[0] for t in scalars(tmp_path)} <= {"grad_norm", "train", "val", "epoch", "Summary", "Summary_train"}
