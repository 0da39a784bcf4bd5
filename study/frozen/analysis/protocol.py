"""Run the paper's five analyses on a causal LM and write results, a per-head CSV, figures and a verdict table.

Protocol (after the paper, arXiv 2508.17821, on a frozen model):
- Alg. 1: N fixed (5) over a grid of lengths L: per head, token-averaged d, bound, E over a text prefix of
  length L. The model is causal, so the capture of a prefix equals the first L positions of the full capture
  (tested): the text is run once at the longest length and sliced.
- Alg. 2: L fixed (the longest), N in {1, 5, 10, 20, 100} (those <= L).
- Alg. 3: per L, per N on a grid: two-sample KS test between per-head d and per-head E over ALL heads of all
  layers; N* = first N with p >= alpha (alpha 0.01 as in the text, 0.05 as in the pseudocode).
- Alg. 4: separability N_s/N and both bounds per N at the longest L, per head.
- Alg. 5: g(T, eps) over a log grid of T, token-averaged, max over heads; exact Jacobian spectral norm on a
  subsample of rows, beside min(1/(4T), sqrt(2)) and 1/(2T).
- Lemma 1: max weight and n * min/max weight at visible count n = each L of the grid.
Token averages use only rows where the statistic is defined (visible count >= N; > N for separability).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from study.attention import causal_allowed
from study.attention.normalizers import masked_softmax
from study.progress import progress

from . import registry
from .capture import capture_attention, context_length
from .distance import distance_stats
from .grids import PAPER_EPSILONS, PAPER_NS, Grids, check_grids
from .reference import distance_row
from .registration import LayerInput, Settings, merge_windows

__all__ = ["PAPER_EPSILONS", "PAPER_NS", "analyze", "benchmark_against_oracle", "compare_with_paper"]


@contextmanager
def timed(seconds: dict[str, float], name: str, cpu: dict[str, float] | None = None) -> Iterator[None]:
    """Add the block's wall time to ``seconds[name]`` (and this process's CPU time to ``cpu[name]``)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        seconds[name] += time.perf_counter() - start
        if cpu is not None:
            cpu[name] += time.process_time() - start_cpu


