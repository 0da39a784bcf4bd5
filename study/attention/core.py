"""`attend`: scaled dot-product attention under an `AttentionSpec`, for any model.

The logit of key j for query i, in this order (the model's own logit first, then the temperature):

    q, k = qk_norm(q, k)                          with ``spec.qk_norm`` only (`study.attention.qknorm`)
    l_ij = q_i.k_j * scaling                      the model's scale (1/sqrt(D) by default)
    l_ij = softcap * tanh(l_ij / softcap)         the model's soft-capping (Gemma 2), if given
    l_ij = l_ij + bias_ij                         the model's additive biases: ``logit_bias`` (T5's position bias)
                                                  and the finite entries of a float ``mask`` (ALiBi)
    z_ij = l_ij / T                               the spec's temperature

then top-k selection on z among the visible keys, the spec's normaliser, and, with ``sinks``, one extra logit per
head (gpt-oss's attention sink, also divided by T) that takes part in the softmax's denominator and is dropped.
With ``spec.output_gate`` the output of every path is then gated by ``sigmoid(X W)`` (`study.attention.gate`).
Visible keys: the mask, causality (query i, aligned to the end of the keys, sees keys up to itself) and the
sliding window (keys less than ``sliding_window`` positions away: before the query when causal, on either side
when not). At T = 1 with stock softmax every model gets exactly its own attention. (For transformers models
`study.attention.hf` passes causality and the window only when the model gives no mask, as transformers' own
attention functions do: a mask, when given, already holds both.)

Three paths compute the same function:
- fast: stock softmax with no top-k, no soft-capping and no open tap runs PyTorch's fused SDPA with
  ``scale = scaling / T`` (biases divided by T, a sink as one extra zero key/value whose bias is the sink logit);
  while every open tap reads row statistics only (`study.attention.tap.row_statistics_needed`), a logged call
  stays on this path and the taps get `study.attention.rowstats.RowStatistics`, computed beside the output
  without the map;
- gathered top-k: softmax with top-k and no open tap (no sink, no dropout) selects each row's k keys over blocks of
  keys without gradient, then attends over those k only (`study.attention.topk`): the explicit path's function,
  with L x k scores in the forward and backward passes;
- explicit: fp32 scores, finite mask values, optional top-k selection, any normaliser, and the taps that
  monitors use to read the weights (and, for a tap that asks, the logits: `study.attention.tap.AttentionLogits`). When the (B, H, Lq, Lk) score tensor would be large it runs blockwise
  (`study.attention.blockwise`): the same rows computed a block of queries at a time, each block recomputed in
  the backward pass, so its memory grows as O(L x block) instead of O(L^2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from study.attention import blockwise, rowstats, tap, topk
from study.attention.gate import OutputGate
from study.attention.normalizers import MASK_VALUE, Normalizer, Softmax, top_k_allowed
from study.attention.qknorm import QKNorm
from study.attention.registry import normalizer_class
from study.attention.select import top_k_indices
from study.attention.spec import AttentionSpec

ALL = slice(None)


def causal_allowed(q_len: int, kv_len: int, device: torch.device, rows: slice = ALL, keys: slice = ALL) -> Tensor:
    """Bool (q_len, kv_len) mask: query i (the last q_len positions of kv_len) sees keys 0..i+offset.
    With ``rows`` / ``keys``, only those query rows / key columns."""
    offset = kv_len - q_len
    positions = torch.arange(q_len, device=device)[rows, None] + offset
    return torch.arange(kv_len, device=device)[None, keys] <= positions


def window_allowed(q_len: int, kv_len: int, window: int, causal: bool, device: torch.device,
                   rows: slice = ALL, keys: slice = ALL) -> Tensor:
    """Bool (q_len, kv_len): keys fewer than ``window`` positions from the query (queries aligned to the end).
    With ``rows`` / ``keys``, only those query rows / key columns.

    Causal: the query and the window - 1 keys before it (transformers' ``kv_idx > q_idx - sliding_window``).
    Bidirectional: window - 1 keys on either side (ModernBERT passes its half-window + 1).
    """
    positions = torch.arange(q_len, device=device)[rows, None] + (kv_len - q_len)
    distance = positions - torch.arange(kv_len, device=device)[keys]
    return (distance < window) if causal else (distance.abs() < window)


def _block_of(tensor: Tensor | None, rows: slice, keys: slice) -> Tensor | None:
    """Rows ``rows`` and key columns ``keys`` of a tensor broadcastable to (B, H, Lq, Lk) (a dimension it
    broadcasts over stays as it is)."""
    if tensor is None:
        return tensor
    if keys != ALL and tensor.dim() >= 1 and tensor.shape[-1] != 1:
        tensor = tensor[..., keys]
    if rows != ALL and tensor.dim() >= 2 and tensor.shape[-2] != 1:
        tensor = tensor[..., rows, :]
    return tensor


def _reachable_keys(rows: slice, q_len: int, kv_len: int, causal: bool, window: int | None) -> slice:
    """The key columns that causality and the window leave to the query rows ``rows`` (never empty): a block of
    causal rows needs no score for the keys after its last query, nor before its first query's window."""
    if rows == ALL:
        return ALL
    offset = kv_len - q_len
    first, last = rows.start + offset, rows.stop - 1 + offset  # positions of the block's first and last query
    start, stop = 0, kv_len
    if causal:
        stop = min(stop, last + 1)
    if window is not None:
        start = max(start, first - window + 1)
        if not causal:
            stop = min(stop, last + window)
    stop = max(stop, 1)
    return slice(min(start, stop - 1), stop)


def _rows_reaching(keys: slice, q_len: int, kv_len: int, causal: bool, window: int | None) -> slice:
    """The query rows that causality and the window let see any of the key columns ``keys`` (possibly none): the
    converse of `_reachable_keys`, for passes over blocks of keys."""
    offset = kv_len - q_len
    first_key, last_key = keys.start or 0, (kv_len if keys.stop is None else keys.stop) - 1
    start, stop = 0, q_len  # query i sits at position i + offset
    if causal:
        start = max(start, first_key - offset)
    if window is not None:
        stop = min(stop, last_key - offset + window)
        if not causal:
            start = max(start, first_key - offset - window + 1)
    return slice(min(start, q_len), max(min(stop, q_len), min(start, q_len)))


def _split_mask(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """(bool mask, additive bias or None). A float mask's entries below half the dtype's minimum are masked; its
    other entries are a bias added to the logits (zero for a plain 0 / min mask, ALiBi's slopes otherwise)."""
    if mask is None or mask.dtype == torch.bool:
        return mask, None
    keep = mask > torch.finfo(mask.dtype).min / 2
    return keep, mask.masked_fill(~keep, 0.0)  # no test for an all-zero bias: it would sync with the device


def _visible(q_len: int, kv_len: int, device, mask: Tensor | None, causal: bool, window: int | None,
             rows: slice = ALL, keys: slice = ALL):
    """The bool mask of visible keys, broadcastable to (B, H, Lq, Lk), or None when every key is visible; and
    whether it is exactly the square causal mask (SDPA's ``is_causal`` flag then picks its fastest kernel).
    With ``rows`` / ``keys``, only those query rows / key columns."""
    plain_causal = causal and q_len > 1 and q_len == kv_len and mask is None and window is None
    visible = _block_of(mask, rows, keys)
    if causal and q_len > 1:
        band = causal_allowed(q_len, kv_len, device, rows, keys)
        visible = band if visible is None else visible & band
    if window is not None:
        band = window_allowed(q_len, kv_len, window, causal, device, rows, keys)
        visible = band if visible is None else visible & band
    return visible, plain_causal


def _check_transforms(query: Tensor, spec: AttentionSpec, softcap, sinks, sliding_window) -> None:
    """One-line errors naming a bad logit-transform argument, before any work."""
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0, got {softcap!r}")
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 1):
        raise ValueError(f"sliding_window must be an integer >= 1, got {sliding_window!r}")
    if sinks is not None:
        if spec.normalizer != "softmax":
            raise ValueError(f"attention sinks (s_aux) are defined for softmax only, not normalizer {spec.normalizer!r}")
        if tuple(sinks.shape) != (query.shape[1],):
            raise ValueError(f"sinks (s_aux) must have one logit per query head, shape ({query.shape[1]},), "
                             f"got {tuple(sinks.shape)}")


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    spec: AttentionSpec,
    mask: Tensor | None = None,
    causal: bool = True,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    normalizer: Normalizer | None = None,
    layer: int | None = None,
    softcap: float | None = None,
    logit_bias: Tensor | None = None,
    sinks: Tensor | None = None,
    sliding_window: int | None = None,
    qk_norm: QKNorm | None = None,
    output_gate: OutputGate | None = None,
    gate_input: Tensor | None = None,
) -> Tensor:
    """Attention output for queries (B, H, Lq, D) over keys/values (B, Hkv, Lk, D); returns (B, H, Lq, Dv).

    Args:
        spec: normaliser, temperature and top-k selection.
        mask: optional mask broadcastable to (B, H, Lq, Lk): bool (True = may attend, e.g. padding) or float
            (additive: entries below half the dtype's minimum are masked, the others are a logit bias).
            Combined with the causal mask when ``causal``.
        causal: apply a causal mask (query i sees keys up to i, aligned to the end when Lk > Lq).
        scaling: the model's score scale; default 1/sqrt(D). The temperature divides the logit it gives.
        dropout: attention dropout probability (pass 0 in eval).
        normalizer: the module holding the normaliser's parameters; built from the spec when omitted.
            Transformers models get one per layer from `apply_attention_spec`.
        layer: layer index reported to taps.
        softcap: the model's logit soft-capping, ``softcap * tanh(l / softcap)``, applied before T.
        logit_bias: additive logit bias broadcastable to (B, H, Lq, Lk) (T5's position bias), before T.
        sinks: (H,) one sink logit per query head (gpt-oss); softmax only.
        sliding_window: keys fewer than this many positions away stay visible (see `window_allowed`).
        qk_norm: the layer's QK-norm gains, used when ``spec.qk_norm`` (built with gains of 1 when omitted;
            transformers models get one per layer from `apply_attention_spec`). q and k are normalised first,
            before the scale and every transform below, on every path.
        output_gate, gate_input: with ``spec.output_gate``, the layer's gate and its input X (B, Lq, d_model):
            the output is multiplied by ``output_gate(X)``, (B, H, Lq, Dv), on every path. Both are required then
            (a gate's weights are the model's: none is made up here); without the option both are ignored.

    The order of these transforms is in the module docstring. The normaliser gets the allowed keys after top-k
    selection and, as ``visible``, the mask before it (SSMax's n counts the visible keys).

    Key/value heads fewer than query heads (grouped-query attention) are shared across query groups.
    """
    _check_transforms(query, spec, softcap, sinks, sliding_window)
    if spec.output_gate and (output_gate is None or gate_input is None):  # before any work
        missing = [name for name, given in (("output_gate", output_gate), ("gate_input", gate_input)) if given is None]
        raise ValueError(f"spec.output_gate=True needs the layer's gate and its input; {' and '.join(missing)} not given")
    output = _attend(query, key, value, spec, mask, causal, scaling=scaling, dropout=dropout, normalizer=normalizer,
                     layer=layer, softcap=softcap, logit_bias=logit_bias, sinks=sinks, sliding_window=sliding_window,
                     qk_norm=qk_norm)
    return output_gate.gated(output, gate_input) if spec.output_gate else output


