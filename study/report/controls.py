"""Positive and negative controls: settings whose answer is known by construction, measured by the same code as the
study's data and judged by the same finding functions as the paper's claims.

A rule that can come out either way should be seen to do so. Each control feeds planted data through a measuring
function the study uses on real data and then through the finding function that judges the claim:

- "grows like 1/T" (claim 5): attention logits q k^T from a tiny random attention layer. With W_q scaled near zero
  the rows stay near uniform at every T of the grid, where the softmax Jacobian is (1/T)(diag(a) - a a^T) with a
  fixed a: g(T, eps) (Algorithm 5, `study.frozen.analysis.gradient.gradient_sensitivity`) and the exact Jacobian
  norm (`study.metrics.softmax_jacobian_norm`, the monitors' and the probe's) scale exactly like 1/T, so
  `band_finding` must say supported. With W_q scaled up the rows are saturated (one weight near 1) at every T, where
  both fall like exp(-gap/T) as T falls: not supported.
- "g follows 1/T for T < 0.1" and "g drops about 100x to T = 1" (claim 5, frozen model): the same two kinds of
  rows (near uniform even at T = 0.01: W_q scaled by 1e-6) through the frozen analysis's own Algorithm 5 step
  (`study.frozen.analysis.gradient.GRADIENT`: its per-layer step and its results.json blocks) into
  `gradient_slope_finding` and `gradient_drop_finding`: 1/T exactly, so a drop of exactly 100x (supported); saturated
  rows are flat or falling at low T (not supported).
- "N* ~ 0.06 L" and "N* grows in proportion to L" (claim 3, Theorem 1): per-head distances d and expectations E
  planted per text window, identical (a KS test cannot tell them apart) from a known N0 on and three times larger
  below it, through Algorithm 3's own results step (`CRITICAL`: its KS tests, N* per window and its results.json
  blocks) into `n_star_finding` and `n_star_slope_finding`. N0 = (0.05-0.07) L: both supported; N0 = (0.32-0.64) L:
  N*/L not supported; N0 the same at every L: not proportional (not supported).
- "N_s/N saturates at 0.70-0.85" (claim 4, Theorem 2): a planted top-N geometry whose N_s/N is known by
  construction (`planted_separability`), through Algorithm 4's own step (`SEPARABILITY`) into `separability_finding`.
  A share of the N selected keys opposes the sum of the others, the rest are orthogonal to each other and lean
  towards it: N_s is the number that lean. About 3/4 of them (supported) and nearly all (not supported).
- "low temperature makes training unstable" (claim 6): planted loss curves through `count_spikes` (the spike count
  of every run's summary) into `instability_finding`. Every low-T run has a loss spike, every reference run is calm:
  supported. Every run calm, as many per group as the rule needs to exclude the claimed effect: not supported.
- "the selected set drifts towards uniform" and "fine-tuning leaves most of the step-0 gap" (claim 6): planted
  scalar series of whole runs (the validation H(top-k) entropy and loss at step 0 and at the end) through
  `summarize`, the function that reads every real run's event files into its summary, into `drift_finding` and
  `recovery_finding`: entropy rising by 0.1 of log k in every seed against no change; 90% of the gap left against
  5%.
- "the T-slope steepens with each low-T layer crossed" (the depth rows): planted per-layer W_q and W_k gradient
  series of a 6-layer model at 3 T through `summarize` (`layer_gradients`) into the depth finding: the T-slope
  steeper by 0.2 for each layer crossed (supported) against the same T-slope in every layer (not supported).
- "low temperature lowers the largest stable learning rate" (the SGD bracket, claim 6): planted plain-SGD runs, one
  per (T, learning rate) cell as in the main job's arm, their run status (a divergence at step 1, as the guard
  records it) and loss series through `summarize` into `lr_stability_findings`: a learning rate that diverges only
  at the low T (supported), only at T = 1 (not supported), or at both T alike (inconclusive: the rule's null).

The controls sit beside the findings, outside their Bonferroni family (each at the single-interval level), and the
report shows each verdict with the expected one. tests/test_report_controls.py fails when one differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from study import tags
from study.report import sources
from study.report.findings import (
    GAP_TEST_STEPS,
    Finding,
    band_finding,
    depth_findings_by_group,
    drift_finding,
    instability_finding,
    lr_stability_findings,
    recovery_finding,
)
from study.report.frozen import (
    ALPHA,
    gradient_drop_finding,
    gradient_slope_finding,
    n_star_finding,
    n_star_slope_finding,
    separability_finding,
)
from study.report.read import RunData
from study.report.stats import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, Family, family_level
from study.report.summary import SPIKES, Summary, count_spikes, share_baselines, summarize

TEMPERATURES = (0.25, 0.5, 1.0, 2.0, 4.0)  # the grid of the sensitivity controls: four octaves
WINDOWS = 6  # independent planted inputs (one random layer and input each): the replicates of a slope
LENGTH, DIM = 24, 16  # tokens per planted window, head dimension
NEAR_UNIFORM_SCALE = 1e-4  # W_q scale: logits/T stay below about 1e-2 at the grid's lowest T
SATURATED_SCALE = 8.0  # W_q scale: the largest logit leads the next by tens at every T of the grid
EPSILON = 1e-3  # Algorithm 5's perturbation size (the smallest of the probe's)
STABILITY_RUNS = 12  # runs per group: enough calm runs to exclude the claimed unstable fraction (calm_runs_needed)
STEPS = 20  # logged training losses per planted run
FROZEN_TEMPERATURES = (0.01, 0.02, 0.05, 1.0)  # the frozen rows' grid: three T below 0.1 and the reference T = 1
FROZEN_EPSILON = 1e-4  # small beside the lowest T, so the finite difference is the Jacobian's (eps / T = 0.01)
FROZEN_NEAR_UNIFORM_SCALE = 1e-6  # logits / T below about 1e-3 at T = 0.01
SEPARABILITY_N = 32  # the selected keys I_N (the paper's rule reads N >= 16)
SEPARABILITY_LENGTH = 40  # keys per planted window: every row t >= N has keys outside I_N
# opposed keys among the N selected, per window: N_s = N minus these (0.719-0.781 of N; 0.938-1)
SEPARABILITY_OPPOSED = {"about 3/4 of I_N separable": (7, 8, 9, 8, 7, 9),
                        "nearly all of I_N separable": (0, 1, 2, 1, 0, 2)}  # fmt: skip
CRITICAL_LENGTHS = (100, 200, 400)  # the lengths L of the planted N* rows
CRITICAL_NS = (4, 5, 6, 7, 10, 12, 14, 20, 24, 28, 32, 50, 64, 100, 128, 200, 256)  # Algorithm 3's N grid
CRITICAL_LAYERS, CRITICAL_HEADS = 3, 9  # heads pooled by each window's KS test: 27, as few as the main job's fewest
# N0 / L per (window, length): the grid values 0.05, 0.06 and 0.07 in turn, so windows and lengths differ
SMALL_RATIOS = (0.05, 0.06, 0.07)
SEEDS = 6  # planted seeds of the drift, gap and depth controls (the replicate unit), each with runs at 3 T
DEPTH_LAYERS = 6  # layers of the depth control's planted runs: layer l crosses 6 - l low-T layers
BRACKET_LRS = (0.01, 1.0)  # the learning-rate grid of the bracket controls (the main job's SGD arm's)
BRACKET_TEMPERATURES = (0.01, 1.0)  # the lowest T and the reference, as in the main job's SGD arm
BRACKET_SEEDS = 2  # runs per cell: the rule is judged from 2 on (one run per cell is only observed)


@dataclass
class Control:
    name: str  # what was planted
    expected: str  # the verdict the construction forces
    finding: Finding

    @property
    def passed(self) -> bool:
        return self.finding.verdict == self.expected


def planted_logits(scale: float, window: int):
    """(1, 2, L, L) float64 attention logits x W_q (x W_k)^T / sqrt(d) of a random two-head layer, W_q scaled by
    `scale`; `window` seeds the layer and its input."""
    import torch

    gen = torch.Generator().manual_seed(window)
    x = torch.randn(LENGTH, DIM, generator=gen, dtype=torch.float64)
    w_q = scale * torch.randn(2, DIM, DIM, generator=gen, dtype=torch.float64)
    w_k = torch.randn(2, DIM, DIM, generator=gen, dtype=torch.float64)
    q, k = torch.einsum("ld,hde->hle", x, w_q), torch.einsum("ld,hde->hle", x, w_k)
    return (q @ k.transpose(1, 2)).unsqueeze(0) / DIM**0.5


def g_levels(scale: float) -> dict[float, list[float]]:
    """{T: [g(T, EPSILON) averaged over heads and causal rows, one per window]}: Algorithm 5 as the frozen analysis
    measures it."""
    from study.frozen.analysis.gradient import gradient_sensitivity

    levels: dict[float, list[float]] = {t: [] for t in TEMPERATURES}
    for window in range(WINDOWS):
        g = gradient_sensitivity(planted_logits(scale, window), TEMPERATURES, (EPSILON,), seed=window)["g"]
        for i, t in enumerate(TEMPERATURES):
            levels[t].append(float(g[..., 1:, i, 0].mean()))  # row 0 sees one key: no gradient at any T
    return levels


def jacobian_levels(scale: float) -> dict[float, list[float]]:
    """{T: [exact spectral norm of the softmax Jacobian, mean over heads and causal rows, one per window]}."""
    import torch

    from study.attention import causal_allowed
    from study.attention.normalizers import masked_softmax
    from study.metrics import softmax_jacobian_norm

    causal = causal_allowed(LENGTH, LENGTH, torch.device("cpu"))
    levels: dict[float, list[float]] = {t: [] for t in TEMPERATURES}
    for window in range(WINDOWS):
        logits = planted_logits(scale, window)
        for t in TEMPERATURES:
            norms = softmax_jacobian_norm(masked_softmax(logits / t, causal), t, iterations=80)
            levels[t].append(float(norms[..., 1:].mean()))
    return levels


def _loss_curve(spike: bool) -> list[tuple[int, float]]:
    """A smoothly falling training loss, with one step at 3x its running median when `spike`."""
    losses = [(step, 4.0 - 0.05 * step) for step in range(STEPS)]
    if spike:
        losses[STEPS // 2] = (STEPS // 2, 3 * losses[STEPS // 2][1])
    return losses


def planted_runs(unstable_low_t: bool) -> list[Summary]:
    """STABILITY_RUNS runs at T = 0.1 and as many at T = 1, each summarised with its spike count from its planted
    loss curve; with `unstable_low_t` every T = 0.1 curve has a spike."""
    runs = []
    for t in (0.1, 1.0):
        for seed in range(STABILITY_RUNS):
            spikes = count_spikes(_loss_curve(unstable_low_t and t < 1))
            runs.append(Summary(f"control-T{t:g}-s{seed}", t, None, seed=seed, steps=STEPS, values={SPIKES: spikes}))
    return runs


class PlantedLogits:
    """What the frozen analysis's per-layer step reads of a captured model, for planted logits: the scaled logits
    of a layer and whether its normaliser is the softmax."""

    def __init__(self, logits) -> None:
        self._logits = logits

    def logits(self, layer: int, dtype=None):
        return self._logits.to(dtype or self._logits.dtype)

    def is_softmax(self, layer: int) -> bool:
        return True


def _frozen_settings(lengths: tuple[int, ...], *, temperatures=(1.0,), separability_ns=(), critical_ns=()):
    """Analysis settings for planted layers of up to max(lengths) keys (only the grids the controls' analyses read;
    Algorithm 3 at the KS level the report reads)."""
    import torch

    from study.frozen.analysis.grids import Grids
    from study.frozen.analysis.registration import Settings

    grids = Grids(lengths=list(lengths), n_fixed=1, ns=[], distance_ns=[], critical_ns=list(critical_ns),
                  separability_ns=list(separability_ns), temperatures=list(temperatures),
                  epsilons=[FROZEN_EPSILON], spectral_rows=torch.arange(1, max(lengths)))  # fmt: skip
    return Settings(grids=grids, mc_samples=0, seed=0, alphas=[ALPHA])


@lru_cache(maxsize=2)
def frozen_gradient_results(scale: float) -> dict:
    """results.json's Algorithm 5 blocks for planted logits (WINDOWS windows of the two-head layer, W_q scaled by
    `scale`), written by the frozen analysis's own step."""
    import torch

    from study.frozen.analysis.gradient import GRADIENT
    from study.frozen.analysis.registration import LayerInput

    logits = torch.cat([planted_logits(scale, window) for window in range(WINDOWS)])  # (WINDOWS, 2, L, L)
    settings = _frozen_settings((LENGTH,), temperatures=FROZEN_TEMPERATURES)
    layer = LayerInput(PlantedLogits(logits), 0, torch.zeros(0), torch.zeros(0), torch.float64)
    results = GRADIENT.results(settings, [GRADIENT.layer(settings, layer)])
    return {**results, "choices": {"temperatures": list(FROZEN_TEMPERATURES), "epsilons": [FROZEN_EPSILON]},
            "source": {"model": "planted layer"}}


