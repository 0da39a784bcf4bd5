"""The paper's analyses (Algorithms 1-5 and Lemma 1), vectorised, on any transformers causal LM.

One module per analysis holds its algorithm and its registration (`distance`, `critical`, `separability`,
`gradient`, `dilution`); `registry.ANALYSES` lists them; `rows` holds the row helpers they share.
"""

from .capture import AttentionCapture, capture_attention, context_length
from .critical import critical_n
from .dilution import dilution_stats
from .distance import distance_stats
from .gradient import gradient_sensitivity
from .outputs import write_outputs
from .protocol import analyze, benchmark_against_oracle, compare_with_paper
from .separability import separability_stats

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
    "write_outputs",
]