@torch.no_grad()
def analyze(model, input_ids: torch.Tensor, *, lengths: Sequence[int] | None = None,
            ns: Sequence[int] = PAPER_NS, n_fixed: int = 5, critical_ns: Sequence[int] | None = None,
            separability_ns: Sequence[int] | None = None, temperatures: Sequence[float] | None = None,
            epsilons: Sequence[float] = PAPER_EPSILONS, vectors: str = "value", mc_samples: int = 4,
            alphas: Sequence[float] = (0.01, 0.05), spectral_rows: int = 32, seed: int = 0,
            dtype: torch.dtype = torch.float32, layers: Sequence[int] | None = None,
            analyses: Sequence[str] | None = None, one_window_at_a_time: bool | None = None,
            show_progress: bool = False) -> dict:
    """Capture the model's attention on `input_ids` (B, L) and run Algorithms 1-5 and Lemma 1.

    Returns plain Python (JSON-serialisable) results: every per-head number, the aggregates, and the
    choices made (vectors, distance reading, alpha values, reconstructions). The longest length is
    input_ids.shape[1]; `lengths` must lie in [1, that]. `layers` restricts the analyses to those layer
    indices (all by default); per-layer arrays follow `choices["layers"]`. `analyses` names the analyses to run
    (`registry.BY_NAME`; all by default). `show_progress` reports each layer with the time left (`study.progress`).

    Only the analysed layers' q, k, v are kept. `one_window_at_a_time`: capture and analyse the text windows (the
    rows of input_ids) one by one and merge them (`registration.merge_windows`: the same results as all at once),
    so that one window's (H, L, L) weights are in memory at a time; None does so whenever every chosen analysis
    can (`Analysis.window_keys`: critical and dilution), True requires it.
    """
    if vectors not in ("value", "hidden"):
        raise ValueError(f"vectors must be 'value' or 'hidden', got {vectors!r}")
    names = None if analyses is None else registry.check_names(analyses)
    chosen = list(registry.ANALYSES) if names is None else [registry.BY_NAME[name] for name in names]
    windowable = all(a.window_keys is not None for a in chosen)
    if one_window_at_a_time and not windowable:
        cannot = [a.name for a in chosen if a.window_keys is None]
        raise ValueError(f"analyses {cannot} cannot run one text window at a time (they draw random numbers per "
                         "batch); choose among critical, dilution")
    one_window_at_a_time = windowable if one_window_at_a_time is None else one_window_at_a_time
    input_ids = torch.as_tensor(input_ids)
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.ndim != 2 or input_ids.numel() == 0:
        raise ValueError(f"empty text: input_ids must be (B, L) with L >= 1, got shape {tuple(input_ids.shape)}")
    limit = context_length(model)
    grids = check_grids(input_ids, limit, lengths=lengths, ns=ns, n_fixed=n_fixed, critical_ns=critical_ns,
                        separability_ns=separability_ns, temperatures=temperatures, epsilons=epsilons,
                        spectral_rows=spectral_rows)
    input_ids = input_ids[:, : grids.max_len]

    started, started_cpu = time.perf_counter(), time.process_time()
    settings = Settings(grids=grids, mc_samples=mc_samples, seed=seed, alphas=list(alphas))
    seconds = {"capture": 0.0, **{a.name: 0.0 for a in chosen}}
    # CPU time beside wall time: on a shared machine only the former measures the work
    cpu = {"capture": 0.0, **{a.name: 0.0 for a in chosen}}
    batches = [input_ids[w:w + 1] for w in range(input_ids.shape[0])] if one_window_at_a_time else [input_ids]
    # per_window[analysis][batch][layer]: each analysis' layer outputs, per batch of windows, layers in order
    per_window: dict[str, list[list[dict]]] = {a.name: [] for a in chosen}
    bar = None
    for batch in batches:
        with timed(seconds, "capture", cpu):
            cap = capture_attention(model, batch, hidden_states=(vectors == "hidden"), layers=layers)
        if bar is None:
            layers = _check_layers(layers, cap.n_layers)
            units = [(w, index) for w in range(len(batches)) for index in layers]
            label = (lambda u: f"{u[1]} (window {u[0]})") if len(batches) > 1 else (lambda u: str(u[1]))
            bar = iter(progress(units, "analyze", unit="layer", enabled=show_progress, label=label))
        for analysis in chosen:
            per_window[analysis.name].append([])
        for index in layers:
            next(bar)
            layer = LayerInput(capture=cap, index=index, weights=cap.weights(index, dtype=dtype),
                               vectors=cap.vectors(index, vectors, dtype=dtype), dtype=dtype)
            for analysis in chosen:
                with timed(seconds, analysis.name, cpu):
                    per_window[analysis.name][-1].append(analysis.layer(settings, layer))
            del layer
    next(bar, None)  # the bar's end line
    per_layer = {a.name: [merge_windows(a, list(outputs)) if one_window_at_a_time else outputs[0]
                          for outputs in zip(*per_window[a.name])] for a in chosen}

    results = {
        "choices": _choices(grids, cap, layers, vectors=vectors, alphas=alphas, mc_samples=mc_samples, seed=seed,
                            dtype=dtype),
        "model": _model_summary(cap, layers, batch=int(input_ids.shape[0]), max_len=grids.max_len, context=limit),
        **{key: block for a in chosen for key, block in a.results(settings, per_layer[a.name]).items()},
        "seconds": time.perf_counter() - started,
        "seconds_by_step": seconds,
        "cpu_seconds": time.process_time() - started_cpu,  # this process, all its threads
        "cpu_seconds_by_step": cpu,
    }
    # Recorded only off the defaults, so that a run of every analysis all at once keeps its layout.
    if names is not None and len(names) < len(registry.BY_NAME):
        results["choices"]["analyses"] = names
    if one_window_at_a_time:
        results["choices"]["windows"] = "one at a time, merged (the same numbers as all at once)"
    results["claims"] = compare_with_paper(results)
    return results


def _check_layers(layers: Sequence[int] | None, n_layers: int) -> list[int]:
    """The analysed layers, sorted (every layer by default); ValueError naming one the model does not have."""
    if layers is None:
        return list(range(n_layers))
    layers = sorted({int(i) for i in layers})
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad or not layers:
        raise ValueError(f"layers {bad or layers} not in the model, which has layers 0..{n_layers - 1}")
    return layers


