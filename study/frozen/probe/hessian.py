"""The loss Hessian restricted to W_q and W_k: spectral norm and largest eigenvalue by power iteration.

Every norm is taken with the vector scaled by its largest entry first (`safe_norm`): at T = 0.01 the
Hessian-vector products of a 135 M model hold entries near 1e19, whose squares overflow float32 (a plain
sqrt(sum x^2) is inf, the normalised vector 0, and the Hessian read 0.0).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def safe_norm(vectors: list[Tensor]) -> float:
    """The L2 norm of the concatenation of ``vectors``, as a Python float, without overflow in their dtype."""
    scale = max((float(v.detach().abs().max()) for v in vectors if v.numel()), default=0.0)
    if scale == 0.0 or scale != scale or scale == float("inf"):
        return scale  # 0, nan or inf: nothing to scale
    total = sum(float(torch.linalg.vector_norm(v.detach() / scale, dtype=torch.float64)) ** 2 for v in vectors)
    return scale * total**0.5


def unit(vectors: list[Tensor]) -> list[Tensor]:
    """``vectors`` divided by their joint norm (scaled by the largest entry first, so no square overflows)."""
    scale = max(float(v.abs().max()) for v in vectors)
    if not scale > 0:
        return vectors
    scaled = [v / scale for v in vectors]
    length = safe_norm(scaled)
    return [v / length for v in scaled]


def power_iteration(hvp: Callable[[list[Tensor]], list[Tensor]], v: list[Tensor], iterations: int,
                    shift: float = 0.0) -> tuple[list[Tensor], float]:  # fmt: skip
    """Power iteration on (H + shift I); returns the last vector and |(H + shift I) v| for a unit v."""
    norm = 0.0
    for _ in range(iterations):
        v = unit(v)
        hv = [h + shift * x for h, x in zip(hvp(v), v)]
        norm = safe_norm(hv)
        if not norm > 0 or norm == float("inf"):
            break  # H v = 0 (or not finite): nothing left to iterate on
        v = [h.detach() for h in hv]
    return v, norm


def hessian_qk(model: nn.Module, batch: Tensor, masks: list[tuple[nn.Parameter, Tensor]], iterations: int,
               generator: torch.Generator) -> tuple[float, float]:  # fmt: skip
    """(spectral norm, largest eigenvalue) of the loss Hessian restricted to the masked entries of ``masks``.

    The restriction is the principal sub-matrix on the masked entries: each Hessian-vector product is masked.
    The q-k cross terms make the spectrum nearly symmetric (eigenvalues in +- pairs), where plain power
    iteration does not settle on one eigenvector; |H v| still converges to the spectral norm rho, and power
    iteration on H + rho I (all eigenvalues >= 0) then gives the largest eigenvalue as its norm minus rho.
    Double backward needs the explicit attention path: call it inside ``tapping(ExplicitPath())``.
    """
    params = [p for p, _ in masks]
    loss = model(input_ids=batch, labels=batch).loss
    grads = torch.autograd.grad(loss, params, create_graph=True)

    def hvp(v: list[Tensor]) -> list[Tensor]:
        hv = torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)
        return [h * m for h, (_, m) in zip(hv, masks)]

    v = [torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p) * m for p, m in masks]
    v, rho = power_iteration(hvp, v, iterations)
    if not 0 < rho < float("inf"):
        return rho, rho
    _, shifted = power_iteration(hvp, v, iterations, shift=rho)
    return rho, shifted - rho
