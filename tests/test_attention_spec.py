import math
import re

import pytest

from study.attention import AttentionSpec


@pytest.mark.parametrize("temperature", [0, -1.0, math.inf, math.nan, "1", True])
def test_bad_temperature_is_named(temperature):
    with pytest.raises(ValueError, match="temperature"):
        AttentionSpec(temperature=temperature)


@pytest.mark.parametrize("top_k", [0, -3, 2.5, "4", True])
def test_bad_top_k_is_named(top_k):
    with pytest.raises(ValueError, match="top_k.*got " + re.escape(repr(top_k))):
        AttentionSpec(top_k=top_k)


def test_unknown_normalizer_is_named():
    with pytest.raises(ValueError, match="'softermax'"):
        AttentionSpec(normalizer="softermax")


def test_bad_layers_are_named():
    with pytest.raises(ValueError, match="layers"):
        AttentionSpec(layers=[0, -1])


def test_layers_from_yaml_lists_become_tuples_and_select():
    spec = AttentionSpec(layers=[1, 3])
    assert spec.layers == (1, 3)
    assert spec.applies_to(3) and not spec.applies_to(0)


def test_hparams_are_scalars():
    hp = AttentionSpec(temperature=0.1, top_k=None).as_hparams()
    assert hp["temperature"] == 0.1 and hp["top_k"] == "all" and AttentionSpec(top_k=8).as_hparams()["top_k"] == "8" and hp["normalizer"] == "softmax"
    assert all(isinstance(v, (int, float, str, bool)) for v in hp.values())


def test_stock_softmax_flag():
    assert AttentionSpec(temperature=0.3).is_stock_softmax
    assert not AttentionSpec(top_k=4).is_stock_softmax
