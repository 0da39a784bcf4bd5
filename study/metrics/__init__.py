"""Pure-torch metrics for the study: attention-row statistics and gradient statistics.

No Lightning or transformers imports here: these functions run inside attention forwards and optimizer
hooks, and are unit-tested against closed forms and brute force.
"""

from study.metrics.attention import (
    SATURATED,
    VISIBLE_BINS,
    as_distribution,
    by_visible_sums,
    effective_support,
    entropy_sums,
    finalize,
    kl_to_uniform,
    max_weight,
    nonzero_count,
    normalized_entropy,
    row_entropy,
    sample_rows,
    selection_entropy,
    selection_uniformity,
    softmax_jacobian_norm,
    summarize_rows,
    topk_mass,
    tv_to_uniform,
    visible_bin,
    visible_count,
)
from study.metrics.gradients import (
    KINDS,
    block_index,
    fused_qkv_split,
    grouped_grad_norms,
    nonfinite_grad_count,
    parameter_kind,
    total_grad_norm,
)

__all__ = [
    "KINDS",
    "SATURATED",
    "VISIBLE_BINS",
    "as_distribution",
    "by_visible_sums",
    "block_index",
    "effective_support",
    "entropy_sums",
    "finalize",
    "fused_qkv_split",
    "grouped_grad_norms",
    "kl_to_uniform",
    "max_weight",
    "nonfinite_grad_count",
    "nonzero_count",
    "normalized_entropy",
    "parameter_kind",
    "row_entropy",
    "sample_rows",
    "selection_entropy",
    "selection_uniformity",
    "softmax_jacobian_norm",
    "summarize_rows",
    "topk_mass",
    "total_grad_norm",
    "tv_to_uniform",
    "visible_bin",
    "visible_count",
]
