"""Gradient statistics on any model's parameters: total and grouped norms, non-finite counts.

Model-agnostic: parameters are grouped by their names only (GPT-2, Llama-style Hugging Face models and
plain torch modules). Nothing here syncs with the host: every result is a tensor on the gradients' device,
so a caller can log them without stalling the training step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import Tensor

from study import tags

KINDS = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_out",
    "attn_qkv",
    "mlp",
    "embedding",
    "norm",
    "head",
    "normalizer",
    "other",
)

# Module names, matched against one dotted segment of a lower-cased parameter name.
_ATTN_CONTEXT = re.compile(
    r"^(attn|attention|self_attn|self_attention|cross_attn|crossattention|mha|.*_attn)$"
)
_MLP_CONTEXT = re.compile(
    r"^(mlp|ffn|ff|feed_forward|feedforward|ffwd|intermediate|c_fc|fc\d?|gate_proj|up_proj|down_proj"
    r"|w[123]|linear[12]|experts?|moe|gate_up_proj|dense_h_to_4h|dense_4h_to_h)$"
)
_QKV = re.compile(r"^(c_attn|qkv|qkv_proj|wqkv|query_key_value|in_proj|in_proj_weight|in_proj_bias)$")
_Q = re.compile(r"^(q|q_proj|query|wq|q_lin|to_q|q_proj_weight)$")
_K = re.compile(r"^(k|k_proj|key|wk|k_lin|to_k|k_proj_weight)$")
_V = re.compile(r"^(v|v_proj|value|wv|v_lin|to_v|v_proj_weight)$")
_OUT = re.compile(r"^(o|o_proj|out_proj|c_proj|proj|out|dense|wo|out_lin|to_out|output)$")
_EMBED = re.compile(r"^(wte|wpe|embed|embeddings?|.*_embeddings?|embed_.*|tok_emb|pos_emb|.*_embed)$")
_NORM = re.compile(r"^(ln|ln_?\w+|.*norm.*)$")
_HEAD = re.compile(r"^(lm_head|head|output|classifier|score)$")
_LEAF = re.compile(r"^(weight|bias|scale|shift|gamma|beta)$")
_BLOCK = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks|block)\.(\d+)(?:\.|$)")


def parameter_kind(name: str) -> str:
    """Classify a parameter by its name into one of `KINDS`.

    Rules, in order: anything under a module with "normalizer" in its name is the attention normaliser's
    own parameter; then embeddings, norms (LayerNorm/RMSNorm, including q_norm/k_norm inside attention),
    the LM head; then projections inside an attention module (by the innermost module name: fused qkv, q,
    k, v, out); then MLP modules; then unambiguous projection names outside an attention module
    (`q_proj`, `out_proj`, ...). Everything else is "other".
    """
    parts = name.lower().split(".")
    if any("normalizer" in p for p in parts):
        return "normalizer"
    # Drop the leaf (weight, bias, ...) but keep leaves that name the tensor, like MHA's in_proj_weight.
    modules = parts[:-1] if len(parts) > 1 and _LEAF.match(parts[-1]) else parts
    inner = modules[-1] if modules else ""

    if any(_EMBED.match(p) for p in modules):
        return "embedding"
    if _NORM.match(inner):
        return "norm"
    if "lm_head" in modules or (len(modules) == 1 and _HEAD.match(inner)):
        return "head"

    in_attn = any(_ATTN_CONTEXT.match(p) for p in modules[:-1])
    in_mlp = any(_MLP_CONTEXT.match(p) for p in modules)
    for pattern, kind in (
        (_QKV, "attn_qkv"),
        (_Q, "attn_q"),
        (_K, "attn_k"),
        (_V, "attn_v"),
        (_OUT, "attn_out"),
    ):
        # Short names like `c_proj`, `dense` or `out` are attention projections only inside an attention
        # module (GPT-2's mlp.c_proj is MLP); suffixed names like `q_proj` or `out_proj` are unambiguous.
        if pattern.match(inner) and (in_attn or (not in_mlp and "_" in inner)):
            return kind
    if in_mlp:
        return "mlp"
    # A bare attention module holding raw parameters, e.g. `blocks.0.attn.weight`.
    if any(_ATTN_CONTEXT.match(p) for p in modules):
        return "attn_qkv" if "qkv" in parts[-1] else "other"
    return "other"


def block_index(name: str) -> int | None:
    """Transformer block number from `.h.3.`, `.layers.3.`, `.blocks.3.` or `.layer.3.`; None outside blocks."""
    match = _BLOCK.search(name)
    return int(match.group(1)) if match else None


def fused_qkv_split(name: str, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Split the gradient of a fused q/k/v projection into (q, k, v) views.

    Layout assumption: three equal blocks, [q | k | v], concatenated along the projection's output
    dimension. That is GPT-2's `c_attn` (a Conv1D: weight (d, 3d), x @ W, so the output dim is the LAST
    one; bias (3d,)) and nn.MultiheadAttention's `in_proj_weight` / `in_proj_bias` and the common `qkv`
    Linear (weight (3d, d), output dim FIRST). Not valid for per-head interleaved layouts (GPT-NeoX
    `query_key_value`) or grouped-query fused layouts with fewer k/v heads; those raise ValueError.
    """
    parts = name.lower().split(".")
    leaf = parts[-1]
    module = parts[-2] if len(parts) > 1 else ""
    if module == "c_attn":
        dim = -1  # Conv1D stores (in, out): output columns are [q | k | v].
    elif leaf in ("in_proj_weight", "in_proj_bias") or module == "qkv":
        dim = 0  # nn.Linear stores (out, in): output rows are [q; k; v].
    else:
        raise ValueError(f"not a fused [q|k|v] parameter with a known layout: {name}")
    if grad.shape[dim] % 3:
        raise ValueError(f"{name}: dimension {dim} of shape {tuple(grad.shape)} is not divisible by 3")
    q, k, v = grad.chunk(3, dim=dim)
    return q, k, v


