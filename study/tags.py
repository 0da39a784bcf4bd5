"""Every TensorBoard tag the study writes, in one place: the monitors build their tags here, the custom-scalars
layout builds its regular expressions here, and the report and the probe read the same names.

No imports from the rest of the package: anything may import this module.

Phases: training-step values carry no prefix; values aggregated over a validation epoch carry ``val/`` (`val`).
"""

from __future__ import annotations

import math
import re

VAL_PREFIX = "val/"


def val(tag: str) -> str:
    """The validation-epoch version of a monitor tag."""
    return VAL_PREFIX + tag


# ---- TensorBoard's HParams: a run's settings (`CausalLMModule.hparam_summary`) ------------------------------------
def attention_hparam(field: str) -> str:
    """``attention/{field}``: an `AttentionSpec` field (temperature, top_k, normalizer, ...) in the HParams table."""
    return f"attention/{field}"


# ---- a sweep's pretraining run: Lightning's logger prefix, joined with "-" (pretrain-train/loss, ...) -----------
PRETRAIN_PREFIX = "pretrain"


def pretrain(tag: str) -> str:
    """How a pretraining run's tag reads in its event files: ``pretrain-train/loss``."""
    return f"{PRETRAIN_PREFIX}-{tag}"


# ---- what the run ran: code, configs, libraries, machine (`study.provenance`), a text entry at fit start ---------
PROVENANCE = "provenance"


# ---- the LightningModule ----------------------------------------------------------------------------------------
TRAIN_LOSS = "train/loss"
TRAIN_PPL = "train/ppl"
TRAIN_Z_LOSS = "train/z_loss"  # the auxiliary z-loss, mean (log Z)^2 (CausalLMModule z_loss > 0)
FIXED_BATCH_LOSS = "train/fixed_batch_loss"  # FixedBatchLoss: one held-out batch, the same at every step
VAL_LOSS = "val/loss"
VAL_PPL = "val/ppl"
# NgramBaseline, at step 0: the held-out loss (nats, the targets of val/loss) of an add-one unigram and of an
# interpolated absolute-discounting bigram fitted on the run's training tokens: what a model must beat to use context
VAL_UNIGRAM_LOSS = "val/unigram_loss"
VAL_BIGRAM_LOSS = "val/bigram_loss"


# ---- attention monitors (AttentionEntropyMonitor, SelectionUniformityMonitor, AttentionJacobianMonitor) -------
def attention(statistic: str, layer: int | None = None, head: int | None = None) -> str:
    """``attention/{statistic}/mean`` (all layers and heads), ``.../layer_{l}`` or ``.../layer_{l}/head_{h}``."""
    if layer is None:
        return f"attention/{statistic}/mean"
    return f"attention/{statistic}/layer_{layer}" + ("" if head is None else f"/head_{head}")


def attention_spread(statistic: str, end: str) -> str:
    """``attention/{statistic}/layer_min`` or ``.../layer_max``: the smallest or largest layer value (``end`` "min" or
    "max"), the band around the layer mean in the custom-scalars charts."""
    if end not in ("min", "max"):
        raise ValueError(f"end must be 'min' or 'max', got {end!r}")
    return f"attention/{statistic}/layer_{end}"


def attention_layers_regex(statistic: str, phase_prefix: str = "") -> str:
    """A regular expression matching every ``attention/{statistic}/layer_{l}`` tag (the layout's charts)."""
    return "^" + re.escape(phase_prefix + f"attention/{statistic}/layer_") + r"\d+$"


def topk_statistic(name: str, k: int) -> str:
    """The statistic name of a top-k quantity: ``topk_mass_k4``, ``selection_tv_k4``, ``selection_entropy_k4``."""
    return f"{name}_k{k}"


def attention_mean_regex(statistic_regex: str, phase_prefix: str = "") -> str:
    """A regular expression for ``attention/{statistic}/mean`` where the statistic is itself a regex (with groups)."""
    return "^" + re.escape(phase_prefix + "attention/") + statistic_regex + re.escape("/mean") + "$"