def _choices(grids: Grids, cap, layers: list[int], *, vectors: str, alphas, mc_samples: int, seed: int,
             dtype: torch.dtype) -> dict:
    """Every choice the analysis made, written beside the numbers."""
    all_softmax = all(cap.spec(layer).is_stock_softmax for layer in layers)
    return {
        "vectors": vectors,
        "vector_note": "per-head value vectors v_i" if vectors == "value"
        else "hidden state entering each block (residual stream), shared by the block's heads",
        "distance_reading": "sum_outside (main); norm_of_sum also reported",
        "alphas": list(alphas),
        "n_fixed": grids.n_fixed, "lengths": grids.lengths, "ns": grids.ns, "critical_ns": grids.critical_ns,
        "separability_ns": grids.separability_ns, "temperatures": grids.temperatures, "epsilons": grids.epsilons,
        "mc_samples": mc_samples, "seed": seed, "layers": layers, "dtype": str(dtype),
        "spectral_rows": grids.spectral_rows.tolist(),
        "sphere_radius": "M = mean norm of the head's vectors over positions (per batch item and head)",
        "token_average": "rows where the statistic is defined (visible >= N; > N for separability), batch pooled",
        "prefixes": "one causal pass at the longest L, sliced (identical to running each prefix)",
        "weights": "each layer's own attention weights: its normaliser, temperature and top-k "
                   "(the spec set by apply_attention_spec; stock softmax at T = 1 without one)",
        "gradient_probe": "softmax((l + eps v)/T) (the paper's perturbation)" if all_softmax else
        "finite differences through each layer's own normaliser and top-k at temperature T "
        "(softmax layers: the paper's softmax perturbation); the spectral norms are of the softmax Jacobian at "
        "the same logits, a reference only for non-softmax layers",
        "reconstructions": ["distance d (sum outside the norm)", "Theorem 1 bound", "closed-form E",
                            "Theorem 2 xi, lower and upper bounds"],
    }


def _model_summary(cap, layers: list[int], *, batch: int, max_len: int, context: int | None) -> dict:
    specs = [cap.spec(layer) for layer in layers]
    return {**cap.meta, "layers": cap.n_layers, "heads": cap.n_heads, "batch": batch, "max_length": max_len,
            "context": context, "normalizers": sorted({sp.normalizer for sp in specs}),
            "attention": [{"layer": i, **sp.as_hparams()} for i, sp in zip(layers, specs)]}


def compare_with_paper(results: dict) -> list[dict]:
    """The paper's quantitative claims beside our measurement (no verdict: `study report` judges them)."""
    return [claim for analysis in registry.chosen(results) for claim in analysis.claims(results)]


def benchmark_against_oracle(L: int = 512, *, dim: int = 64, n_top: int = 5, seed: int = 0,
                             oracle_rows: int | None = None) -> dict:
    """Time Theorem 1 (d, both readings, bound, closed-form E) for one causal head: vectorised vs loop.

    The loop oracle (study.frozen.analysis.reference) is the paper's per-row, per-token style. With `oracle_rows`
    the oracle runs on that many evenly spaced rows and its time is scaled to all L rows by their cost
    (proportional to the visible count); None runs it on every row. Results are checked to agree.
    """
    if L < n_top:
        raise ValueError(f"N={n_top} exceeds L={L}")
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(L, L, generator=gen, dtype=torch.float64) * 2
    w = masked_softmax(logits, causal_allowed(L, L, logits.device))
    x = torch.randn(L, dim, generator=gen, dtype=torch.float64)
    w32, x32 = w.float(), x.float()
    distance_stats(w32[:8, :8], x32[:8], [1])  # warm-up
    t0 = time.perf_counter()
    vec = distance_stats(w32, x32, [n_top])
    t_vec = time.perf_counter() - t0
    rows = range(L) if oracle_rows is None else np.unique(np.linspace(n_top - 1, L - 1, oracle_rows).astype(int))
    wn, xn = w.numpy(), x.numpy()
    t0 = time.perf_counter()
    err = 0.0
    for t in rows:
        if t + 1 < n_top:
            continue
        ref = distance_row(wn[t, : t + 1], xn[: t + 1], n_top)
        err = max(err, abs(ref["d_sum_outside"] - vec["d_sum_outside"][t, 0].item())
                  / max(1e-12, abs(ref["d_sum_outside"])))
    t_loop = time.perf_counter() - t0
    if oracle_rows is not None:
        cost = lambda ts: sum(t + 1 for t in ts if t + 1 >= n_top)  # noqa: E731
        t_loop *= cost(range(L)) / cost(rows)
    return {"L": L, "dim": dim, "N": n_top, "vectorised_s": t_vec, "loop_s": t_loop,
            "speedup": t_loop / t_vec, "max_relative_difference_fp32_vs_fp64": err,
            "oracle_rows": "all" if oracle_rows is None else len(rows)}