def _attend(query: Tensor, key: Tensor, value: Tensor, spec: AttentionSpec, mask: Tensor | None, causal: bool, *,
            scaling: float | None, dropout: float, normalizer: Normalizer | None, layer: int | None,
            softcap: float | None, logit_bias: Tensor | None, sinks: Tensor | None, sliding_window: int | None,
            qk_norm: QKNorm | None) -> Tensor:
    """`attend` before the output gate: every path, from QK-norm to the weighted values."""
    if spec.qk_norm:  # before the paths split: the fused, dense and blockwise paths all see the normalised q, k
        if qk_norm is None:
            qk_norm = QKNorm(query.shape[1], key.shape[1]).to(query.device)
        query, key = qk_norm(query, key)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    q_len, kv_len = query.shape[-2], key.shape[-2]
    mask, bias = _split_mask(mask)
    if logit_bias is not None:
        bias = logit_bias if bias is None else bias + logit_bias

    fused_output = None
    if spec.is_stock_softmax and softcap is None and tap.fused_output_allowed():
        visible, plain_causal = _visible(q_len, kv_len, query.device, mask, causal, sliding_window)
        if plain_causal and bias is None and sinks is None:
            visible = None
        fused_output = _fused(query, key, value, visible, bias, sinks, plain_causal, scaling / spec.temperature,
                              spec.temperature, dropout)
        if not tap.active_taps():
            return fused_output
        # Taps open on a fused-path spec: the output stays the fused kernel's (a logging step trains exactly as
        # every other step, and backpropagates through the same kernel), and the weights the taps read are
        # computed beside it, below, without an autograd graph.
        if tap.recomputing():  # activation checkpointing's second forward: the taps saw this call already
            return fused_output
        wanted = tap.row_statistics_needed()
        if wanted is not None and sinks is None:  # every tap reads row statistics: no map at all
            _notify_row_statistics(query, key, spec, layer, scaling, mask, bias, causal, sliding_window, visible,
                                   plain_causal and visible is None, wanted)
            return fused_output

    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if normalizer is None:
        normalizer = normalizer_class(spec.normalizer).from_spec(spec, num_heads=query.shape[1]).to(query.device)

    if (spec.top_k is not None and spec.top_k < kv_len and type(normalizer) is Softmax and sinks is None
            and dropout == 0.0 and not tap.active_taps()
            and blockwise.gathers_top_k(query.shape[0] * query.shape[1], q_len, kv_len, spec.top_k)):
        return _top_k_gathered(query, key, value, spec, scaling, softcap, bias, mask, causal, sliding_window)

    exact = torch.promote_types(query.dtype, torch.float32)

    def rows_output(rows: slice, first_pass: bool = True, layer: int | None = layer) -> Tensor | None:
        """The output of the query rows ``rows``: their scores over the keys they can reach, weights, taps, the
        weighted values (None when ``fused_output`` is the call's output: then only the taps need the weights).
        Keys that causality or the window hide from every row of the block are left out: their weights would be
        exactly zero under every normaliser (the `Normalizer` contract)."""
        keys = _reachable_keys(rows, q_len, kv_len, causal and q_len > 1, sliding_window)
        visible, _ = _visible(q_len, kv_len, query.device, mask, causal, sliding_window, rows, keys)
        q_rows, k_cols, v_cols = query[..., rows, :], key[..., keys, :], value[..., keys, :]
        allowed = torch.ones(1, 1, q_rows.shape[-2], k_cols.shape[-2], dtype=torch.bool, device=query.device)
        if visible is not None:
            allowed = allowed & visible
        # Scores and normalisation in fp32 even under bf16 autocast: at T = 0.01 bf16 scores flip top-k choices
        # and the output error reaches 0.5. Divide by T after the model's own transforms, and mask with a finite
        # value only after that, so that a small T never overflows the mask.
        # A float64 model (the probe's reference) keeps float64 scores.
        with torch.autocast(device_type=query.device.type, enabled=False):
            scores = torch.matmul(q_rows.to(exact), k_cols.to(exact).transpose(-1, -2)) * scaling
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            if bias is not None:
                scores = scores + _block_of(bias, rows, keys).to(exact)
            raw = scores if first_pass and tap.wants_logits() else None  # kept only for a tap that reads logits
            scores = scores / spec.temperature
            weights = _normalize(scores, allowed, spec, normalizer, sinks)

        if first_pass and tap.active_taps():
            inputs = None
            if rows == ALL or rows.start == 0:  # the call's inputs, once: with its first block of rows
                applied = {"softcap": softcap, "bias": bias, "sinks": sinks, "sliding_window": sliding_window,
                           "mask": mask}
                inputs = tap.AttentionInputs(query.detach(), key.detach(), value.detach(), float(scaling), spec,
                                             normalizer, tuple(name for name, given in applied.items() if given is not None))
            if keys != ALL:  # taps see whole rows: zero weight, not allowed, on the keys left out
                widths = (keys.start, kv_len - keys.stop)
                weights_seen = F.pad(weights.detach(), widths)
                allowed_seen = F.pad(allowed.expand(*weights.shape[:-1], -1), widths, value=False)
            else:
                weights_seen, allowed_seen = weights, allowed
            logits = None if raw is None else tap.AttentionLogits(scores.detach(), raw.detach(), allowed, spec)
            tap.notify(layer, weights_seen, allowed_seen, spec, inputs, logits)
        if fused_output is not None:
            return None
        if dropout > 0.0:
            weights = F.dropout(weights, p=dropout, training=True)
        return torch.matmul(weights.to(value.dtype), v_cols)

    per_block = blockwise.block_rows(query.shape[0] * query.shape[1], q_len, kv_len)
    if fused_output is not None:
        with torch.no_grad():
            if per_block is None or not tap.takes_row_blocks():
                rows_output(ALL)
            else:  # one block of rows at a time, as the blockwise path: the whole (B, H, L, L) may not fit
                layer_of_call = tap.layer_number(layer)
                for start in range(0, q_len, per_block):
                    rows_output(slice(start, min(start + per_block, q_len)), True, layer_of_call)
        return fused_output
    if per_block is None or not getattr(normalizer, "row_wise", True) or not tap.takes_row_blocks():
        return rows_output(ALL)
    # Every block of one call reaches the taps under one layer number.
    layer_of_call = tap.layer_number(layer) if tap.active_taps() else layer
    return blockwise.attend_in_blocks(lambda rows, first: rows_output(rows, first, layer_of_call), q_len, per_block)


