"""Every TensorBoard tag the report reads, in one place.

The attention and gradient tags come from the monitor callbacks (`study.callbacks`: AttentionEntropyMonitor,
SelectionUniformityMonitor, GradientNormMonitor). A tag that a sweep did not log makes the report say
"not logged" (and the finding inconclusive), never a made-up number.
"""

from __future__ import annotations

# written by GPT2Module
TRAIN_LOSS = "train/loss"
VAL_LOSS = "val/loss"
VAL_PPL = "val/ppl"

# AttentionEntropyMonitor / SelectionUniformityMonitor, aggregated over each validation epoch (held-out text,
# every row, mean over layers and heads): the state of attention at the end of a run, measured the same way for
# every setting. (The same statistics without the `val/` prefix are training-step samples.)
ENTROPY = "val/attention/entropy/mean"
NORMALIZED_ENTROPY = "val/attention/normalized_entropy/mean"
KL_UNIFORM = "val/attention/kl_uniform/mean"
TV_UNIFORM = "val/attention/tv_uniform/mean"
NONZERO = "val/attention/nonzero/mean"  # keys with non-zero weight per row (sparse normalisers, top-k)
ATTENTION_TAGS = {
    ENTROPY: "row entropy H (nats)",
    NORMALIZED_ENTROPY: "H / log(visible) (1 = uniform)",
    KL_UNIFORM: "KL(alpha || uniform)",
    TV_UNIFORM: "TV(alpha, uniform)",
}

# SelectionUniformityMonitor, fixed-k uniformity of the selected set and Lemma 1 bins (prefix + n{2^b})
SELECTION_K = 4  # the fixed k of the selection-uniformity findings (one of the monitor's `topk`)
SELECTION_ENTROPY = "attention/selection_entropy_k{k}/mean"  # training-step samples; H of the renormalised top-k
SELECTION_TV = "attention/selection_tv_k{k}/mean"
SATURATED_ROWS = "val/attention/saturated/mean"  # rows with max weight > 0.99, every validation row
BY_VISIBLE_MAX_WEIGHT = "val/attention/by_visible/max_weight/n"
BY_VISIBLE_ENTROPY = "val/attention/by_visible/normalized_entropy/n"

# GradientNormMonitor
GRAD_NORM = "grad_norm/total"  # total gradient norm before clipping
GRAD_NORM_CLIPPED = "grad_norm/total_clipped"  # after clipping
GRAD_Q, GRAD_K = "grad_norm/attn_q", "grad_norm/attn_k"  # the attention-logit parameters W_q, W_k
JACOBIAN = "attention/jacobian/mean"  # attention Jacobian norm |d alpha / d l| on sampled rows
JACOBIAN_MAX = "attention/jacobian/max"
# validation epochs: the trained model on held-out text, the same rows for every setting
VAL_JACOBIAN = "val/attention/jacobian/mean"
VAL_JACOBIAN_MAX = "val/attention/jacobian/max"
FRAC_ABOVE_QUARTER_T = "val/attention/jacobian/frac_above_quarter_T"
FRAC_ABOVE_SQRT2 = "val/attention/jacobian/frac_above_sqrt2"
FRAC_SATURATED = "val/attention/jacobian/frac_saturated"  # among the Jacobian's sampled rows

# Written by study.callbacks.nonfinite.NonFiniteGuard (log_grad_norm: true): the same pre-clip total norm, used
# only when no gradient monitor logged GRAD_NORM.
GUARD_GRAD_NORM = "guard/grad_norm_preclip"
GUARD_SKIPPED = "guard/skipped_steps"

# the pre-clip total gradient norm: first tag present wins
GRAD_NORM_SOURCES = (GRAD_NORM, GUARD_GRAD_NORM)