def by_visible_prefix(statistic: str) -> str:
    return f"attention/by_visible/{statistic}/n"


def by_visible(statistic: str, n: int) -> str:
    """Lemma 1 bins: ``attention/by_visible/{statistic}/n{n}`` for rows with n <= visible keys < 2n."""
    return f"{by_visible_prefix(statistic)}{n}"


def by_visible_regex(statistic: str, phase_prefix: str = "") -> str:
    return "^" + re.escape(phase_prefix + by_visible_prefix(statistic)) + r"(\d+)$"


ENTROPY_HEADS_HISTOGRAM = "attention/normalized_entropy/heads"


def attention_map(layer: int, head: int) -> str:
    return f"attention_map/layer_{layer}/head_{head}"


def attention_map_before_after(layer: int, head: int) -> str:
    """One image with the map before training (step 0) beside the map now, on one colour scale."""
    return f"attention_map_before_after/layer_{layer}/head_{head}"


# the attention logits (AttentionLogitMonitor): attention(statistic, layer[, head]) and attention_spread
LOGIT_STATISTICS = ("max_logit", "max_logit_raw", "logit_mean", "logit_std")
MAX_LOGIT = attention_spread("max_logit", "max")  # the largest scaled logit over the logged layers (MaxLogit)
MAX_LOGIT_RAW = attention_spread("max_logit_raw", "max")  # the same before T: MAX_LOGIT = MAX_LOGIT_RAW / T

# the first visible key (AttentionSinkMonitor): attention(statistic, layer[, head])
SINK_STATISTICS = ("first_key_weight", "sink_rate")
SINK_RATE = attention("sink_rate")  # the share of (layer, head) pairs whose mean first-key weight exceeds 0.3

# EntropyCollapseAlert
ENTROPY_COLLAPSE_TEXT = "alerts/entropy_collapse"  # a text entry at each step where a layer collapses
ENTROPY_COLLAPSE_LAYERS = "alerts/entropy_collapse_layers"  # layers collapsed so far, at every measured step


# the Jacobian of the attention map, on sampled rows (AttentionJacobianMonitor)
def jacobian(statistic: str) -> str:
    """``attention/jacobian/{statistic}``: mean, max, layer_{l} (spectral norms), entry_ratio_mean,
    entry_ratio_max, frac_near_quarter_T (largest entry x 4T), frac_saturated, bound_quarter_T, bound_half_T."""
    return f"attention/jacobian/{statistic}"


JACOBIAN_STATISTICS = ("entry_ratio_mean", "frac_near_quarter_T", "frac_saturated")  # fractions and ratios in [0, 1]


# ---- gradient norms (GradientNormMonitor) -----------------------------------------------------------------------
# The group names `study.metrics.gradients.grouped_grad_norms` returns are the leaves of the `grad_norm/` tags.
GRAD_GROUP_TOTAL = "total"
GRAD_GROUP_BLOCK_PREFIX = "block_"


def grad_group_block(block: int | None) -> str:
    """``block_{i}`` for transformer block i, ``block_none`` for parameters outside the blocks."""
    return f"{GRAD_GROUP_BLOCK_PREFIX}{'none' if block is None else block}"


def grad_group_block_kind(block: int | None, kind: str) -> str:
    """``block_{i}/{kind}``: one block's parameters of one kind (``by`` "block_kind")."""
    return f"{grad_group_block(block)}/{kind}"


def grad_norm(group: str) -> str:
    """``grad_norm/{group}``: total, total_clipped, nonfinite_count, block_{i}, a parameter kind, ``param/{name}``."""
    return f"grad_norm/{group}"


