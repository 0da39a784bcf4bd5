"""Attention monitors on real training runs: values read back from the TensorBoard event files."""

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from study import tags
from study.attention import AttentionSpec
from study.callbacks import (
    AttentionEntropyMonitor,
    AttentionMapMonitor,
    SelectionUniformityMonitor,
    TensorBoardLayout,
    custom_scalars_layout,
    draw_attention_map,
)
from study.callbacks import maps as maps_module
from tests.callback_helpers import (
    LlamaModule,
    PlainAttention,
    events,
    make_trainer,
    scalars,
    token_loader,
    uniform_attention_gpt2,
)

L_SEQ = 16


def causal_uniform_entropy(length: int) -> float:
    """Mean row entropy of uniform causal attention: row t spreads over t + 1 keys."""
    return sum(math.log(t + 1) for t in range(length)) / length


def test_uniform_attention_gpt2(tmp_path):
    """Zero queries in GPT-2 (q part of c_attn): normalised entropy 1, KL and TV to uniform 0, exact entropy."""
    module = uniform_attention_gpt2()
    monitors = [
        AttentionEntropyMonitor(every_n_steps=1),
        SelectionUniformityMonitor(every_n_steps=1, selection_ks=(1, 4)),
    ]
    trainer = make_trainer(tmp_path, monitors, max_steps=2)
    trainer.fit(module, token_loader(length=L_SEQ), token_loader(length=L_SEQ, seed=1))

    logged = scalars(tmp_path)
    for prefix in ("", "val/"):
        for layer in (0, 1):
            assert logged[f"{prefix}attention/normalized_entropy/layer_{layer}"][0][1] == pytest.approx(
                1.0, abs=1e-5
            )
            assert logged[f"{prefix}attention/kl_uniform/layer_{layer}"][0][1] == pytest.approx(0.0, abs=1e-5)
            assert logged[f"{prefix}attention/tv_uniform/layer_{layer}"][0][1] == pytest.approx(0.0, abs=1e-5)
            assert logged[f"{prefix}attention/entropy/layer_{layer}"][0][1] == pytest.approx(
                causal_uniform_entropy(L_SEQ), rel=1e-5
            )
            # Uniform over t + 1 keys: effective support t + 1, its mean (L + 1) / 2; top-4 mass min(4, t+1)/(t+1).
            assert logged[f"{prefix}attention/effective_support/layer_{layer}"][0][1] == pytest.approx(
                (L_SEQ + 1) / 2, rel=1e-5
            )
            top4 = sum(min(4, t + 1) / (t + 1) for t in range(L_SEQ)) / L_SEQ
            assert logged[f"{prefix}attention/topk_mass_k4/layer_{layer}"][0][1] == pytest.approx(
                top4, rel=1e-5
            )
            assert logged[f"{prefix}attention/selection_tv_k4/layer_{layer}"][0][1] == pytest.approx(
                0.0, abs=1e-5
            )
        assert logged[f"{prefix}attention/normalized_entropy/mean"][0][1] == pytest.approx(1.0, abs=1e-5)
    # Training tags at both logged steps (every_n_steps=1), once each; validation once at the end of fit.
    assert [s for s, _ in logged["attention/entropy/layer_0"]] == [0, 1]
    assert [s for s, _ in logged["val/attention/entropy/layer_0"]] == [2]
    hist = events(tmp_path).Histograms("attention/normalized_entropy/heads")
    assert len(hist) == 2 and hist[0].histogram_value.num == 4  # 2 layers x 2 heads
    assert hist[0].histogram_value.min == pytest.approx(1.0, abs=1e-5)


def test_top1_plain_model(tmp_path):
    """top_k = 1 on a plain `attend` model: one-hot rows, entropy 0, effective support 1."""
    module = PlainAttention(AttentionSpec(top_k=1))
    monitors = [AttentionEntropyMonitor(every_n_steps=1), SelectionUniformityMonitor(every_n_steps=1)]
    make_trainer(tmp_path, monitors).validate(module, token_loader(length=L_SEQ))
    logged = scalars(tmp_path)
    for layer in (0, 1):
        assert logged[f"val/attention/entropy/layer_{layer}"] == [(0, pytest.approx(0.0, abs=1e-6))]
        assert logged[f"val/attention/normalized_entropy/layer_{layer}"][0][1] == pytest.approx(0.0, abs=1e-6)
        assert logged[f"val/attention/effective_support/layer_{layer}"][0][1] == pytest.approx(1.0, abs=1e-6)
        assert logged[f"val/attention/max_weight/layer_{layer}"][0][1] == pytest.approx(1.0, abs=1e-6)
        assert logged[f"val/attention/nonzero/layer_{layer}"][0][1] == pytest.approx(1.0, abs=1e-6)
    # KL to uniform = log n - 0, averaged over rows.
    assert logged["val/attention/kl_uniform/mean"][0][1] == pytest.approx(
        causal_uniform_entropy(L_SEQ), rel=1e-5
    )


