"""What TensorBoard itself shows for a folder of runs: its scalar series and its merged Custom Scalars layout, read
with TensorBoard's own loaders (the sweep and layout tests check what a user sees, not what the writer meant)."""

from __future__ import annotations

import json
from pathlib import Path


def as_tensorboard_reads(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run folder as TensorBoard loads it (every event file, in its order)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def merged_layout(sweep: Path) -> dict:
    """The Custom Scalars layout TensorBoard's plugin serves for a folder of runs (every run's layout, merged)."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(sweep))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(sweep))
    plugin = CustomScalarsPlugin(base_plugin.TBContext(logdir=str(sweep), multiplexer=multiplexer,
                                                       data_provider=provider))  # fmt: skip
    return json.loads(plugin.layout_impl(context.RequestContext(), ""))