GRAD_NORM = grad_norm(GRAD_GROUP_TOTAL)  # before clipping
GRAD_NORM_CLIPPED = grad_norm("total_clipped")
GRAD_NORM_NONFINITE = grad_norm("nonfinite_count")
GRAD_Q, GRAD_K = grad_norm("attn_q"), grad_norm("attn_k")  # the attention-logit parameters W_q, W_k
# The per-layer parameter groups (name -> the `grad_norm` kinds whose squares add up to the group's norm): W_q and
# W_k together (the attention-logit gradient), W_v, W_o and the MLP. The report fits each against T per layer; the
# fp64 check validates each per layer.
LAYER_GROUPS = {"W_q,W_k": ("attn_q", "attn_k"), "W_v": ("attn_v",), "W_o": ("attn_out",), "MLP": ("mlp",)}
GRAD_BLOCK_REGEX = "^" + re.escape(grad_norm(GRAD_GROUP_BLOCK_PREFIX)) + r"(\d+|none)$"  # group: the block
GRAD_BLOCK_KIND_REGEX = "^" + re.escape(grad_norm(GRAD_GROUP_BLOCK_PREFIX)) + r"(\d+)/(\w+)$"  # groups: block, kind


# ---- the run-level scalars that lead TensorBoard's Scalars / Time Series pages ---------------------------------
# TensorBoard groups tags by their first path component and sorts the groups by name, upper case before lower
# case, and opens the first two groups; so the few numbers a run is judged by are copied (same values, same steps)
# into `Summary/` (the first page: the answer, at most FIRST_PAGE_CARDS cards), `Summary_train/` (the other
# training-step copies, linear scales among them) and `Summary_val/` (the other validation-epoch copies), ahead of
# the per-layer detail in `attention/`, `grad_norm/` and `val/`. The monitors and the LightningModule write the copy
# beside the original.
SUMMARY_GROUP = "Summary"
SUMMARY_TRAIN_GROUP = "Summary_train"
SUMMARY_VAL_GROUP = "Summary_val"
FIRST_PAGE_CARDS = 6  # the most cards of the first group: one screen that answers the question


def _leading_tags() -> dict[str, str]:
    first = {TRAIN_LOSS: "loss", attention("normalized_entropy"): "entropy_over_log_n", MAX_LOGIT: "max_attention_logit"}
    train = {
        TRAIN_PPL: "perplexity",
        attention("entropy"): "entropy_layer_mean",
        jacobian("mean"): "attention_jacobian_layer_mean",
        SINK_RATE: "sink_rate",
        GRAD_NORM: "grad_norm_total",
        GRAD_Q: "grad_norm_W_q",
        GRAD_K: "grad_norm_W_k",
    }
    out = {tag: f"{SUMMARY_GROUP}/{name}" for tag, name in first.items()}
    out.update({tag: f"{SUMMARY_TRAIN_GROUP}/{name}" for tag, name in train.items()})
    val_tags = {VAL_LOSS: "loss", VAL_PPL: "perplexity"}
    val_tags.update({val(tag): name for tag, name in {**first, **train}.items() if tag.startswith("attention/")})
    out.update({tag: f"{SUMMARY_VAL_GROUP}/{name}" for tag, name in val_tags.items()})
    return out


LEADING = _leading_tags()
"""{tag as its monitor writes it: its copy in a leading group}; `leading_copies` applies it."""

# TensorBoard cannot set a log axis (nor a grouping) from the logs, and the positive quantities that T moves span
# decades (gradient norms from about 1 at T = 1 to 1e10 at T = 0.01; perplexity from tens to thousands): on a
# linear axis every run but the largest lies flat on 0. So these also get a log10 copy. TensorBoard sorts a group's
# charts by name, capitals first (as it sorts groups): "Log10_" puts these first in their group; on the first page
# the W_q/W_k gradient norm, then the validation perplexity.
LOG10_PREFIX = "Log10_"
_LOG10_NAMES = {
    GRAD_NORM: (SUMMARY_TRAIN_GROUP, "grad_norm"),
    TRAIN_PPL: (SUMMARY_TRAIN_GROUP, "perplexity"),
    jacobian("mean"): (SUMMARY_TRAIN_GROUP, "softmax_jacobian_layer_mean"),
    GRAD_K: (SUMMARY_TRAIN_GROUP, "wk_grad_norm"),
    GRAD_Q: (SUMMARY_TRAIN_GROUP, "wq_grad_norm"),
    VAL_PPL: (SUMMARY_GROUP, "perplexity_val"),
    val(jacobian("mean")): (SUMMARY_VAL_GROUP, "softmax_jacobian_layer_mean"),
}
LOG10_SOURCES = tuple(_LOG10_NAMES)