def test_entropy_falls_with_temperature(tmp_path):
    values = []
    for i, temperature in enumerate((4.0, 1.0, 0.25, 0.05)):
        module = PlainAttention(AttentionSpec(temperature=temperature), init_scale=3.0)
        make_trainer(tmp_path / str(i), [AttentionEntropyMonitor()]).validate(
            module, token_loader(length=L_SEQ)
        )
        values.append(scalars(tmp_path / str(i))["val/attention/normalized_entropy/mean"][0][1])
    assert all(a > b for a, b in zip(values, values[1:])), values
    assert values[0] - values[-1] > 0.3, values


def test_only_logging_steps_open_a_tap(tmp_path):
    """every_n_steps = 2 in a 5-step run: the forward of steps 0, 2 and 4 (the last) sees the tap, steps 1 and 3
    run with none open."""
    module = PlainAttention()
    monitor = AttentionEntropyMonitor(every_n_steps=2, validation=False)
    calls: list[int] = []
    observe_rows = monitor.observe_rows  # PlainAttention's stock softmax: row statistics, no weights
    monitor.observe_rows = lambda layer, *a: (calls.append(layer), observe_rows(layer, *a))
    make_trainer(tmp_path, [monitor], max_steps=5, limit_val_batches=0).fit(module, token_loader(n=10))
    assert module.taps_seen == [(0, 1), (1, 0), (2, 1), (3, 0), (4, 1)]
    assert calls == [0, 1, 0, 1, 0, 1]  # two layers, on three steps
    logged = scalars(tmp_path)
    assert [s for s, _ in logged["attention/entropy/layer_0"]] == [0, 2, 4]
    assert not any(tag.startswith("val/") for tag in logged)
    assert monitor.train_logs == 3 and not monitor.is_tapping


def test_llama_and_state_dict(tmp_path):
    """The same monitors on a transformers Llama (after apply_attention_spec); counters survive a checkpoint."""
    monitor = SelectionUniformityMonitor(every_n_steps=1, selection_ks=(2,))
    entropy = AttentionEntropyMonitor(every_n_steps=1, per_head=True)
    trainer = make_trainer(tmp_path, [monitor, entropy], max_steps=2, enable_checkpointing=True)
    trainer.fit(LlamaModule(AttentionSpec(temperature=0.5)), token_loader(), token_loader(seed=1))
    logged = scalars(tmp_path)
    for layer in (0, 1):
        value = logged[f"attention/normalized_entropy/layer_{layer}"][0][1]
        assert 0.0 < value < 1.0
        assert 0.0 < logged[f"attention/entropy/layer_{layer}/head_1"][0][1]
        assert logged[f"attention/topk_mass_k2/layer_{layer}"][0][1] <= 1.0 + 1e-6
    assert (entropy.train_logs, entropy.val_logs) == (2, 1)
    ckpt = trainer.checkpoint_callback.best_model_path
    state = torch.load(ckpt, weights_only=False)["callbacks"]
    restored = AttentionEntropyMonitor(every_n_steps=1, per_head=True)
    restored.load_state_dict(state[entropy.state_key])
    assert (restored.train_logs, restored.val_logs, restored.last_logged_step) == (2, 1, 2)


