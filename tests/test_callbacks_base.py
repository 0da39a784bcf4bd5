"""docs/architecture.md's "A monitor" recipe, executed: a `TapMonitor` subclass written outside the package (one
class, its own tag) taps every attention call on logging steps and in validation, and its value is the closed form."""

import pytest
import torch

from study.callbacks.base import Sums, TapMonitor
from tests.callback_helpers import make_trainer, scalars, token_loader, uniform_attention_gpt2

L_SEQ = 16


class MeanMaxWeightMonitor(TapMonitor):
    """The largest weight of each row, averaged over rows and heads: a user's own monitor, nothing registered."""

    def summarize(self, layer, weights, allowed, spec):
        heads = (0, 2)  # sum over the batch and the rows, per head; rows may come in blocks
        rows = torch.full((weights.shape[1],), weights.shape[0] * weights.shape[2], dtype=torch.float64)
        return {"max_weight": weights.amax(dim=-1).to(torch.float64).sum(heads), "rows": rows}

    def compute(self, sums: Sums, phase, trainer, pl_module):
        return {f"custom/mean_max_weight/layer_{layer}": (s["max_weight"] / s["rows"]).mean()
                for layer, s in sorted(sums.items())}


def test_a_monitor_is_one_subclass_and_logs_the_closed_form(tmp_path):
    """Zero queries make causal attention uniform: row t's largest weight is 1/(t + 1), in every layer and head."""
    module = uniform_attention_gpt2()
    trainer = make_trainer(tmp_path, [MeanMaxWeightMonitor(every_n_steps=2)], max_steps=3)
    trainer.fit(module, token_loader(length=L_SEQ), token_loader(length=L_SEQ, seed=1))

    expected = sum(1 / (t + 1) for t in range(L_SEQ)) / L_SEQ
    logged = scalars(tmp_path)
    for layer in (0, 1):
        train = logged[f"custom/mean_max_weight/layer_{layer}"]
        assert [step for step, _ in train] == [0, 2]  # every_n_steps=2 from step 0; the run's last step is 2
        assert all(value == pytest.approx(expected, rel=1e-5) for _, value in train)
        # validation at the end of fit, at the step of the last update (the one its model has taken)
        assert logged[f"val/custom/mean_max_weight/layer_{layer}"] == [(2, pytest.approx(expected, rel=1e-5))]


def test_call_entropy_sums_are_computed_once_per_call_and_keep_no_weights_alive():
    """The entropy monitor and the collapse alert share one call's entropy sums: the second asker gets the
    first one's values, a new tensor or another spec is a new call, and the memo holds no tensor alive."""
    import gc
    import weakref
    from unittest import mock

    from study.attention import AttentionSpec
    from study.callbacks import base
    from study.metrics import entropy_sums

    torch.manual_seed(0)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    weights = torch.randn(2, 3, 5, 5).masked_fill(~allowed, -torch.inf).softmax(-1)
    spec = AttentionSpec()
    with mock.patch.object(base, "entropy_sums", wraps=entropy_sums) as computed:
        first = base.call_entropy_sums(weights, allowed, spec)
        second = base.call_entropy_sums(weights, allowed, spec)
        assert computed.call_count == 1
        expected = entropy_sums(weights, allowed)
        assert first.keys() == second.keys() == expected.keys()
        for key in expected:
            assert torch.equal(first[key], expected[key]) and torch.equal(second[key], expected[key])
        other = weights.clone()
        base.call_entropy_sums(other, allowed, spec)
        assert computed.call_count == 2  # same values, another tensor: another call
        base.call_entropy_sums(other, allowed, AttentionSpec(temperature=0.5))
        assert computed.call_count == 3
    gone = weakref.ref(other)
    del other, computed  # the mock's call records hold the arguments too
    gc.collect()
    assert gone() is None  # the memo did not keep the last call's weights