def log10_copy(tag: str) -> str:
    """``Summary_train/Log10_grad_norm``: the leading-group name of the log10 copy of ``tag`` (one of LOG10_SOURCES)."""
    group, name = _LOG10_NAMES[tag]
    return f"{group}/{LOG10_PREFIX}{name}"


LOG10 = {tag: log10_copy(tag) for tag in LOG10_SOURCES}
"""{tag as its monitor writes it: its log10 copy in a leading group}."""

# The attention-logit parameters' gradient over the whole network, sqrt(|g_Wq|^2 + |g_Wk|^2) (the report's "W_q,W_k"
# group, LAYER_GROUPS), on log10: the effect of T the study is about, first on the first page.
LOG10_GRAD_QK = f"{SUMMARY_GROUP}/{LOG10_PREFIX}grad_norm_W_qk"
GRAD_QK_PARTS = (GRAD_Q, GRAD_K)

FIRST_PAGE = (LOG10_GRAD_QK, LOG10[VAL_PPL], LEADING[attention("normalized_entropy")], LEADING[TRAIN_LOSS],
              LEADING[MAX_LOGIT])  # fmt: skip
"""The cards of the first page (`SUMMARY_GROUP`), in the order TensorBoard sorts them."""

VALIDATION_COPIES = frozenset(
    [copy for tag, copy in LEADING.items() if tag.startswith(VAL_PREFIX)]
    + [copy for tag, copy in LOG10.items() if tag.startswith(VAL_PREFIX)]
)
"""The leading-group copies of validation tags (wherever their group): logged at validation epochs only."""


def is_validation(tag: str) -> bool:
    """Whether ``tag`` is logged at validation epochs: a ``val/`` tag or a leading copy of one."""
    return tag.startswith(VAL_PREFIX) or tag in VALIDATION_COPIES


def _log10(value: float) -> float | None:
    """log10 of a positive value (inf stays inf: a diverged norm is shown as one); None for 0, negatives and NaN."""
    value = float(value)
    return math.log10(value) if value > 0 else None


def leading_copies(metrics: dict[str, float]) -> dict[str, float]:
    """The leading-group copies of those ``metrics`` that lead (none for the rest), with the log10 copies of those
    in LOG10 and the whole network's W_q/W_k norm on log10 where both parts are there (a non-positive or NaN value
    has no log10 copy at that step)."""
    out = {LEADING[tag]: value for tag, value in metrics.items() if tag in LEADING}
    for tag, value in metrics.items():
        if tag in LOG10 and (log := _log10(value)) is not None:
            out[LOG10[tag]] = log
    if all(tag in metrics for tag in GRAD_QK_PARTS):
        norm = math.hypot(*(float(metrics[tag]) for tag in GRAD_QK_PARTS))
        if (log := _log10(norm)) is not None:
            out[LOG10_GRAD_QK] = log
    return out


# ---- a sweep's TensorBoard additions, written when its runs are done (`study.sweep.shared_baseline`, `.seed_means`)
SHARED_BASELINE = "shared_baseline"  # Text: the step-0 validation copied from another run of the same setting
SEED_MEAN_RUN = "Mean_over_seeds"  # the folder of the per-T mean runs; a capital sorts it before the runs ("T...")
SEED_MEAN_PREFIX = "mean_over_seeds"  # their tags: lower case, so Time Series shows them after the runs' groups
SEED_MEAN_PARTS = ("mean", "low", "high")  # the mean over seeds and its band


def seed_mean_run(temperature_label: str) -> str:
    """``Mean_over_seeds/T0.1``: the run (a folder under the sweep) of the main arm's mean over seeds at one T."""
    return f"{SEED_MEAN_RUN}/{temperature_label}"


