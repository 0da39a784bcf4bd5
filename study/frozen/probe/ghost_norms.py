"""Per-window gradient norms from one batched backward pass: each window is its own replicate, computed together.

The loss of a batch of B windows of equal length is the mean of the windows' own losses, so each window's own
gradient is B times its share of the batch gradient. For a linear map y = x W (+ b) (`nn.Linear`, GPT-2's
`Conv1D`), one window's weight gradient is X^T dY over its positions, and its squared norm is
sum((X X^T) * (dY dY^T)) (two L x L Gram matrices: the per-example "ghost norm"), without forming the gradient;
its bias gradient is the sum of dY over positions. A subset of the output dimensions (W_q and W_k inside GPT-2's
fused c_attn) restricts dY to those columns. The residual stream's gradient is read per window directly, and the
token embedding's (tied with the LM head where the model ties them) is formed per window. The results equal
batch-size-1 backward passes up to rounding (tests/test_probe.py checks them against those).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

KIND_KEYS = {"attn_q": "attn_qk", "attn_k": "attn_qk", "attn_v": "attn_v", "attn_out": "attn_out", "mlp": "mlp"}


@dataclass(frozen=True)
class Target:
    key: str  # attn_qk, attn_v, attn_out, mlp
    layer: int
    columns: slice  # output dimensions of the module that belong to this key


def linear_targets(model: nn.Module) -> list[tuple[nn.Module, list[Target]]]:
    """Every linear map inside a transformer block whose kind the probe reports, with its output columns per key
    (a fused [q | k | v] projection split in three equal parts, as `study.metrics.fused_qkv_split` assumes)."""
    from study.metrics import block_index, parameter_kind

    out = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.dim() != 2 or not isinstance(module, nn.Linear) and type(module).__name__ != "Conv1D":
            continue
        layer, kind = block_index(name), parameter_kind(f"{name}.weight")
        if layer is None:
            continue
        width = weight.shape[0] if isinstance(module, nn.Linear) else weight.shape[1]
        if kind == "attn_qkv":
            third = width // 3
            out.append((module, [Target("attn_qk", layer, slice(0, 2 * third)), Target("attn_v", layer, slice(2 * third, width))]))
        elif kind in KIND_KEYS:
            out.append((module, [Target(KIND_KEYS[kind], layer, slice(0, width))]))
    return out


class WindowNorms:
    """Squared per-window gradient norms, accumulated by hooks during one batched forward and backward."""

    def __init__(self, batch: int, layers: int, keys=("attn_qk", "attn_v", "attn_out", "mlp")) -> None:
        self.scale = float(batch)  # each window's gradient is B x its share of the mean loss's gradient
        self.squares = {key: [torch.zeros(batch, dtype=torch.float64) for _ in range(layers)] for key in keys}
        self.residual = [torch.zeros(batch, dtype=torch.float64) for _ in range(layers)]
        self.embedding = torch.zeros(batch, dtype=torch.float64)
        self.after_backward: list = []  # what needs the whole backward first (the embedding's two halves)
        self.outputs: list[Tensor] = []  # the tensors whose gradients the hooks read

    def backward(self, loss: Tensor) -> None:
        """Gradients of ``loss`` down to the hooked tensors only: no weight gradient is formed (the hooks need
        none), then the per-window embedding gradients."""
        wanted = [t for t in self.outputs if t.requires_grad]
        try:
            if wanted:
                torch.autograd.grad(loss, wanted, allow_unused=True)
            for step in self.after_backward:
                step()
        finally:
            del wanted
            self.release()

    def release(self) -> None:
        """Drop the hooked tensors: their gradient hooks point back at this collector, a cycle through autograd
        that Python's garbage collector cannot see, so each forward's activations would otherwise stay alive."""
        self.outputs.clear()

    def norms(self, key: str, layer: int) -> list[float]:
        return self.squares[key][layer].sqrt().tolist()


def _gram(x: Tensor) -> Tensor:
    x = x.double()
    return x @ x.transpose(-1, -2)


@contextmanager
def window_gradients(model: nn.Module, batch: Tensor, layers: int, residual: bool = True,
                     embedding: bool = True) -> Iterator[WindowNorms]:  # fmt: skip
    """While open, a forward of ``batch`` (B windows) and ``found.backward(mean of the windows' losses)`` fill the
    yielded `WindowNorms` for every weight that requires a gradient."""
    from study.frozen.probe.gradients import blocks

    found = WindowNorms(batch.shape[0], layers)
    handles = []

    def linear_hook(targets: list[Target], module: nn.Module):
        has_bias = isinstance(getattr(module, "bias", None), nn.Parameter) and module.bias.requires_grad

        def hook(mod, args, output):
            if not (module.weight.requires_grad and output.requires_grad):
                return
            gram_x = _gram(args[0].detach())

            def on_grad(grad: Tensor) -> None:
                grad = grad.double() * found.scale
                for target in targets:
                    dy = grad[..., target.columns]
                    sq = (gram_x * _gram(dy)).sum((-1, -2))
                    if has_bias:
                        sq = sq + dy.sum(-2).square().sum(-1)
                    found.squares[target.key][target.layer] += sq.cpu()

            output.register_hook(on_grad)
            found.outputs.append(output)

        return hook

    for module, targets in linear_targets(model):
        handles.append(module.register_forward_hook(linear_hook(targets, module)))
    if residual:
        def residual_hook(index: int):
            def pre(module, args, kwargs):
                hidden = args[0] if args else kwargs.get("hidden_states")
                if isinstance(hidden, Tensor) and hidden.requires_grad:

                    def on_grad(grad: Tensor) -> None:  # returns nothing: the gradient flows on unchanged
                        found.residual[index].add_((grad.double() * found.scale).square().sum((-1, -2)).cpu())

                    hidden.register_hook(on_grad)
                    found.outputs.append(hidden)

            return pre

        for index, block in enumerate(blocks(model)):
            handles.append(block.register_forward_pre_hook(residual_hook(index), with_kwargs=True))
    if embedding:
        handles += _embedding_hooks(model, batch, found)
    try:
        yield found
    finally:
        found.release()  # also when no backward ran (an exception in the forward)
        for handle in handles:
            handle.remove()


def _embedding_hooks(model: nn.Module, batch: Tensor, found: WindowNorms) -> list:
    """The token embedding's gradient per window: its rows from the input side, plus the LM head's gradient when the
    two share one matrix."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not embed.weight.requires_grad:
        return []
    tied = head is not None and head.weight is embed.weight
    saved: dict[str, Tensor] = {}

    def on_embed(module, args, output):
        if output.requires_grad:
            output.register_hook(lambda g: saved.__setitem__("d_embed", g.detach() * found.scale))
            found.outputs.append(output)

    def on_head(module, args, output):
        saved["hidden"] = args[0].detach()
        if output.requires_grad:
            output.register_hook(lambda g: saved.__setitem__("d_logits", g.detach() * found.scale))
            found.outputs.append(output)

    def finish() -> None:
        d_embed, d_logits, hidden = saved.get("d_embed"), saved.get("d_logits"), saved.get("hidden")
        if d_embed is None:
            return
        for b in range(batch.shape[0]):
            grad = d_logits[b].transpose(0, 1) @ hidden[b] if tied and d_logits is not None else torch.zeros_like(embed.weight)
            grad = grad.index_add(0, batch[b].to(grad.device), d_embed[b].to(grad.dtype))
            found.embedding[b] += float(torch.linalg.vector_norm(grad, dtype=torch.float64)) ** 2
        saved.clear()

    found.after_backward.append(finish)
    handles = [embed.register_forward_hook(on_embed)]
    if tied:
        handles.append(head.register_forward_hook(on_head))
    return handles


def window_losses(model: nn.Module, batch: Tensor) -> tuple[Tensor, Tensor]:
    """(mean of the windows' losses, each window's loss): next-token cross-entropy, as `labels=batch` computes it."""
    logits = model(input_ids=batch).logits
    per_token = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch[:, 1:].flatten(),
                                            reduction="none").view(batch.shape[0], -1)  # fmt: skip
    per_window = per_token.mean(-1)
    return per_window.mean(), per_window.detach()
