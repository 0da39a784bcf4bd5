"""The layer filter of the per-layer monitors: `layers: [0, "mid", -1]` logs those layers only, the layer means and
spreads are over them, and the values are the ones an unfiltered monitor logs for the same layers."""

import re

import pytest

from study import tags
from study.callbacks import (
    AttentionEntropyMonitor,
    AttentionJacobianMonitor,
    AttentionSinkMonitor,
    GradientNormMonitor,
    SelectionUniformityMonitor,
)
from study.callbacks.layers import resolve_layers
from tests.callback_helpers import PlainAttention, make_trainer, scalars, token_loader

CHOICE = [0, "mid", -1]  # in a 5-layer model: layers 0, 2 and 4


def logged_layers(logged: dict, prefix: str) -> set[int]:
    return {int(m.group(1)) for t in logged if (m := re.match(re.escape(prefix) + r"(\d+)(/|$)", t))}


def test_resolve_layers():
    assert resolve_layers((0, 1, "mid", -2, -1), 30) == {0, 1, 15, 28, 29}
    assert resolve_layers(("mid",), 1) == {0}
    assert resolve_layers(None, 4) is None
    with pytest.raises(ValueError, match="layer -6 is not among"):
        resolve_layers((-6,), 5)


def test_filtered_monitors_log_the_chosen_layers_with_unfiltered_values(tmp_path):
    def monitors(layers):
        return [AttentionEntropyMonitor(every_n_steps=1, layers=layers), SelectionUniformityMonitor(every_n_steps=1, layers=layers),
                AttentionJacobianMonitor(every_n_steps=1, layers=layers), AttentionSinkMonitor(every_n_steps=1, layers=layers),
                GradientNormMonitor(every_n_steps=1, by=("block", "kind", "block_kind"), layers=layers)]  # fmt: skip

    runs = {}
    for name, layers in (("all", None), ("chosen", CHOICE)):
        make_trainer(tmp_path / name, monitors(layers), max_steps=2).fit(
            PlainAttention(n_layer=5), token_loader(), token_loader(seed=1))
        runs[name] = {tag: values for tag, values in scalars(tmp_path / name).items()}
    full, chosen = runs["all"], runs["chosen"]
    assert logged_layers(full, "attention/entropy/layer_") == {0, 1, 2, 3, 4}
    for prefix in ("", "val/"):
        for statistic in ("entropy", "kl_uniform", "first_key_weight", "sink_rate"):
            assert logged_layers(chosen, f"{prefix}attention/{statistic}/layer_") == {0, 2, 4}, (prefix, statistic)
            for layer in (0, 2, 4):
                tag = prefix + tags.attention(statistic, layer)
                assert chosen[tag] == full[tag]
        layer_values = [full[prefix + tags.attention("entropy", layer)][-1][1] for layer in (0, 2, 4)]
        assert chosen[prefix + tags.attention("entropy")][-1][1] == pytest.approx(sum(layer_values) / 3)
        assert chosen[prefix + tags.attention_spread("entropy", "max")][-1][1] == pytest.approx(max(layer_values))
    assert logged_layers(chosen, "attention/jacobian/layer_") == {0, 2, 4}
    # gradients: the blocks' norms follow the filter; the total and the kinds still cover every parameter
    assert logged_layers(full, "grad_norm/block_") == {0, 1, 2, 3, 4}
    assert logged_layers(chosen, "grad_norm/block_") == {0, 2, 4}
    assert chosen[tags.GRAD_NORM] == full[tags.GRAD_NORM]
