"""The probe's measurements at one temperature: T lowered in every layer, or in one layer only.

Both restart the row sampler and the power iteration from the seed at every T, and use the same windows at every
T: the comparison across T is paired, window by window.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from study.frozen.probe.ghost_norms import window_gradients, window_losses
from study.frozen.probe.gradients import LAYER_KINDS, masked_norm, only_grad_for, qk_masks
from study.frozen.probe.hessian import hessian_qk
from study.frozen.probe.jacobian import ExplicitPath, RowSampler, jacobian_stats

WINDOWS_PER_PASS = 10  # windows per batched forward and backward (memory: logits and their gradient, B x L x vocab)


def num_layers(model: nn.Module) -> int:
    from study.attention.hf import attention_modules

    return len(attention_modules(model))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def all_layers(model: nn.Module, windows: Tensor, temperature: float, rows: int, seed: int) -> dict:
    """T in every layer: per window the loss, whole-model norms, per-layer norms of every kind and the residual
    stream; the Jacobian statistics of rows sampled in every layer. Windows run `WINDOWS_PER_PASS` at a time,
    each its own replicate (`study.frozen.probe.ghost_norms`)."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping

    generator = torch.Generator().manual_seed(seed)
    apply_attention_spec(model, AttentionSpec(temperature=temperature))
    layers = num_layers(model)
    sampler = RowSampler(rows, generator)
    losses: list[float] = []
    embedding: list[float] = []
    per_layer: dict[str, list[list[float]]] = {kind: [[] for _ in range(layers)] for kind in LAYER_KINDS}
    for chunk in windows.split(WINDOWS_PER_PASS):
        sampler.rows = rows * len(chunk)  # rows per layer and window
        with tapping(sampler), window_gradients(model, chunk, layers) as found:  # the tap forces the explicit path
            loss, per_window = window_losses(model, chunk)
            found.backward(loss)
        losses += per_window.tolist()
        embedding += found.embedding.sqrt().tolist()
        for layer in range(layers):
            for kind in found.squares:
                per_layer[kind][layer] += found.norms(kind, layer)
            per_layer["residual"][layer] += found.residual[layer].sqrt().tolist()
    per_window = []
    for w, loss in enumerate(losses):
        qk = math.sqrt(sum(per_layer["attn_qk"][layer][w] ** 2 for layer in range(layers)))
        rest = math.sqrt(embedding[w] ** 2 + sum(per_layer[kind][layer][w] ** 2 for kind in ("attn_v", "attn_out", "mlp")
                                                 for layer in range(layers)))  # fmt: skip
        per_window.append({"loss": loss, "grad_attn_qk": qk, "grad_rest": rest, "grad_total": math.hypot(qk, rest),
                           "grad_embedding": embedding[w]})  # fmt: skip
    mean = {k: _mean([w[k] for w in per_window]) for k in per_window[0]}
    return {"temperature": temperature, **mean, "jacobian": jacobian_stats(sampler.rows_tensor(), temperature),
            "windows": per_window, "layers": per_layer}  # fmt: skip


def single_layer(model: nn.Module, windows: Tensor, temperature: float, layer: int, rows: int, seed: int) -> dict:
    """T in ``layer`` only (stock attention elsewhere): per window the loss and that layer's own W_q/W_k gradient
    norm; the Jacobian statistics of rows sampled in that layer. The backward pass stops at that layer."""
    from study.attention import AttentionSpec, apply_attention_spec, tapping

    generator = torch.Generator().manual_seed(seed)
    apply_attention_spec(model, AttentionSpec(temperature=temperature, layers=(layer,)))
    layers = num_layers(model)
    sampler = RowSampler(rows, generator, layers=(layer,))
    losses: list[float] = []
    norms: list[float] = []
    with only_grad_for(qk_masks(model, (layer,)), model):
        for chunk in windows.split(WINDOWS_PER_PASS):
            sampler.rows = rows * len(chunk)  # rows per layer and window
            with tapping(sampler), window_gradients(model, chunk, layers, residual=False, embedding=False) as found:
                loss, per_window = window_losses(model, chunk)
                found.backward(loss)
            losses += per_window.tolist()
            norms += found.norms("attn_qk", layer)
    per_window = [{"loss": loss, "grad_attn_qk": norm} for loss, norm in zip(losses, norms)]
    return {"temperature": temperature, "loss": _mean(losses), "grad_attn_qk": _mean(norms),
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
