"""What an analysis is to `study analyze`: an `Analysis` record (its per-layer step, its results.json blocks, its
rows of per_head.csv, its figures, TensorBoard scalars and claims), what it is handed (`Settings`,
`LayerInput`), and the helpers the records share.

Each analysis module (`distance.py`, `critical.py`, `separability.py`, `gradient.py`, `dilution.py`) holds its
algorithm and its `Analysis`; `registry.ANALYSES` lists them in the order they run and appear in every output. The
runner (`protocol.py`) and the writers (`outputs.py`: files and `--tensorboard` scalars) only iterate over that registry.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .capture import AttentionCapture
from .grids import Grids


@dataclass(frozen=True)
class Settings:
    """Everything an analysis may read besides the layer: the grids and the run's options."""

    grids: Grids
    mc_samples: int  # Monte Carlo subsets per row for the distance expectation
    seed: int
    alphas: list[float]  # KS significance levels of Algorithm 3


@dataclass
class LayerInput:
    """One layer's captured attention, as every analysis sees it."""

    capture: AttentionCapture
    index: int  # the layer's index in the model
    weights: torch.Tensor  # (B, H, L, L) the layer's own attention weights, zeros above the diagonal
    vectors: torch.Tensor  # (B, H, L, Dh) values or (B, 1, L, D) hidden states: the x_i of the theorems
    dtype: torch.dtype

    def logits(self) -> torch.Tensor:
        """(B, H, L, L) scaled logits q.k * scaling, unmasked."""
        return self.capture.logits(self.index, dtype=self.dtype)


def _no_rows(results: dict, layer_ids: list[int]) -> Iterator[list]:
    return iter(())


def _no_figures(results: dict, out: Path) -> dict[str, Path]:
    return {}


def _no_scalars(results: dict) -> Iterator[tuple[str, float, int]]:
    return iter(())


def _no_claims(results: dict) -> list[dict]:
    return []


@dataclass(frozen=True)
class Analysis:
    """One analysis of `study analyze`. Only `name`, `layer` and `results` are required.

    name     the step's key in results["seconds_by_step"] (its wall time)
    layer    (settings, layer input) -> this layer's numbers (per-head tensors), kept for `results`
    results  (settings, every analysed layer's numbers in order) -> the blocks it adds to results.json
    csv_rows (results, analysed layer ids) -> rows of per_head.csv
             [analysis, metric, layer, head, L, N, T, eps, value]
    figures  (results, output folder) -> {name: path} of the PNG figures it draws
    scalars  results -> (TensorBoard tag, value, step) for `study analyze --tensorboard`
    claims   results -> the paper's claims it measures, each {claim, paper, measured} (no verdict: study report judges)
    window_keys  the keys of its `layer` dict that hold one entry per text window (dim 0), or None when its
             layer step cannot be run one window at a time (it draws random numbers per batch, or pools the
             windows otherwise than by a mean). With a tuple, `study analyze` may run the windows one at a time
             (long contexts) and `merge_windows` rebuilds what one call on every window gives.
    """

    name: str
    layer: Callable[[Settings, LayerInput], dict]
    results: Callable[[Settings, list[dict]], dict]
    csv_rows: Callable[[dict, list[int]], Iterator[list]] = _no_rows
    figures: Callable[[dict, Path], dict[str, Path]] = _no_figures
    scalars: Callable[[dict], Iterator[tuple[str, float, int]]] = _no_scalars
    claims: Callable[[dict], list[dict]] = _no_claims
    window_keys: tuple[str, ...] | None = None


def merge_windows(analysis: Analysis, per_window: list[dict]) -> dict:
    """One layer's `analysis.layer` outputs, computed one text window at a time, as one call on all the windows
    gives them: the per-window entries (`analysis.window_keys`) concatenated in window order, every other entry
    (a mean over windows and rows whose defined rows are the same in every window) averaged over the windows."""
    if analysis.window_keys is None:
        raise ValueError(f"analysis {analysis.name} cannot be run one text window at a time")

    def merge(values: list, by_window: bool):
        if isinstance(values[0], dict):
            return {k: merge([v[k] for v in values], by_window) for k in values[0]}
        return torch.cat(values, dim=0) if by_window else torch.stack(values).mean(0)

    return {key: merge([w[key] for w in per_window], key in analysis.window_keys) for key in per_window[0]}


def plain(value):
    """Tensors / arrays / floats -> nested Python lists with NaN and inf as None (strict JSON)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().double().numpy()
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value] if value.ndim else plain(value.item())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def stack_layers(per_layer: list[dict[str, torch.Tensor]]) -> dict:
    """[{key: tensor}] per layer -> {key: plain(tensors stacked over layers)}, in the first layer's key order."""
    return {k: plain(torch.stack([layer[k] for layer in per_layer])) for k in per_layer[0]}


def per_head_rows(analysis: str, block: dict, layer_ids: list[int], columns: Sequence[tuple], *,
                  heads_first: bool = False, skip: Sequence[str] = ()) -> Iterator[list]:
    """Rows of per_head.csv for a results block {metric: [layer][index][head]} ([layer][head][index] with
    heads_first): [analysis, metric, layer, head, *columns[index], value], columns[index] = (L, N, T, eps)."""
    for metric, per_layer in block.items():
        if metric in skip:
            continue
        for layer, rows in zip(layer_ids, per_layer):
            for i, row in enumerate(rows):
                for j, v in enumerate(row):
                    head, index = (i, j) if heads_first else (j, i)
                    yield [analysis, metric, layer, head, *columns[index], v]


def prefix_means(stat: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Per head mean over batch and rows t < L of a (B, H, L, G) statistic (NaN = undefined) -> (nL, G, H)."""
    valid = ~torch.isnan(stat)
    total = torch.nan_to_num(stat).double().sum(0).cumsum(1)  # (H, L, G)
    count = valid.double().sum(0).cumsum(1)
    idx = torch.tensor([n - 1 for n in lengths])
    return (total[:, idx] / count[:, idx]).permute(1, 2, 0)  # NaN where nothing was defined


def window_prefix_means(stat: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """`prefix_means` kept apart per batch item (each text window is a replicate) -> (B, nL, G, H)."""
    valid = ~torch.isnan(stat)
    total = torch.nan_to_num(stat).double().cumsum(2)  # (B, H, L, G)
    count = valid.double().cumsum(2)
    idx = torch.tensor([n - 1 for n in lengths])
    return (total[:, :, idx] / count[:, :, idx]).permute(0, 2, 3, 1)


def mean_of(values) -> float:
    """Mean of the defined (non-None) values; NaN when there is none."""
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else float("nan")


def nan_median(values: np.ndarray) -> np.ndarray:
    """Median over the last axis, NaN (undefined) entries left out; NaN where all are (numpy's median, the
    mean of the two middle values for an even count, as `median_over_heads`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice": NaN is the answer there
        return np.nanmedian(values, axis=-1)


def median_over_heads(per_layer: list, index: int) -> float | None:
    """Median over every layer's heads of entry `index` of a [layer][index][head] array; None if undefined."""
    vals = [v for layer in per_layer for v in layer[index] if v is not None]
    return float(np.median(vals)) if vals else None