def _notify_row_statistics(query, key, spec, layer, scaling, mask, bias, causal, window, fused_mask,
                           is_causal: bool, wanted: tuple[frozenset[str], int]) -> None:
    """Hand the taps this call's softmax row statistics (`study.attention.rowstats`), computed without the map."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    if key.shape[1] != query.shape[1]:
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    exact = torch.promote_types(query.dtype, torch.float32)

    def visible_of(keys: slice) -> Tensor | None:
        return _visible(q_len, kv_len, query.device, mask, causal, window, ALL, keys)[0]

    def rows_of(keys: slice) -> slice:
        return _rows_reaching(keys, q_len, kv_len, causal and q_len > 1, window)

    transform = None
    if bias is not None:
        def transform(raw: Tensor, rows: slice, keys: slice) -> Tensor:
            return raw + _block_of(bias, rows, keys).to(exact)

    needs, top_k = wanted
    rows = rowstats.row_statistics(query, key, scaling=scaling, temperature=spec.temperature, visible_of=visible_of,
                                   rows_of=rows_of,
                                   mask=fused_mask, is_causal=is_causal, logit_transform=transform, needs=needs,
                                   top_k=top_k)
    tap.notify_rows(layer, rows, spec)


def _top_k_gathered(query, key, value, spec: AttentionSpec, scaling: float, softcap, bias, mask, causal: bool,
                    window) -> Tensor:
    """Top-k softmax by selection, then gather (`study.attention.topk`): the explicit path's function, with scores
    for L x k pairs in the forward and backward passes (heads already shared out)."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    exact = torch.promote_types(query.dtype, torch.float32)
    full = (*query.shape[:2], q_len, kv_len)

    def transform(raw: Tensor, bias_at: Tensor | None) -> Tensor:
        """The model's own transforms, then T, as the explicit path applies them."""
        if softcap is not None:
            raw = torch.tanh(raw / softcap) * softcap
        if bias_at is not None:
            raw = raw + bias_at.to(exact)
        return raw / spec.temperature

    def logits_of(rows: slice, keys: slice) -> Tensor:
        raw = torch.matmul(query[..., rows, :].to(exact), key[..., keys, :].to(exact).transpose(-1, -2)) * scaling
        return transform(raw, _block_of(bias, rows, keys))

    def visible_of(rows: slice, keys: slice) -> Tensor | None:
        return _visible(q_len, kv_len, query.device, mask, causal, window, rows, keys)[0]

    def reach_of(rows: slice) -> slice:
        return _reachable_keys(rows, q_len, kv_len, causal and q_len > 1, window)

    def logits_of_gathered(q: Tensor, picked_keys: Tensor, index: Tensor) -> Tensor:
        raw = torch.matmul(picked_keys.to(exact), q.to(exact).unsqueeze(-1)).squeeze(-1) * scaling
        return transform(raw, None if bias is None else bias.expand(full).gather(-1, index))

    def visible_of_gathered(index: Tensor) -> Tensor | None:
        positions = torch.arange(q_len, device=index.device)[:, None] + (kv_len - q_len)
        seen = None if mask is None else mask.expand(full).gather(-1, index)
        if causal and q_len > 1:
            seen = index <= positions if seen is None else seen & (index <= positions)
        if window is not None:
            distance = positions - index
            band = distance < window if causal else distance.abs() < window
            seen = band if seen is None else seen & band
        return seen

    with torch.autocast(device_type=query.device.type, enabled=False):
        index = topk.select_top_k(q_len, kv_len, query.shape[0] * query.shape[1], spec.top_k, logits_of,
                                  visible_of, reach_of)
        return topk.gathered_attention(query, key, value, index, logits_of_gathered, visible_of_gathered)


