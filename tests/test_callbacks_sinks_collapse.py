"""AttentionSinkMonitor (planted first-key weights, closed forms) and EntropyCollapseAlert (a planted collapse, and
runs that must stay silent)."""

import json

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from study import tags
from study.attention import STOCK, AttentionSpec, attend
from study.callbacks import AttentionSinkMonitor, EntropyCollapseAlert
from study.callbacks.sinks import first_key_sums
from tests.callback_helpers import PlainAttention, events, make_trainer, scalars, token_loader

L_SEQ, D = 16, 4
SINK_LOGIT = 3.0  # head 0 of the planted model: q_i . k_0 = 3 for every query, every other logit 0


class PlantedHeads(L.LightningModule):
    """One attention layer of 2 heads with known logits: head 0 gives key 0 the logit ``SINK_LOGIT`` (times
    ``sharpen``) and every other key 0; head 1 is uniform (zero queries). ``sharpen_after`` multiplies the queries
    by ``sharpen`` from that optimizer step on (a collapse planted in the run)."""

    def __init__(self, spec: AttentionSpec = STOCK, layers: int = 1, sharpen: float = 1.0,
                 sharpen_after: int | None = None, random: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        if random:
            q, k = torch.randn(1, 2, L_SEQ, D, generator=g), torch.randn(1, 2, L_SEQ, D, generator=g)
        else:
            q, k = torch.zeros(1, 2, L_SEQ, D), torch.zeros(1, 2, L_SEQ, D)
            q[:, 0, :, 0] = SINK_LOGIT * D**0.5  # scaled by 1/sqrt(D) in attend
            k[:, 0, 0, 0] = 1.0
        self.q, self.k = nn.Parameter(q), nn.Parameter(k)
        self.v = nn.Parameter(torch.randn(1, 2, L_SEQ, D, generator=g))
        self.spec, self.n_layers, self.sharpen, self.sharpen_after = spec, layers, sharpen, sharpen_after

    def forward(self) -> torch.Tensor:
        scale = self.sharpen if self.sharpen_after is not None and self.global_step >= self.sharpen_after else 1.0
        return sum(attend(scale * self.q, self.k, self.v, self.spec, layer=i).square().mean() for i in range(self.n_layers))

    def training_step(self, batch, batch_idx):
        return self()

    def validation_step(self, batch, batch_idx):
        return self()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def batches() -> DataLoader:
    return DataLoader([{"x": torch.zeros(1)}], batch_size=1)


def planted_first_key_mean(logit: float) -> float:
    """Head 0: row t puts e^c / (e^c + t) on key 0 (t other keys at logit 0); the mean over the L rows."""
    e = torch.tensor(logit, dtype=torch.float64).exp()
    return float(sum(e / (e + t) for t in range(L_SEQ)) / L_SEQ)


def uniform_first_key_mean() -> float:
    return sum(1 / (t + 1) for t in range(L_SEQ)) / L_SEQ


def test_sink_rate_and_first_key_weight_of_planted_heads(tmp_path):
    monitor = AttentionSinkMonitor(every_n_steps=1, per_head=True)
    make_trainer(tmp_path, [monitor], max_steps=1, limit_val_batches=1).fit(PlantedHeads(layers=2), batches(), batches())
    logged = {tag: values[0][1] for tag, values in scalars(tmp_path).items()}
    sink, uniform = planted_first_key_mean(SINK_LOGIT), uniform_first_key_mean()
    assert sink > 0.3 > uniform  # one sink head and one that is not, at Gu et al.'s threshold
    for prefix in ("", "val/"):
        for layer in (0, 1):
            assert logged[prefix + tags.attention("first_key_weight", layer, 0)] == pytest.approx(sink, rel=1e-5)
            assert logged[prefix + tags.attention("first_key_weight", layer, 1)] == pytest.approx(uniform, rel=1e-5)
            assert logged[prefix + tags.attention("first_key_weight", layer)] == pytest.approx((sink + uniform) / 2, rel=1e-5)
            assert logged[prefix + tags.attention("sink_rate", layer)] == 0.5
        assert logged[prefix + tags.SINK_RATE] == 0.5
    assert logged[tags.LEADING[tags.SINK_RATE]] == 0.5


def test_threshold_moves_the_sink_rate(tmp_path):
    """At a threshold above the planted head's mean, no head is a sink; below the uniform head's, both are."""
    for threshold, rate in ((0.9, 0.0), (0.1, 1.0)):
        root = tmp_path / str(threshold)
        monitor = AttentionSinkMonitor(every_n_steps=1, validation=False, threshold=threshold)
        make_trainer(root, [monitor], max_steps=1).fit(PlantedHeads(), batches())
        assert scalars(root)[tags.SINK_RATE] == [(0, rate)]


def test_first_visible_key_under_left_padding():
    """With left padding the first visible key is the first unpadded one, not key 0."""
    weights = torch.zeros(2, 1, 3, 4)
    allowed = torch.ones(2, 1, 3, 4, dtype=torch.bool).tril(diagonal=1)
    allowed[1, :, :, 0] = False  # sample 1: key 0 is padding
    weights[0, 0, :, 0] = 0.25  # sample 0 puts 0.25 on key 0
    weights[1, 0, :, 1] = 0.75  # sample 1 puts 0.75 on key 1, its first visible key
    sums = first_key_sums(weights, allowed)
    assert sums["first_key_rows"].tolist() == [6.0]
    assert sums["first_key_weight"].tolist() == [pytest.approx(3 * 0.25 + 3 * 0.75)]


def test_sink_threshold_is_checked():
    for bad in (1.0, -0.1, "0.3", True):
        with pytest.raises(ValueError, match="threshold"):
            AttentionSinkMonitor(threshold=bad)


# ---- EntropyCollapseAlert ----------------------------------------------------------------------------------------
def test_planted_collapse_warns_once_writes_text_and_stops(tmp_path):
    """From step 2 on the random queries are 100x larger: every row puts its weight on one key and each layer's
    normalised entropy falls far below a quarter of its step-0 value."""
    alert = EntropyCollapseAlert(every_n_steps=1, action="stop")
    module = PlantedHeads(spec=AttentionSpec(), layers=2, sharpen=100.0, sharpen_after=2, random=True)
    with pytest.warns(UserWarning, match="attention entropy collapse: layer 0: normalised entropy .* at step 2") as caught:
        make_trainer(tmp_path, [alert], max_steps=6).fit(module, batches())
    assert len([w for w in caught if "entropy collapse" in str(w.message)]) == 1  # once, naming both layers
    assert "layer 1" in str(next(w for w in caught if "entropy collapse" in str(w.message)).message)
    assert [(e["layer"], e["step"]) for e in alert.events] == [(0, 2), (1, 2)]
    for event in alert.events:
        assert event["value"] < event["reference"] / 4
        assert event["rule"] == "fell by 4x and by 0.1"
    assert module.global_step == 3  # stopped after the step that collapsed
    logged = scalars(tmp_path)
    assert logged[tags.ENTROPY_COLLAPSE_LAYERS] == [(0, 0.0), (1, 0.0), (2, 2.0)]
    texts = events(tmp_path).Tensors(tags.ENTROPY_COLLAPSE_TEXT + "/text_summary")
    assert [t.step for t in texts] == [2]
    text = texts[0].tensor_proto.string_val[0].decode()
    assert "layer 0" in text and "layer 1" in text and "step 2" in text
    json.dumps(alert.status_events())  # what status.json records: plain JSON


def test_saturated_start_at_low_temperature_stays_silent(tmp_path, recwarn):
    """T = 0.01 on random q, k: rows are near one-hot from step 0. The relative default does not fire (a layer cannot
    fall from its own start); the absolute rule fires at step 0 there, which is why it is not the default."""
    module = PlantedHeads(spec=AttentionSpec(temperature=0.01), random=True)
    alert = EntropyCollapseAlert(every_n_steps=1)
    make_trainer(tmp_path / "relative", [alert], max_steps=4).fit(module, batches())
    assert alert.events == [] and module.global_step == 4
    assert scalars(tmp_path / "relative")[tags.ENTROPY_COLLAPSE_LAYERS] == [(s, 0.0) for s in range(4)]
    assert not [w for w in recwarn if "entropy collapse" in str(w.message)]
    assert alert.reference[0] < 0.25  # the start really is saturated

    absolute = EntropyCollapseAlert(every_n_steps=1, threshold=0.5)
    with pytest.warns(UserWarning, match="at step 0"):
        make_trainer(tmp_path / "absolute", [absolute], max_steps=2).fit(
            PlantedHeads(spec=AttentionSpec(temperature=0.01), random=True), batches())
    assert [e["step"] for e in absolute.events] == [0]


def test_training_at_low_temperature_stays_silent_and_state_round_trips(tmp_path):
    """A real training run (a plain causal LM at T = 0.01, SGD, 5 steps): its layer 0 starts saturated and its
    normalised entropy falls by more than 4x between hundredths. The default rule (a 4x fall of at least 0.1)
    stays silent; without the absolute part it fires."""
    alert = EntropyCollapseAlert(every_n_steps=1)
    relative_only = EntropyCollapseAlert(every_n_steps=1, min_drop=0.0)
    module = PlainAttention(spec=AttentionSpec(temperature=0.01), lr=1e-2)
    make_trainer(tmp_path, [alert, relative_only], max_steps=5).fit(module, token_loader(n=10))
    assert module.global_step == 5 and alert.events == [] and set(alert.reference) == {0, 1}
    assert alert.reference[0] < 0.1  # saturated from the start
    assert relative_only.events and relative_only.events[0]["layer"] == 0
    assert relative_only.events[0]["value"] < relative_only.events[0]["reference"] / 4
    restored = EntropyCollapseAlert(every_n_steps=1)
    restored.load_state_dict(alert.state_dict())
    assert restored.reference == alert.reference


def test_alert_options_are_checked():
    for kwargs, name in (({"factor": 1.0}, "factor"), ({"min_drop": 1}, "min_drop"), ({"threshold": 1.5}, "threshold"), ({"action": "halt"}, "action")):
        with pytest.raises(ValueError, match=name):
            EntropyCollapseAlert(**kwargs)


def test_events_reach_the_status_and_the_report():
    """study sweep's status record (`collapse_events`, and the reason of a run the alert stopped) and the report's
    section list the events."""
    from types import SimpleNamespace

    from study.report.markdown import collapse_section
    from study.report.summary import Summary
    from study.sweep.run import _collapse_events

    event = {"layer": 3, "step": 7, "value": 0.01, "reference": 0.6, "rule": "fell by 4x and by 0.1"}
    for action, reason in (("warn", None), ("stop", "attention entropy collapse in layer 3 at step 7")):
        alert = EntropyCollapseAlert(action=action)
        alert.events = [dict(event)]
        out = {}
        stopped = _collapse_events(SimpleNamespace(trainer=SimpleNamespace(callbacks=[alert])), out)
        assert out == {"collapse_events": [event]}
        assert stopped is None if reason is None else stopped.startswith(reason)
    quiet = {}
    assert _collapse_events(SimpleNamespace(trainer=SimpleNamespace(callbacks=[EntropyCollapseAlert()])), quiet) is None
    assert quiet == {}
    runs = [Summary("T0.01_s0", 0.01, None, run=SimpleNamespace(status={"collapse_events": [event]})),
            Summary("T1_s0", 1.0, None, run=SimpleNamespace(status={}))]
    section = collapse_section(runs)
    assert section[0].startswith("## Entropy collapse")
    assert [line for line in section if line.startswith("- ")] == [
        "- T0.01_s0: layer 3 at step 7, H/log n 0.01 (step 0: 0.6; fell by 4x and by 0.1)"]
    assert collapse_section(runs[1:]) == []


def test_a_run_the_alert_stopped_is_a_collapsed_result_not_a_divergence():
    """`action: stop` ends a run whose loss is finite: it is recorded "collapsed" (a result the sweep never reruns,
    the report counts), not "diverged", and the instability claim (which counts diverged runs, spikes and skipped
    steps) does not count it."""
    from types import SimpleNamespace

    from study.report.build import split_results
    from study.report.summary import Summary
    from study.sweep.run import FINAL_STATES, _outcome

    alert = EntropyCollapseAlert(action="stop")
    alert.events = [{"layer": 0, "step": 5, "value": 0.02, "reference": 0.7, "rule": "fell by 4x and by 0.1"}]
    trainer = SimpleNamespace(callback_metrics={"train/loss": 3.0}, global_step=5, interrupted=False,
                              callbacks=[alert], max_steps=20, limit_train_batches=1.0)  # fmt: skip
    run = SimpleNamespace(index=0)
    out = _outcome(SimpleNamespace(trainer=trainer), None, False, run)
    assert out["state"] == "collapsed" and out["reason"].startswith("attention entropy collapse in layer 0 at step 5")
    assert "collapsed" in FINAL_STATES
    summary = Summary("T0.1_s0", 0.1, None, state=out["state"])
    assert split_results([summary]) == ([summary], []) and not summary.diverged and not summary.unstable