def planted_distances(first_equal: Callable[[int, int, int], int]):
    """Per layer, the d and E blocks of Algorithm 3's per-layer step ((nL, G, H) pooled over windows and (B, nL,
    G, H) per window) for WINDOWS planted text windows: E per head is drawn once per (window, length), spread over
    a factor of about 2; d equals E from N = first_equal(window, length index, L) on, and is 3 E below it."""
    import torch

    gen = torch.Generator().manual_seed(0)
    shape = (WINDOWS, len(CRITICAL_LENGTHS), len(CRITICAL_NS), CRITICAL_LAYERS * CRITICAL_HEADS)
    e = torch.exp(0.3 * torch.randn(shape[0], shape[1], 1, shape[3], generator=gen, dtype=torch.float64))
    e = e.expand(shape).clone()
    d = e.clone()
    for window in range(WINDOWS):
        for li, length in enumerate(CRITICAL_LENGTHS):
            n0 = first_equal(window, li, length)
            below = torch.tensor([n < n0 for n in CRITICAL_NS])
            d[window, li, below] *= 3.0
    layers = []
    for layer in range(CRITICAL_LAYERS):
        heads = slice(layer * CRITICAL_HEADS, (layer + 1) * CRITICAL_HEADS)
        dw, ew = d[..., heads], e[..., heads]
        layers.append({"d": dw.mean(0), "e": ew.mean(0), "d_windows": dw, "e_windows": ew})
    return layers


