"""The report's sources: the tags it reads, named for what the findings use them for. Every name is built by
`study.tags` (the one tags module), which the monitors write with. A tag that a sweep did not log makes the
report say so (and the finding inconclusive), never a made-up number.
"""

from __future__ import annotations

from study import tags as t

# AttentionEntropyMonitor / SelectionUniformityMonitor, aggregated over each validation epoch (held-out text,
# every row, mean over layers and heads): the state of attention at the end of a run, measured the same way for
# every setting. (The same statistics without the `val/` prefix are training-step samples.)
ENTROPY = t.val(t.attention("entropy"))
NORMALIZED_ENTROPY = t.val(t.attention("normalized_entropy"))
KL_UNIFORM = t.val(t.attention("kl_uniform"))
TV_UNIFORM = t.val(t.attention("tv_uniform"))
NONZERO = t.val(t.attention("nonzero"))  # keys with non-zero weight per row (sparse normalisers, top-k)
ATTENTION_TAGS = {
    ENTROPY: "row entropy H (nats)",
    NORMALIZED_ENTROPY: "H / log(visible) (1 = uniform)",
    KL_UNIFORM: "KL(alpha || uniform)",
    TV_UNIFORM: "TV(alpha, uniform)",
}
SATURATED_ROWS = t.val(t.attention("saturated"))  # rows with max weight > 0.99, every validation row

# fixed-k uniformity of the selected set (training-step samples) and the Lemma 1 bins (validation)
SELECTION_K = 4  # the fixed k of the selection findings (one of SelectionUniformityMonitor's `selection_ks`)
SELECTION_ENTROPY = t.attention(t.topk_statistic("selection_entropy", SELECTION_K))
VAL_SELECTION_ENTROPY = t.val(SELECTION_ENTROPY)  # on the validation batches: the same held-out texts at every step
VAL_SELECTION_TV = t.val(t.attention(t.topk_statistic("selection_tv", SELECTION_K)))


VAL_SELECTION_ENTROPY_BY_K = t.attention_mean_regex(r"selection_entropy_k(\d+)", t.VAL_PREFIX)  # group 1: k
BY_VISIBLE_MAX_WEIGHT = t.by_visible_regex("max_weight", t.VAL_PREFIX)  # group 1: the bin's n
BY_VISIBLE_ENTROPY = t.by_visible_regex("normalized_entropy", t.VAL_PREFIX)

# GradientNormMonitor (per block and kind: tags.GRAD_BLOCK_KIND_REGEX, groups block and kind) and AttentionJacobianMonitor
JACOBIAN, JACOBIAN_MAX = t.jacobian("mean"), t.jacobian("max")
ENTRY_RATIO_MAX = t.jacobian("entry_ratio_max")  # largest Jacobian entry x 4T (Corollary 3 entrywise: <= 1)
# validation epochs: the trained model on held-out text, the same rows for every setting
VAL_JACOBIAN, VAL_JACOBIAN_MAX = t.val(JACOBIAN), t.val(JACOBIAN_MAX)
VAL_ENTRY_RATIO_MAX = t.val(ENTRY_RATIO_MAX)
ENTRY_RATIO_MEAN = t.val(t.jacobian("entry_ratio_mean"))
NEAR_QUARTER_T = t.val(t.jacobian("frac_near_quarter_T"))
FRAC_SATURATED = t.val(t.jacobian("frac_saturated"))  # among the Jacobian's sampled rows

# AttentionLogitMonitor and AttentionSinkMonitor, the last validation epoch: the largest logit the normaliser sees
# (over every layer) and the share of (layer, head) pairs whose mean weight on the first key exceeds 0.3
MAX_LOGIT = t.val(t.MAX_LOGIT)
SINK_RATE = t.val(t.SINK_RATE)

# NonFiniteGuard (log_grad_norm: true): the same pre-clip total norm, used only when no gradient monitor logged it.
GRAD_NORM_SOURCES = (t.GRAD_NORM, t.GUARD_GRAD_NORM)  # the pre-clip total gradient norm: first tag present wins