def seed_mean(tag: str, part: str) -> str:
    """``mean_over_seeds/Log10_grad_norm_W_qk/mean`` (``part`` "mean", "low" or "high"): a first-page card's mean over
    seeds, or an end of its band."""
    if part not in SEED_MEAN_PARTS:
        raise ValueError(f"part must be one of {SEED_MEAN_PARTS}, got {part!r}")
    return f"{SEED_MEAN_PREFIX}/{tag.split('/', 1)[1]}/{part}"


# Text: which runs a mean run averages and what its band is; "seed_means" sorts after "report" in the Text tab, where
# the report's plain-words summary leads
SEED_MEAN_TEXT = "seed_means/about"


# ---- NonFiniteGuard ---------------------------------------------------------------------------------------------
GUARD_SKIPPED = "guard/skipped_steps"
GUARD_GRAD_NORM = "guard/grad_norm_preclip"
GUARD_DIVERGED = "guard/diverged"  # 1 when the guard stopped the run, else 0: once, at the run's end


# ---- NormalizerParameterMonitor ---------------------------------------------------------------------------------
def normalizer(parameter: str) -> str:
    return f"normalizer/{parameter}"


# ---- study analyze --tensorboard -------------------------------------------------------------------------------
def analysis(quantity: str, axis: str, value: object) -> str:
    """``analysis/{quantity}/{axis}_{value}``: e.g. ``analysis/distance/L_256`` (step = layer),
    ``analysis/gradient/T_0.1``, ``analysis/critical_n/alpha_0.05`` (step = L)."""
    return f"analysis/{quantity}/{axis}_{value}"


# ---- study probe ------------------------------------------------------------------------------------------------
def probe(quantity: str) -> str:
    """``probe/{quantity}`` (loss, grad_norm/attn_qk, jacobian/p50, ...), one step per temperature."""
    return f"probe/{quantity}"


def probe_layer(layer: int, quantity: str) -> str:
    """``probe/layer_{l}/{quantity}``: T in every layer, one layer's gradient norm (attn_qk, attn_v, attn_out, mlp,
    residual), one step per temperature."""
    return probe(f"layer_{layer}/{quantity}")


def probe_single_layer(layer: int, quantity: str) -> str:
    """``probe/single_layer_{l}/{quantity}``: T lowered in layer l only (grad_attn_qk, loss, jacobian/p50, ...)."""
    return probe(f"single_layer_{layer}/{quantity}")


# ---- study report: the report in TensorBoard (Text and Images tabs of the run "report" under the sweep) --------
REPORT_RUN = "report"  # the folder under the sweep that `study report` writes (report.md, figures, their events)
REPORT_SUMMARY = "report/in_plain_words"  # Text: the plain-language summary that opens report.md
REPORT_SCORECARD = "report/scorecard"  # Text: the scorecard table


def report_figure(name: str) -> str:
    """``report/figure/{name}``: one of the report's figures (its file name without .png) as an image."""
    return f"report/figure/{name}"


# ---- the fp64 check of step-0 gradients (Fp64GradientCheck) -----------------------------------------------------
def fp64_ratio(group: str) -> str:
    """``fp64_check/{group}``: fp32 / fp64 of a gradient norm at step 0, the same batch and weights in both."""
    return f"fp64_check/{group}"


FP64_RATIO_QK = fp64_ratio("attn_qk")  # sqrt(|g_Wq|^2 + |g_Wk|^2) over every layer
FP64_RATIO_LAST_QK = fp64_ratio("last_block/attn_qk")  # the same for the last layer alone
FP64_RATIO_LAYERS_WORST = fp64_ratio("layers/worst")  # per layer and group (W_q/W_k, W_v, W_o, MLP): furthest from 1


def fp64_grad_norm(group: str) -> str:
    """``fp64_check/grad_norm/{group}``: the float64 gradient norm at step 0 of a `grad_norm` group (a kind, or
    ``block_{i}/{kind}``), the reference the report fits its step-0 gradient slopes on."""
    return fp64_ratio(grad_norm(group))


FP64_GRAD_BLOCK_KIND_REGEX = "^" + re.escape(fp64_grad_norm(GRAD_GROUP_BLOCK_PREFIX)) + r"(\d+)/(\w+)$"  # block, kind