@lru_cache(maxsize=4)
def critical_results(first_equal: Callable[[int, int, int], int]) -> dict:
    """results.json's Algorithm 3 blocks for `planted_distances`, written by the frozen analysis's own results
    step (the KS tests and N* per window)."""
    from study.frozen.analysis.critical import CRITICAL

    settings = _frozen_settings(CRITICAL_LENGTHS, critical_ns=CRITICAL_NS)
    return {**CRITICAL.results(settings, planted_distances(first_equal)), "choices": {"alphas": [ALPHA]},
            "source": {"model": "planted d and E"}}  # fmt: skip


def _small_ratio(window: int, li: int, length: int) -> int:
    return round(SMALL_RATIOS[(window + li) % len(SMALL_RATIOS)] * length)


def _large_ratio(window: int, li: int, length: int) -> int:
    return round((0.32, 0.5, 0.64)[(window + li) % 3] * length)


def _fixed(window: int, li: int, length: int) -> int:
    return (20, 24, 28)[(window + li) % 3]  # whatever L: a slope near 0, with a spread between windows


def planted_separability(opposed: int, window: int):
    """(weights (1, 1, L, L), vectors (1, 1, L, L + 1)) float64 whose N_s/N is (N - opposed) / N in every row
    that has a key outside I_N, by construction.

    Every row t >= N puts weight (1 - delta)/N on keys 0..N-1 (I_N) and delta spread over its other visible keys.
    With unit vectors and s = (1 - delta)/N * sum over I_N of x_i: the first `opposed` keys of I_N are -e_0; the
    other selected keys are (e_0 + e_i)/sqrt(2), orthogonal to each other apart from e_0; keys outside I_N are e_i.
    For a key outside I_N, |s - alpha x|^2 = |s|^2 + alpha^2, so r is just above |s|. A leaning key has
    <s, x_i> = alpha (C/sqrt(2) + 1/2) with C = (N - opposed)/sqrt(2) - opposed > 0, so removing it shortens the
    sum below |s| (separable); an opposed key has <s, x_i> = -alpha C, so removing it lengthens it (not). A random
    rotation per window keeps the construction off the axes (N_s/N is invariant under it).
    """
    import torch

    n, length = SEPARABILITY_N, SEPARABILITY_LENGTH
    dim = length + 1
    x = torch.zeros(length, dim, dtype=torch.float64)
    x[:opposed, 0] = -1.0
    for key in range(opposed, n):
        x[key, 0] = x[key, key + 1] = 2**-0.5
    for key in range(n, length):
        x[key, key + 1] = 1.0
    gen = torch.Generator().manual_seed(window)
    rotation, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    delta = 1e-3
    weights = torch.zeros(length, length, dtype=torch.float64)
    for row in range(length):
        if row < n:
            weights[row, : row + 1] = 1 / (row + 1)  # no key outside I_N yet: N_s/N undefined there
        else:
            weights[row, :n] = (1 - delta) / n
            weights[row, n : row + 1] = delta / (row + 1 - n)
    return weights[None, None], (x @ rotation)[None, None]