def test_attention_map_and_layout(tmp_path):
    """Uniform causal attention drawn as a colour-mapped figure: the image's data are the weights, zero above
    the diagonal and 1/(t+1) on row t, with a colour bar and labelled axes."""
    module = PlainAttention(zero_queries=True)
    monitor = AttentionMapMonitor(layers=[1], heads=[0])
    captured = {}
    original = maps_module.draw_attention_map

    def spy(weights, **kwargs):
        fig = original(weights, **kwargs)
        captured["fig"], captured["weights"] = fig, weights
        return fig

    maps_module.draw_attention_map = spy
    try:
        trainer = make_trainer(tmp_path, [monitor, TensorBoardLayout()], max_steps=2)
        trainer.fit(module, token_loader(length=L_SEQ), token_loader(length=L_SEQ))
    finally:
        maps_module.draw_attention_map = original
    acc = events(tmp_path)
    assert sorted(acc.Tags()["images"]) == ["attention_map/layer_1/head_0", "attention_map_before_after/layer_1/head_0"]
    # before any update (step 0) and at the end; every_n_steps = 500 would otherwise allow only one
    assert [image.step for image in acc.Images("attention_map/layer_1/head_0")] == [0, 2]
    # and both in one image, once there is an "after"
    assert [image.step for image in acc.Images("attention_map_before_after/layer_1/head_0")] == [2]
    image = acc.Images("attention_map/layer_1/head_0")[0]
    assert image.width > 200 and image.height > 200  # a rendered figure, not a 16 x 16 grey map
    expected = np.tril(1.0 / np.arange(1, L_SEQ + 1)[:, None] * np.ones((1, L_SEQ)))
    np.testing.assert_allclose(captured["weights"].numpy(), expected, atol=1e-3)  # after 2 steps
    main_ax, colorbar_ax = captured["fig"].axes
    np.testing.assert_allclose(main_ax.images[0].get_array(), captured["weights"].numpy())
    assert (main_ax.get_xlabel(), main_ax.get_ylabel()) == ("key position", "query position")
    assert "layer 1, head 0" in main_ax.get_title()
    assert colorbar_ax.get_ylabel() == "weight"
    # The custom-scalars layout is in the same event file.
    assert "custom_scalars__config__" in acc.Tags()["tensors"]
    assert any("Jacobian" in chart for chart in custom_scalars_layout()["gradients"])


def test_maps_side_by_side_share_one_colour_scale():
    """Before and after in one figure: each panel holds its own weights, both on one colour scale (the larger
    maximum), one colour bar, and a title large enough to read."""
    from study.callbacks.maps import draw_attention_maps

    before = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None]
    after = torch.eye(4) * 0.5
    fig = draw_attention_maps([(before, "step 0"), (after, "step 9")], title="layer 0, head 1: before and after")
    left, right, colorbar_ax = fig.axes
    np.testing.assert_allclose(left.images[0].get_array(), before.numpy())
    np.testing.assert_allclose(right.images[0].get_array(), after.numpy())
    assert left.images[0].norm is right.images[0].norm and right.images[0].norm.vmax == pytest.approx(1.0)
    assert (left.get_title(), right.get_title()) == ("step 0", "step 9")
    assert fig.get_suptitle() == "layer 0, head 1: before and after" and fig._suptitle.get_fontsize() >= 12
    assert colorbar_ax.get_ylabel() == "weight"
    with pytest.raises(ValueError, match="at least one"):
        draw_attention_maps([])


def test_attention_map_log_scale():
    """The log scale colours by log10(weight) from the floor up: exact zeros sit at the floor, not off-scale."""
    from matplotlib.colors import LogNorm

    weights = torch.tensor([[1.0, 0.0], [0.999, 1e-3]])
    fig = draw_attention_map(weights, log_scale=True, floor=1e-4)
    image = fig.axes[0].images[0]
    assert isinstance(image.norm, LogNorm) and image.norm.vmin == 1e-4
    assert image.get_array().min() == pytest.approx(1e-4)
    assert fig.axes[1].get_ylabel() == "weight (log scale)"
    with pytest.raises(ValueError, match="queries, keys"):
        draw_attention_map(torch.ones(2, 2, 2))


def test_the_layout_leads_with_the_question_and_draws_nothing_empty_by_construction():
    """The run summary opens on the first page's gradient card; the chart of the norm before and after clipping is
    there only for a run that clips, and the entropy-collapse count (0 in every run that does not collapse) is gone."""
    def titles(layout):
        return [chart for charts in layout.values() for chart in charts]

    clipping, plain = custom_scalars_layout(clipping=True), custom_scalars_layout(clipping=False)
    assert next(iter(plain["run summary"].values())) == ["Multiline", ["^" + re.escape(tags.LOG10_GRAD_QK) + "$"]]
    assert [t for t in titles(clipping) if t not in titles(plain)] == [t for t in titles(clipping) if "clipping" in t]
    assert len([t for t in titles(clipping) if "clipping" in t]) == 1
    assert not any("collapse" in t for t in titles(clipping))