def test_one_calls_row_entropy_is_shared_and_never_computed_for_nothing():
    """The entropy monitor and the collapse alert compute a call's row entropy once between them; the selection
    monitor reads it when they came first and computes it itself otherwise (no extra pass when it is alone or first).
    Counted as entropy passes over the weights (xlogy); the sums equal the ones computed from scratch bit for bit
    (entropy_sums and summarize_rows, under top-k zeros)."""
    from unittest import mock

    from study.attention import AttentionSpec
    from study.callbacks import SelectionUniformityMonitor, base
    from study.metrics import attention as metrics
    from study.metrics import entropy_sums, summarize_rows

    torch.manual_seed(1)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    logits = torch.randn(2, 3, 6, 6).masked_fill(~allowed, -torch.inf)
    weights = logits.masked_fill(logits < logits.topk(2, -1).values[..., -1:], -torch.inf).softmax(-1)  # top-2
    spec = AttentionSpec(top_k=2)
    selection = SelectionUniformityMonitor(selection_ks=(1, 4))
    expected_entropy = entropy_sums(weights, allowed)
    expected_selection = summarize_rows(weights, allowed, selection_ks=(1, 4), by_visible=selection.by_visible)
    # (order of the monitors, entropy passes): entropy monitor + alert first, then selection: one pass for all
    # three; selection alone: its own pass only; selection first: its pass, then the entropy monitor's
    for order, passes in ((("entropy", "alert", "selection"), 1), (("selection",), 1), (("selection", "entropy"), 2)):
        probe = weights.clone()  # a new call
        got, full_size = {}, []
        entropy = metrics.row_entropy

        def counted(rows, entropy=entropy, full_size=full_size):  # the selection's top-k entropies are (.., k) wide
            full_size.append(rows.shape == weights.shape)
            return entropy(rows)

        with mock.patch.object(metrics, "row_entropy", side_effect=counted):
            for monitor in order:
                if monitor == "selection":
                    got[monitor] = selection.summarize(0, probe, allowed, spec)
                else:
                    got[monitor] = base.call_entropy_sums(probe, allowed, spec)
        assert sum(full_size) == passes, order
        for monitor, sums in got.items():
            expected = expected_selection if monitor == "selection" else expected_entropy
            assert sums.keys() <= expected.keys()
            for key, value in sums.items():
                assert torch.equal(value, expected[key]), (order, monitor, key)


def test_a_logging_steps_scalars_are_one_tensorboard_event_read_back_as_each_tag(tmp_path):
    """write_scalars puts a step's scalars in one event of the TensorBoardLogger's file (not one per tag), and
    TensorBoard's reader gives every tag its value at that step, as add_scalar's events would; a prefixed logger
    keeps Lightning's own log_metrics (its prefix applied)."""
    from types import SimpleNamespace

    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from study.callbacks.base import write_scalars
    from study.report.read import read_scalars

    plain = TensorBoardLogger(tmp_path, name="plain", version=0)
    prefixed = TensorBoardLogger(tmp_path, name="prefixed", version=0, prefix="run")
    trainer = SimpleNamespace(is_global_zero=True, loggers=[plain, prefixed])
    metrics = {f"attention/stat_{i}/layer_{layer}": i + layer / 3 for i in range(5) for layer in range(4)}
    write_scalars(trainer, metrics, step=7)
    write_scalars(trainer, {key: -v for key, v in metrics.items()}, step=8)
    for logger in (plain, prefixed):
        logger.experiment.flush()
    got = read_scalars(plain.log_dir)
    for key, value in metrics.items():
        assert got[key] == [(7, pytest.approx(value, rel=1e-6)), (8, pytest.approx(-value, rel=1e-6))]
    (events,) = list((tmp_path / "plain" / "version_0").glob("events.*"))
    summaries = [e for e in EventFileLoader(str(events)).Load() if e.HasField("summary")]
    assert [e.step for e in summaries] == [7, 8] and len(summaries[0].summary.value) == len(metrics)
    assert set(read_scalars(prefixed.log_dir)) == {f"run-{key}" for key in metrics}