def separability_results(opposed: tuple[int, ...]) -> dict:
    """results.json's Algorithm 4 blocks for planted windows (one per entry of `opposed`), written by the frozen
    analysis's own step."""
    import torch

    from study.frozen.analysis.registration import LayerInput
    from study.frozen.analysis.separability import SEPARABILITY

    planted = [planted_separability(m, window) for window, m in enumerate(opposed)]
    weights, vectors = (torch.cat(parts) for parts in zip(*planted))
    settings = _frozen_settings((SEPARABILITY_LENGTH,), separability_ns=(SEPARABILITY_N,))
    layer = LayerInput(PlantedLogits(torch.zeros(0)), 0, weights, vectors, torch.float64)
    return {**SEPARABILITY.results(settings, [SEPARABILITY.layer(settings, layer)]),
            "source": {"model": "planted top-N geometry"}}


def _planted_run(name: str, temperature: float, seed: int, scalars: dict, *, params: dict | None = None,
                 status: dict | None = None) -> Summary:
    """A run's summary from planted scalar series, through `summarize` (what reads every real run): finished after
    STEPS steps unless `status` says otherwise; `params` adds sweep axes (optimizer, learning rate)."""
    from pathlib import Path

    params = {"temperature": temperature, "top_k": None, "seed": seed, **(params or {})}
    status = status or {"state": "finished", "global_step": STEPS}
    resolved = {"model": {"model_name_or_path": "planted"}}  # fine-tuning: its step-0 validation may be shared
    return summarize(RunData(name, Path(name), params, status, resolved, scalars))