def test_layout_charts_match_the_tags_the_monitors_write(tmp_path):
    """Every chart of the custom-scalars layout (built from study.tags) matches tags the monitors really log, and the
    Lemma 1 bins are consistent: n = 1 rows have max weight 1, and the bins cover the causal row lengths 1..16."""
    import re

    from study.callbacks import (
        AttentionJacobianMonitor,
        AttentionLogitMonitor,
        AttentionSinkMonitor,
        EntropyCollapseAlert,
        GradientNormMonitor,
    )

    monitors = [AttentionEntropyMonitor(every_n_steps=1), SelectionUniformityMonitor(every_n_steps=1, selection_ks=(2,)),
                GradientNormMonitor(every_n_steps=1), AttentionJacobianMonitor(every_n_steps=1, rows=4),
                AttentionLogitMonitor(every_n_steps=1), AttentionSinkMonitor(every_n_steps=1),
                EntropyCollapseAlert(every_n_steps=1)]  # fmt: skip
    make_trainer(tmp_path, monitors, max_steps=2, gradient_clip_val=1.0).fit(
        LlamaModule(AttentionSpec(temperature=0.5)), token_loader(length=L_SEQ), token_loader(length=L_SEQ, seed=1)
    )
    logged = set(scalars(tmp_path))
    module_tags = (tags.TRAIN_LOSS, tags.TRAIN_PPL, tags.VAL_LOSS, tags.VAL_PPL,  # CausalLMModule's, not a monitor's
                   tags.LOG10[tags.TRAIN_PPL], tags.LOG10[tags.VAL_PPL])  # fmt: skip
    for category, charts in custom_scalars_layout().items():
        for chart, (kind, regexes) in charts.items():
            if kind == "Margin":  # exact tags: the layer mean, the smallest and the largest layer value
                assert set(regexes) <= logged, (category, chart)
                continue
            if all(any(re.match(rx, tag) for tag in module_tags) for rx in regexes):
                continue
            assert any(re.match(rx, tag) for rx in regexes for tag in logged), (category, chart)
    values = scalars(tmp_path)
    bins = sorted(int(t.rsplit("/n", 1)[1]) for t in logged if t.startswith("val/attention/by_visible/max_weight/"))
    assert bins == [1, 2, 4, 8, 16]
    assert values["val/attention/by_visible/max_weight/n1"][-1][1] == pytest.approx(1.0)
    # every series' x axis is the step: one validation at the end of one fit, one point per tag
    assert all(len(values[t]) == 1 for t in logged if t.startswith("val/")), [t for t in logged if len(values[t]) != 1]
    # the band: the smallest and largest layer values around the layer mean, exact from the per-layer tags
    for prefix in ("", "val/"):
        layer_values = [values[f"{prefix}attention/entropy/layer_{i}"][-1][1] for i in range(2)]
        assert values[prefix + tags.attention_spread("entropy", "min")][-1][1] == pytest.approx(min(layer_values))
        assert values[prefix + tags.attention_spread("entropy", "max")][-1][1] == pytest.approx(max(layer_values))
    # the run-level copies that lead TensorBoard's pages hold the same values as their sources
    for source, copy in tags.LEADING.items():
        if source in values:
            assert values[copy] == values[source], copy
    for source, copy in tags.LOG10.items():  # and the log10 copies, at the same steps
        if source in values:
            assert values[copy] == [(step, pytest.approx(math.log10(v), rel=1e-6)) for step, v in values[source]], copy
    for tag in ("attention/saturated/mean", "attention/selection_entropy_k2/mean", "attention/jacobian/frac_saturated"):
        assert 0.0 <= values[tag][0][1] <= math.log(2) + 1e-6, tag


def test_map_monitor_refuses_layers_and_heads_the_model_does_not_have():
    """An asked-for head or layer that does not exist is an error naming it, not a map silently left out."""
    monitor = AttentionMapMonitor(heads=[0, 7])
    weights, allowed = torch.rand(1, 4, 5, 5).softmax(-1), torch.ones(1, 1, 5, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"heads=\[0, 7\] but layer 0 has 4 heads"):
        monitor.observe(0, weights, allowed, AttentionSpec())
    monitor = AttentionMapMonitor(layers=[0, 9])
    monitor.observe(0, weights, allowed, AttentionSpec())
    trainer = SimpleNamespace(sanity_checking=False, global_step=0, is_global_zero=True, loggers=[])
    with pytest.raises(ValueError, match=r"no attention layer \[9\] reached the monitor"):
        monitor.on_validation_epoch_end(trainer, None)
