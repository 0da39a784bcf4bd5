"""Which layers a per-layer monitor logs: ``layers: [0, 1, "mid", -2, -1]`` (Megatron-DeepSpeed#149's choice), or
indices; None logs every layer.

A 30-layer model with every statistic per layer floods TensorBoard (tensorboard#4170: 12k tags load in minutes);
a handful of layers keeps the first, the middle and the last in view. Negative indices count from the end and
"mid" is layer n // 2, so a choice is resolved against the model's number of attention layers n, which a monitor
learns from the taps (the largest layer number of its first tapped forward pass, plus one): monitors never look
at the model itself.
"""

from __future__ import annotations

from collections.abc import Sequence

MID = "mid"

LayerChoice = Sequence[int | str] | None


def check_layers(layers: LayerChoice) -> tuple[int | str, ...] | None:
    """The choice as a tuple, or a one-line ValueError naming the bad entry (before any training)."""
    if layers is None:
        return None
    if isinstance(layers, str | int):
        raise ValueError(f"layers must be a list of layer indices or {MID!r}, got {layers!r}")
    choice = tuple(layers)
    if not choice:
        raise ValueError("layers must name at least one layer (or be null for every layer), got []")
    for entry in choice:
        if not (entry == MID or (isinstance(entry, int) and not isinstance(entry, bool))):
            raise ValueError(f"layers entries must be integers or {MID!r}, got {entry!r} in {list(choice)}")
    return choice


def resolve_layers(choice: tuple[int | str, ...] | None, n_layers: int) -> frozenset[int] | None:
    """The layer numbers ``choice`` names in a model of ``n_layers`` attention layers (None: every layer).

    An index outside -n..n-1 is an error naming it: a config written for a deeper model must not log nothing.
    """
    if choice is None:
        return None
    out = set()
    for entry in choice:
        index = n_layers // 2 if entry == MID else int(entry)
        if not -n_layers <= index < n_layers:
            raise ValueError(f"layers={list(choice)}: layer {entry!r} is not among the model's {n_layers} attention "
                             f"layers (0..{n_layers - 1}, or -{n_layers}..-1 from the end)")
        out.add(index % n_layers)
    return frozenset(out)


__all__ = ["MID", "LayerChoice", "check_layers", "resolve_layers"]