def _jitter(seed: int) -> float:
    """A fixed small spread between seeds (-1, 0 or +1 times 0.01) so that intervals have a width."""
    return 0.01 * ((seed % 3) - 1)


def drift_runs(drift: float) -> list[Summary]:
    """SEEDS seeds x 3 T whose validation H(top-k)/log k moves by `drift` (plus the seed's jitter) from step 0 to
    the end. As in a sweep, only the seed-0 runs validate at step 0 and `share_baselines` lends that value to the
    setting's other seeds."""
    log_k = math.log(sources.SELECTION_K)
    runs = []
    for seed in range(SEEDS):
        change = drift + _jitter(seed) / 2
        for t in (0.1, 0.3, 1.0):
            series = ([(0, log_k * 0.5)] if seed == 0 else []) + [(STEPS, log_k * (0.5 + change))]
            runs.append(_planted_run(f"control-drift-T{t:g}-s{seed}", t, seed,
                                     {sources.VAL_SELECTION_ENTROPY: series}))  # fmt: skip
    return share_baselines(runs)


def gap_runs(left: float) -> list[Summary]:
    """SEEDS seeds, each a T = 0.1 and a T = 1 run with validation loss at step 0 and at the end; the low-T run
    keeps `left` (plus the seed's jitter) of its step-0 gap of 2 nats after training, as runs long enough for the
    gap row to be a test (`GAP_TEST_STEPS`)."""
    runs = []
    for seed in range(SEEDS):
        gap = 2.0
        end_gap = gap * (left + _jitter(seed))
        for t, start, end in ((0.1, 4.0 + gap, 3.5 + end_gap), (1.0, 4.0, 3.5)):
            series = {tags.VAL_LOSS: [(0, start), (STEPS, end)]}
            runs.append(_planted_run(f"control-gap-T{t:g}-s{seed}", t, seed, series,
                                     status={"state": "finished", "global_step": GAP_TEST_STEPS}))
    return runs


