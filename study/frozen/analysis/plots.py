"""Figure helpers shared by the analyses' figures (matplotlib with the Agg backend, set by `outputs.py`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from study.atomic import save_figure


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def box(ax, data: list, labels: list, title: str, ylabel: str):
    """One box per label over the defined values of each list in `data` (outliers hidden)."""
    clean = [[v for v in d if v is not None and math.isfinite(v)] for d in data]
    ax.boxplot(clean, showfliers=False)
    ax.set_xticks(range(1, len(labels) + 1), [str(x) for x in labels])
    ax.set_title(title)
    ax.set_ylabel(ylabel)


def heads(per_layer: list, index: int) -> list:
    """Every layer's heads of entry `index` of a [layer][index][head] array, as one list."""
    return [v for layer in per_layer for v in layer[index]]


def medians(per_layer: list) -> list[float]:
    """Median over every layer's heads of each entry of a [layer][index][head] array (None counts as NaN)."""
    return [np.nanmedian([np.nan if v is None else v for v in heads(per_layer, i)]) for i in range(len(per_layer[0]))]


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=100)
    finally:
        pyplot().close(fig)
    return path
