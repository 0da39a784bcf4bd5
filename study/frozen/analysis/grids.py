"""The grids `study analyze` evaluates (lengths L, top-N sizes, temperatures T, perturbation sizes eps), validated once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .rows import check_ns, check_temperatures

PAPER_NS = (1, 5, 10, 20, 100)
PAPER_EPSILONS = (1e-3, 1e-1, 10.0)


def default_lengths(max_length: int) -> list[int]:
    """Powers of two from 32 up to max_length, plus max_length (the paper: 32 ... 1024)."""
    out = [2**k for k in range(5, 11) if 2**k < max_length]
    return sorted(set(out + [max_length]))


def default_critical_ns(max_length: int, points: int = 40) -> list[int]:
    """Every N up to 16, then a geometric grid up to max_length: the resolution of N*."""
    geo = np.unique(np.round(np.geomspace(1, max_length, points)).astype(int)).tolist()
    return sorted(set(list(range(1, min(16, max_length) + 1)) + geo))


def default_temperatures() -> list[float]:
    return np.round(np.logspace(-3, 1, 17), 8).tolist()


@dataclass(frozen=True)
class Grids:
    """The validated grids of one analysis (every length, N and T it evaluates)."""

    lengths: list[int]  # Alg. 1 lengths L (the last is the longest)
    n_fixed: int  # Alg. 1's N
    ns: list[int]  # Alg. 2's N, those <= the longest L
    distance_ns: list[int]  # ns and n_fixed: the N the distance statistics are computed at
    critical_ns: list[int]  # Alg. 3's grid of N
    separability_ns: list[int]  # Alg. 4's N
    temperatures: list[float]  # Alg. 5's T
    epsilons: list[float]  # Alg. 5's perturbation sizes
    spectral_rows: torch.Tensor  # rows whose exact Jacobian norm is computed

    @property
    def max_len(self) -> int:
        return self.lengths[-1]


def check_grids(input_ids: torch.Tensor, limit: int | None, *, lengths, ns, n_fixed, critical_ns, separability_ns,
                temperatures, epsilons, spectral_rows: int) -> Grids:
    """Validate every grid against the text length and the model's context; raise ValueError naming the value."""
    max_len = input_ids.shape[1]
    lengths = sorted(set(int(n) for n in (lengths or default_lengths(max_len))))
    for n in lengths + [max_len]:
        if limit is not None and n > limit:
            raise ValueError(f"L={n} exceeds the model's context {limit}")
        if n < 1 or n > max_len:
            raise ValueError(f"L={n} is outside the text length 1..{max_len}")
    max_len = max(lengths)
    if n_fixed > max_len:
        raise ValueError(f"N={n_fixed} exceeds L={max_len}")
    for n in ns:
        if n < 1:
            raise ValueError(f"N must be >= 1, got N={n}")
    ns_fixed_l = sorted({int(n) for n in ns if n <= max_len})  # Alg. 2: {1, 5, 10, 20, 100} filtered to <= L
    sep_ns = separability_ns or [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n < max_len]
    return Grids(
        lengths=lengths,
        n_fixed=int(n_fixed),
        ns=ns_fixed_l,
        distance_ns=sorted(set(ns_fixed_l) | {int(n_fixed)}),
        critical_ns=check_ns(critical_ns or default_critical_ns(max_len), max_len),
        separability_ns=check_ns(sep_ns, max_len),
        temperatures=check_temperatures(temperatures or default_temperatures()),
        epsilons=[float(e) for e in epsilons],
        spectral_rows=torch.unique(torch.linspace(0, max_len - 1, min(spectral_rows, max_len)).round().long()),
    )