def depth_runs(per_layer: float) -> list[Summary]:
    """SEEDS seeds x 3 T of a DEPTH_LAYERS-layer model whose per-layer W_q and W_k gradient norms (logged as a run
    logs them, `grad_norm/block_<l>/attn_q` and `attn_k`) scale like T^(-0.3 + per_layer x crossed): the T-slope
    changes by `per_layer` (plus the seed's jitter) with each low-T layer the gradient crosses (layer l crosses
    DEPTH_LAYERS - l)."""
    runs = []
    for seed in range(SEEDS):
        change = per_layer + _jitter(seed) / 2
        for t in (0.01, 0.1, 1.0):
            scalars = {}
            for layer in range(DEPTH_LAYERS):
                norm = t ** (-0.3 + change * (DEPTH_LAYERS - layer))
                for kind in ("attn_q", "attn_k"):  # together: the attention-logit norm, sqrt(q^2 + k^2) = norm
                    scalars[tags.grad_norm(tags.GRAD_GROUP_BLOCK_PREFIX) + f"{layer}/{kind}"] = [
                        (step, norm / math.sqrt(2)) for step in (0, STEPS)]
            runs.append(_planted_run(f"control-depth-T{t:g}-s{seed}", t, seed, scalars))
    return runs


def bracket_runs(diverges: Callable[[float, float], bool]) -> list[Summary]:
    """BRACKET_SEEDS plain-SGD runs per (T, learning rate) cell of BRACKET_TEMPERATURES x BRACKET_LRS (with one run
    per cell, as the main job's SGD arm, the bracket is only observed): a run for which `diverges(T, lr)` stops at
    step 1 as the NonFiniteGuard records a non-finite loss, the others log a calm falling loss for STEPS steps."""
    runs = []
    for t in BRACKET_TEMPERATURES:
        for lr in BRACKET_LRS:
            for seed in range(BRACKET_SEEDS):
                name = f"control-bracket-T{t:g}-lr{lr:g}-s{seed}"
                params = {"optimizer": "sgd", "learning_rate": lr}
                if diverges(t, lr):
                    status = {"state": "diverged", "global_step": 1, "reason": "non-finite loss at step 1"}
                    runs.append(_planted_run(name, t, seed, {tags.TRAIN_LOSS: [(0, 4.0)]}, params=params,
                                             status=status))
                else:
                    runs.append(_planted_run(name, t, seed, {tags.TRAIN_LOSS: _loss_curve(False)}, params=params))
    return runs


def _bracket(diverges: Callable[[float, float], bool]) -> Finding:
    (finding,) = lr_stability_findings(bracket_runs(diverges))
    return finding


def _sensitivity(name: str, what: str, levels: Callable[[float], dict], scale: float, expected: str) -> Control:
    claim = f"control: {what} grows like 1/T ({name}, W_q x {scale:g})"
    statistic = f"log-log slope of {what} vs T over {WINDOWS} planted windows"
    return Control(name, expected, band_finding(claim, statistic, levels(scale)))


@lru_cache(maxsize=1)
def _judged() -> tuple[Control, ...]:
    # Seeded planted data and closed-form rules: the same controls every time, so one process (a test session
    # building many reports) judges them once. A family of one: the single-interval level, whatever is in force.
    with family_level(Family(1)):
        return tuple(_all())


def controls() -> list[Control]:
    """Every control, judged at the single-interval level (outside the findings' family)."""
    return list(_judged())


