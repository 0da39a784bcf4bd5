"""The paper's analyses (Algorithms 1-5 and Lemma 1), vectorised, on any transformers causal LM."""

from .algorithms import (
    critical_n,
    dilution_stats,
    distance_stats,
    gradient_sensitivity,
    separability_stats,
    softmax_jacobian_norm,
)
from .capture import AttentionCapture, capture_attention, context_length
from .outputs import write_outputs
from .run import analyze, benchmark_against_oracle, compare_with_paper

__all__ = [
    "AttentionCapture",
    "analyze",
    "benchmark_against_oracle",
    "capture_attention",
    "compare_with_paper",
    "context_length",
    "critical_n",
    "dilution_stats",
    "distance_stats",
    "gradient_sensitivity",
    "separability_stats",
    "softmax_jacobian_norm",
    "write_outputs",
]
