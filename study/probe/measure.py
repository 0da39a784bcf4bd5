"""The probe's measurements at one temperature: T lowered in every layer, or in one layer only.

Both restart the row sampler and the power iteration from the seed at every T, and use the same windows at every
T: the comparison across T is paired, window by window.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from study.probe.gradients import (
    gradient_norms,
    layer_norms,
    masked_norm,
    model_norms,
    only_grad_for,
    qk_masks,
    residual_gradients,
)
from study.probe.hessian import hessian_qk
from study.probe.jacobian import ExplicitPath, RowSampler, jacobian_stats


def num_layers(model: nn.Module) -> int:
    from study.attention.hf import attention_modules

    return len(attention_modules(model))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def all_layers(model: nn.Module, windows: Tensor, temperature: float, rows: int, seed: int) -> dict:
    """T in every layer: per window the loss, whole-model norms, per-layer norms of every kind and the residual
    stream; the Jacobian statistics of rows sampled in every layer."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping

    generator = torch.Generator().manual_seed(seed)
    apply_attention_spec(model, AttentionSpec(temperature=temperature))
    layers = num_layers(model)
    per_window, per_layer = [], {kind: [[] for _ in range(layers)] for kind in ("attn_qk", "attn_v", "attn_out", "mlp", "residual")}
    sampler = RowSampler(rows, generator)
    for window in windows:
        batch = window[None]
        model.zero_grad(set_to_none=True)
        with tapping(sampler), residual_gradients(model) as residual:  # the tap also forces the explicit path
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
        norms = gradient_norms(model)
        per_window.append({"loss": float(loss.detach()), **{f"grad_{k}": v for k, v in model_norms(norms).items()}})
        for kind, values in {**layer_norms(norms, layers), "residual": list(residual)}.items():
            for layer, value in enumerate(values):
                per_layer[kind][layer].append(value)
    model.zero_grad(set_to_none=True)
    mean = {k: _mean([w[k] for w in per_window]) for k in per_window[0]}
    return {"temperature": temperature, **mean, "jacobian": jacobian_stats(sampler.rows_tensor(), temperature),
            "windows": per_window, "layers": per_layer}  # fmt: skip


def single_layer(model: nn.Module, windows: Tensor, temperature: float, layer: int, rows: int, seed: int) -> dict:
    """T in ``layer`` only (stock attention elsewhere): per window the loss and that layer's own W_q/W_k gradient
    norm; the Jacobian statistics of rows sampled in that layer."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping

    generator = torch.Generator().manual_seed(seed)
    apply_attention_spec(model, AttentionSpec(temperature=temperature, layers=(layer,)))
    masks = qk_masks(model, (layer,))
    sampler = RowSampler(rows, generator, layers=(layer,))
    per_window = []
    with only_grad_for(masks, model):
        for window in windows:
            batch = window[None]
            model.zero_grad(set_to_none=True)
            with tapping(sampler):
                loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            per_window.append({"loss": float(loss.detach()), "grad_attn_qk": masked_norm(masks)})
    model.zero_grad(set_to_none=True)
    return {"temperature": temperature, "loss": _mean([w["loss"] for w in per_window]),
            "grad_attn_qk": _mean([w["grad_attn_qk"] for w in per_window]),
            "jacobian": jacobian_stats(sampler.rows_tensor(), temperature), "windows": per_window}  # fmt: skip


def qk_gradient(model: nn.Module, windows: Tensor, temperature: float, layer: int | None) -> list[float]:
    """Only the W_q/W_k gradient norm per window (T in every layer, or in ``layer`` only, and that layer's norm):
    the numbers the fp64 reference repeats."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping

    layers = None if layer is None else (layer,)
    apply_attention_spec(model, AttentionSpec(temperature=temperature, layers=layers))
    masks = qk_masks(model, layers)
    out = []
    with only_grad_for(masks, model):
        for window in windows:
            batch = window[None]
            model.zero_grad(set_to_none=True)
            with tapping(ExplicitPath()):
                model(input_ids=batch, labels=batch).loss.backward()
            out.append(masked_norm(masks))
    model.zero_grad(set_to_none=True)
    return out


def hessian(model: nn.Module, window: Tensor, temperature: float, iterations: int, seed: int) -> tuple[float, float]:
    """(spectral norm, largest eigenvalue) of the W_q/W_k loss Hessian, T in every layer, on one window."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping

    apply_attention_spec(model, AttentionSpec(temperature=temperature))
    with tapping(ExplicitPath()):  # double backward needs the explicit attention path
        return hessian_qk(model, window[None], qk_masks(model), iterations, torch.Generator().manual_seed(seed))