def _all() -> list[Control]:
    g = "g(T, eps) (Algorithm 5)"
    jac = "the softmax Jacobian's spectral norm"
    return [
        _sensitivity("near-uniform rows", g, g_levels, NEAR_UNIFORM_SCALE, SUPPORTED),
        _sensitivity("saturated rows", g, g_levels, SATURATED_SCALE, NOT_SUPPORTED),
        _sensitivity("near-uniform rows", jac, jacobian_levels, NEAR_UNIFORM_SCALE, SUPPORTED),
        _sensitivity("saturated rows", jac, jacobian_levels, SATURATED_SCALE, NOT_SUPPORTED),
        Control("near-uniform rows, W_q x 1e-06", SUPPORTED,
                gradient_slope_finding(frozen_gradient_results(FROZEN_NEAR_UNIFORM_SCALE))),
        Control(f"saturated rows, W_q x {SATURATED_SCALE:g}", NOT_SUPPORTED,
                gradient_slope_finding(frozen_gradient_results(SATURATED_SCALE))),
        Control("near-uniform rows, W_q x 1e-06", SUPPORTED,
                gradient_drop_finding(frozen_gradient_results(FROZEN_NEAR_UNIFORM_SCALE))),
        Control(f"saturated rows, W_q x {SATURATED_SCALE:g}", NOT_SUPPORTED,
                gradient_drop_finding(frozen_gradient_results(SATURATED_SCALE))),
        # the N* rules themselves: the report labels these rows design-dependent (frozen.design_dependent)
        Control("d = E from N = (0.05-0.07) L", SUPPORTED, n_star_finding(critical_results(_small_ratio), False)),
        Control("d = E from N = (0.32-0.64) L", NOT_SUPPORTED, n_star_finding(critical_results(_large_ratio), False)),
        Control("d = E from N = (0.05-0.07) L", SUPPORTED, n_star_slope_finding(critical_results(_small_ratio), False)),
        Control("d = E from N = 20-28 at every L", NOT_SUPPORTED, n_star_slope_finding(critical_results(_fixed), False)),
        *(Control(name, expected, separability_finding(separability_results(opposed)))
          for (name, opposed), expected in zip(SEPARABILITY_OPPOSED.items(), (SUPPORTED, NOT_SUPPORTED))),
        Control("planted spike in every low-T run", SUPPORTED, instability_finding(planted_runs(True))),
        Control("every run calm", NOT_SUPPORTED, instability_finding(planted_runs(False))),
        Control("T-slope steeper by 0.2 per low-T layer crossed", SUPPORTED,
                depth_findings_by_group(depth_runs(-0.2))["W_q,W_k"]),
        Control("the same T-slope in every layer", NOT_SUPPORTED, depth_findings_by_group(depth_runs(0.0))["W_q,W_k"]),
        Control("SGD diverges at lr 1 at both T and at lr 0.01 only at T = 0.01", SUPPORTED,
                _bracket(lambda t, lr: lr >= 1 or t < 1)),
        Control("SGD diverges at lr 1 at both T and at lr 0.01 only at T = 1", NOT_SUPPORTED,
                _bracket(lambda t, lr: lr >= 1 or t >= 1)),
        Control("SGD diverges at lr 1 at both T, never at lr 0.01", INCONCLUSIVE, _bracket(lambda t, lr: lr >= 1)),
        Control("H(top-k)/log k rises by 0.1 in every seed", SUPPORTED, drift_finding(drift_runs(0.1))),
        Control("H(top-k)/log k unchanged", NOT_SUPPORTED, drift_finding(drift_runs(0.0))),
        Control("90% of the step-0 gap left", SUPPORTED, recovery_finding(gap_runs(0.9))),
        Control("5% of the step-0 gap left", NOT_SUPPORTED, recovery_finding(gap_runs(0.05))),
    ]


def section(found: list[Control]) -> list[str]:
    """The report's control section: each control's measured value, its verdict and the expected one."""
    from study.report.markdown import table

    rows = [[c.finding.claim, c.name, c.finding.value, c.finding.verdict, c.expected, "pass" if c.passed else "FAIL"]
            for c in found]  # fmt: skip
    return [
        "## Controls (answers known by construction, through the same measuring code and rules)",
        "",
        "Planted settings where a claim must hold and where it must fail, measured by the code that measures the "
        "study's data and judged by the same finding functions (`study/report/controls.py`; docs/findings.md). "
        "Each at the single-interval level, outside the findings' family. A FAIL means the pipeline cannot be "
        "trusted to reach that verdict.",
        "",
        table(["claim", "planted", "measured", "verdict", "expected", "result"], rows),
        "",
    ]


def controls_json(found: list[Control]) -> list[dict]:
    return [{"claim": c.finding.claim, "planted": c.name, "value": c.finding.value, "verdict": c.finding.verdict,
             "expected": c.expected, "passed": c.passed} for c in found]  # fmt: skip