def _sq_norm(t: Tensor) -> Tensor:
    # fp32 accumulation for bf16/fp16 (their sums of squares overflow or lose bits); fp64 gradients stay fp64
    # (`Fp64GradientCheck` compares against them).
    return torch.linalg.vector_norm(t, dtype=torch.promote_types(t.dtype, torch.float32)).square()


def grouped_grad_norms(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    by: tuple[str, ...] = ("block", "kind"),
) -> dict[str, Tensor]:
    """L2 norms of gradients per group, plus `total`.

    Groupings in `by` (each partitions all gradients, so within one grouping the squares add up to
    total**2):
      "block"       `block_3` per transformer block, `block_none` for parameters outside blocks;
      "kind"        `attn_q`, `attn_k`, `attn_v`, `attn_out`, `mlp`, ... (see `parameter_kind`); fused qkv
                    gradients with a known layout are split into attn_q/attn_k/attn_v, others stay attn_qkv;
      "block_kind"  `block_3/attn_q`, ... the cross product.
    Parameters without a gradient are skipped. One pass; squared sums stay fp32 tensors on the device.
    """
    unknown = set(by) - {"block", "kind", "block_kind"}
    if unknown:
        raise ValueError(f"unknown grouping(s) {sorted(unknown)}")
    sums: dict[str, Tensor] = {}

    def add(key: str, value: Tensor) -> None:
        sums[key] = sums[key] + value if key in sums else value

    total: Tensor | None = None
    device: torch.device | None = None
    for name, param in named_parameters:
        if param.grad is None:
            continue
        kind = parameter_kind(name)
        block = block_index(name)
        block_key = tags.grad_group_block(block)
        # Per-kind pieces: a fused qkv gradient contributes its three slices separately.
        pieces: list[tuple[str, Tensor]]
        if kind == "attn_qkv":
            try:
                q, k, v = fused_qkv_split(name, param.grad)
                pieces = [("attn_q", _sq_norm(q)), ("attn_k", _sq_norm(k)), ("attn_v", _sq_norm(v))]
            except ValueError:
                pieces = [("attn_qkv", _sq_norm(param.grad))]
        else:
            pieces = [(kind, _sq_norm(param.grad))]
        # Everything accumulates on the first gradient's device (a no-op copy in the usual single-device case).
        device = param.grad.device if device is None else device
        pieces = [(key, value.to(device)) for key, value in pieces]
        sq = pieces[0][1] if len(pieces) == 1 else torch.stack([value for _, value in pieces]).sum()

        total = sq if total is None else total + sq
        if "block" in by:
            add(block_key, sq)
        for piece_kind, piece_sq in pieces:
            if "kind" in by:
                add(piece_kind, piece_sq)
            if "block_kind" in by:
                add(tags.grad_group_block_kind(block, piece_kind), piece_sq)

    out = {key: value.sqrt() for key, value in sums.items()}
    out[tags.GRAD_GROUP_TOTAL] = total.sqrt() if total is not None else torch.zeros(())
    return out


def _grads(parameters: Iterable[torch.nn.Parameter] | Tensor) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def total_grad_norm(parameters: Iterable[torch.nn.Parameter] | Tensor) -> Tensor:
    """L2 norm of all gradients together, as `torch.nn.utils.get_total_norm` computes it.

    Norm of the per-tensor norms (not a sum of squares) so that it matches clip_grad_norm_'s value, which
    is the one to log as "before clipping".
    """
    grads = _grads(parameters)
    if not grads:
        return torch.zeros(())
    device = grads[0].device
    norms = [torch.linalg.vector_norm(g, dtype=torch.float32).to(device) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms))


def nonfinite_grad_count(parameters: Iterable[torch.nn.Parameter] | Tensor) -> Tensor:
    """Number of gradient elements that are NaN or +-inf, as an int64 tensor."""
    grads = _grads(parameters)
    if not grads:
        return torch.zeros((), dtype=torch.int64)
    device = grads[0].device
    return torch.stack([(~torch.isfinite(g)).sum().to(device) for g in grads]).sum()
