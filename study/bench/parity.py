"""Numerical parity of every attention path against stock transformers, in the benchmark's precision.

On one random batch, each path's loss and logits are computed twice: in the run's precision (bf16 autocast on a
GPU) and in fp32. Paths that are stock attention in exact arithmetic (the fused SDPA path at T = 1, the explicit
fp32 path with top-k = L, i.e. all keys) must match stock eager in fp32 to 1e-4 and, in bf16, differ from it by no
more than stock SDPA's own bf16 error allows.
The fp32 equalities are checked on the logits (largest difference <= 1e-4), the bf16 errors on the loss. Paths with no stock counterpart (T != 1, top-k < L, the other
normalisers) are held to the same bf16 error against their own fp32 result (top-k < L to 10x that: its picks
are discontinuous in q and k, which come out of bf16 projections), and the fused and explicit paths at
T != 1 must agree with each other in fp32.
"""

from __future__ import annotations

import torch

from study.bench.shapes import Settings, Shape, Variant
from study.bench.timing import build_module

# The bf16 loss error a path may show: this many times stock SDPA's own, and never less than FLOOR.
BF16_FACTOR = 3.0
BF16_FLOOR = 2e-3
FP32_TOL = 1e-4
SHARPEN = 4.0
SELECTION_FACTOR = 10.0


def paths(settings: Settings, seq_len: int) -> list[tuple[str, Variant, str | None]]:
    """(name, variant, what it must equal in fp32): "stock", another path's name, or None."""
    t = settings.temperature
    out = [
        ("stock sdpa", Variant("stock sdpa", "stock", "sdpa"), "stock"),
        ("study fused SDPA, T=1", Variant("fast", "temperature", "study", {}), "stock"),
        ("study explicit fp32, top-k=L (all keys)", Variant("explicit", "top_k", "study", {"top_k": seq_len}),
         "stock"),
        (f"study fused SDPA, T={t}", Variant("fast T", "temperature", "study", {"temperature": t}), None),
        (f"study explicit fp32, T={t}, top-k=L", Variant("explicit T", "top_k", "study",
                                                       {"temperature": t, "top_k": seq_len}),
         f"study fused SDPA, T={t}"),
    ]
    out += [(f"study top-k k={k}", Variant(f"k{k}", "top_k", "study", {"top_k": k}), None)
            for k in settings.top_ks if k < seq_len]
    out += [(f"study {n}", Variant(n, "normalizer", "study", {"normalizer": n}), None) for n in settings.normalizers]
    return out


def _parity_module(shape: Shape, variant: Variant, device: str):
    """The variant's model in eval mode with its attention weights scaled up (the same for every path).

    A random-init model attends almost uniformly (scores near 0), so a wrong temperature or selection would hardly
    move its logits; scaling every attention weight by ``SHARPEN`` makes the scores O(1) and the check sensitive.
    """
    from study.attention import attention_modules

    module = build_module(shape, variant)
    with torch.no_grad():
        for attention in attention_modules(module.model):
            for p in attention.parameters():
                if p.dim() == 2:
                    p.mul_(SHARPEN)
    return module.to(device).eval()


def _forward(module, ids: torch.Tensor, device: str, bf16: bool) -> tuple[float, torch.Tensor]:
    with torch.no_grad(), torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
        out = module.model(input_ids=ids, labels=ids)
    return float(out.loss.float()), out.logits.float()


def check_parity(shape: Shape, settings: Settings, batch: int = 2) -> list[dict]:
    """One row per path: fp32 and run-precision loss, their differences, and a PASS/MISS verdict."""
    device = settings.device
    bf16 = settings.precision.startswith("bf16")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(shape.vocab_size, (min(batch, shape.batch_size), shape.seq_len), generator=gen).to(device)
    stock = _parity_module(shape, Variant("stock eager", "stock", "eager"), device)
    ref_loss, ref_logits = _forward(stock, ids, device, bf16=False)
    del stock
    rows: dict[str, dict] = {}
    logits_fp32: dict[str, torch.Tensor] = {}
    for name, variant, equals in paths(settings, shape.seq_len):
        module = _parity_module(shape, variant, device)
        loss32, logits32 = _forward(module, ids, device, bf16=False)
        loss, logits = _forward(module, ids, device, bf16=bf16)
        row = {"path": name, "loss_fp32": loss32, "loss": loss, "precision": settings.precision,
               "loss_error_vs_own_fp32": abs(loss - loss32),
               "max_logit_error_vs_own_fp32": float((logits - logits32).abs().max())}
        if equals is not None:
            # Exact arithmetic says equal: the largest logit difference in fp32 (a loss can hide a wrong path
            # on a random-init model, whose loss hardly depends on attention).
            other = ref_logits if equals == "stock" else logits_fp32[equals]
            row["fp32_vs_" + equals] = float((logits32 - other).abs().max())
        if equals == "stock":
            row["loss_error_vs_stock_fp32"] = abs(loss - ref_loss)
        logits_fp32[name] = logits32
        rows[name] = row
        del module
    floor = max(BF16_FACTOR * rows["stock sdpa"]["loss_error_vs_own_fp32"], BF16_FLOOR)
    for name, row in rows.items():
        exact = [v for k, v in row.items() if k.startswith("fp32_vs_")]
        precise = [row["loss_error_vs_own_fp32"], row.get("loss_error_vs_stock_fp32", 0.0)]
        # Top-k < L is discontinuous: q and k come out of bf16 projections, so near-tied picks may flip.
        row["bf16_allowance"] = floor * (SELECTION_FACTOR if name.startswith("study top-k") else 1.0)
        ok = all(e <= FP32_TOL for e in exact) and all(e <= row["bf16_allowance"] for e in precise)
        row["verdict"] = "PASS" if ok else "MISS"
    return list(rows.values())
