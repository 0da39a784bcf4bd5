"""The attention Jacobian d alpha / d l on sampled rows: its spectral norm, and Corollary 3 entrywise.

Corollary 3 of the paper bounds the Jacobian of a softmax row by 1/(4T). Entrywise that holds by mathematics
(|J_ij| = a_i a_j / T or a_i (1 - a_i) / T, both <= 1/(4T)): the probe checks it (a test of the code) and asks
the empirical question, how close real rows come to the bound (the fractions of rows whose largest entry exceeds
half and nine tenths of it). As a spectral norm the bound is false: a = (1/2, 1/2) gives 1/(2T), the exact
maximum, which the probe also checks.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

NEAR_BOUND = (0.5, 0.9)  # fractions of 1/(4T) whose exceedance the probe reports


class RowSampler:
    """An attention tap that keeps a few random rows of every layer (or of ``layers`` only)."""

    def __init__(self, rows: int, generator: torch.Generator, layers: tuple[int, ...] | None = None) -> None:
        self.rows, self.generator, self.layers, self.sampled = rows, generator, layers, []

    def observe(self, layer, weights, allowed, spec) -> None:
        from study.metrics import sample_rows

        if self.layers is None or layer in self.layers:
            self.sampled.append(sample_rows(weights.float(), allowed, self.rows, generator=self.generator).double())

    def rows_tensor(self) -> Tensor:
        width = max(r.shape[-1] for r in self.sampled)
        return torch.cat([nn.functional.pad(r, (0, width - r.shape[-1])) for r in self.sampled])


class ExplicitPath:
    """A tap that observes nothing: while open, attention takes its explicit path (double backward works there;
    the fused SDPA kernels do not support it)."""

    def observe(self, layer, weights, allowed, spec) -> None:
        pass


def jacobian_stats(rows: Tensor, temperature: float) -> dict[str, float]:
    """Spectral norms (mean, percentiles, max; fraction above 1/(4T) and sqrt 2) and the entrywise Corollary 3
    (largest |J_ij| x 4T: its maximum, at most 1 by mathematics, and the fractions of rows above `NEAR_BOUND`)."""
    from study.metrics import SATURATED, softmax_jacobian_max_entry, softmax_jacobian_norm

    norms = softmax_jacobian_norm(rows, temperature)
    entry = softmax_jacobian_max_entry(rows, temperature) * 4 * temperature  # 1 = the bound
    q = torch.quantile(norms, torch.tensor([0.1, 0.5, 0.9], dtype=norms.dtype)).tolist()
    out = {
        "mean": float(norms.mean()), "p10": q[0], "p50": q[1], "p90": q[2], "max": float(norms.max()),
        "max_times_2T": float(norms.max()) * 2 * temperature,
        "frac_above_quarter_T": float((norms > 1 / (4 * temperature)).double().mean()),
        "frac_above_sqrt2": float((norms > math.sqrt(2)).double().mean()),
        "entry_max_times_4T": float(entry.max()),
        "saturated_fraction": float((rows.amax(-1) > SATURATED).double().mean()),
        "rows": norms.numel(),
    }  # fmt: skip
    for share in NEAR_BOUND:
        out[f"entry_frac_above_{share:g}"] = float((entry > share).double().mean())
    return out
