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
- "low temperature makes training unstable" (claim 6): planted loss curves through `count_spikes` (the spike count
  of every run's summary) into `instability_finding`. Every low-T run has a loss spike, every reference run is calm:
  supported. Every run calm, as many per group as the rule needs to exclude the claimed effect: not supported.

The controls sit beside the findings, outside their Bonferroni family (each at the single-interval level), and the
report shows each verdict with the expected one. tests/test_report_controls.py fails when one differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from study.report.findings import Finding, band_finding, instability_finding
from study.report.stats import NOT_SUPPORTED, SUPPORTED, Family, family_level
from study.report.summary import SPIKES, Summary, count_spikes

TEMPERATURES = (0.25, 0.5, 1.0, 2.0, 4.0)  # the grid of the sensitivity controls: four octaves
WINDOWS = 6  # independent planted inputs (one random layer and input each): the replicates of a slope
LENGTH, DIM = 24, 16  # tokens per planted window, head dimension
NEAR_UNIFORM_SCALE = 1e-4  # W_q scale: logits/T stay below about 1e-2 at the grid's lowest T
SATURATED_SCALE = 8.0  # W_q scale: the largest logit leads the next by tens at every T of the grid
EPSILON = 1e-3  # Algorithm 5's perturbation size (the smallest of the probe's)
STABILITY_RUNS = 12  # runs per group: enough calm runs to exclude the claimed unstable fraction (calm_runs_needed)
STEPS = 20  # logged training losses per planted run


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
        Control("planted spike in every low-T run", SUPPORTED, instability_finding(planted_runs(True))),
        Control("every run calm", NOT_SUPPORTED, instability_finding(planted_runs(False))),
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