def _normalize(scores: Tensor, allowed: Tensor, spec: AttentionSpec, normalizer: Normalizer, sinks) -> Tensor:
    """Top-k selection and the normaliser on fp32 scores (already / T); with sinks, softmax with a sink."""
    k = spec.top_k
    if sinks is not None:
        selected = allowed if k is None else top_k_allowed(scores, allowed, k)
        sink = (sinks.float() / spec.temperature).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        row = torch.cat([scores.masked_fill(~selected, MASK_VALUE), sink], dim=-1)
        return row.softmax(dim=-1)[..., :-1].masked_fill(~selected, 0.0)
    if k is not None and k < scores.shape[-1] and type(normalizer) is Softmax:
        return _top_k_softmax(scores, allowed, k)
    selected = allowed if k is None else top_k_allowed(scores, allowed, k)
    return normalizer(scores, selected, visible=allowed)


def _fused(query, key, value, visible, bias, sinks, plain_causal: bool, scale: float, temperature: float,
           dropout: float) -> Tensor:
    """Stock softmax through `F.scaled_dot_product_attention` (the fast path of `attend`); ``visible`` is None
    on a plain causal row set (then SDPA's ``is_causal`` flag applies it)."""
    q_len = query.shape[-2]
    attn_mask, is_causal = visible, plain_causal and visible is None
    if bias is not None or sinks is not None:
        # A float mask: SDPA adds it to q.k * scale, so the model's biases enter divided by T.
        low = torch.finfo(query.dtype).min
        attn_mask = torch.zeros((), dtype=query.dtype, device=query.device) if bias is None else bias / temperature
        attn_mask = attn_mask.to(query.dtype)
        if visible is not None:
            attn_mask = attn_mask.masked_fill(~visible, low)
        if sinks is not None:
            # The sink as one more key: zero key (q.0 = 0), zero value, bias = sink / T on every query row.
            batch, heads = query.shape[0], query.shape[1]
            attn_mask = attn_mask.expand(batch, heads, q_len, key.shape[-2])
            sink = (sinks / temperature).to(query.dtype).view(1, heads, 1, 1).expand(batch, heads, q_len, 1)
            attn_mask = torch.cat([attn_mask, sink], dim=-1)
            key = torch.cat([key, key.new_zeros(*key.shape[:-2], 1, key.shape[-1])], dim=-2)
            value = torch.cat([value, value.new_zeros(*value.shape[:-2], 1, value.shape[-1])], dim=-2)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal, scale=scale,
        enable_gqa=key.shape[1] != query.shape[1],
    )


def _top_k_softmax(scores: Tensor, allowed: Tensor, k: int) -> Tensor:
    """Softmax over exactly the k largest allowed scores of each row, as dense weights (same as `Softmax` over
    `top_k_allowed`, with the same picks).

    The softmax runs on the k picked values only and is scattered back: no (B, H, Lq, Lk) selection mask, no
    second masked fill, and a backward pass that only gathers. Picks on keys the query cannot see (rows that see
    fewer than k keys) carry the finite mask value, whose exp underflows to exactly 0 next to any visible key;
    rows with no visible key at all are zeroed.
    """
    masked = scores.masked_fill(~allowed, MASK_VALUE)
    index = top_k_indices(masked, k)  # ties: the lowest position, as in `top_k_allowed`
    picked = masked.gather(-1, index).softmax(dim=-1) * allowed.any(dim=-1, keepdim=True)
    return torch.zeros_like(scores).scatter(-1, index, picked)
