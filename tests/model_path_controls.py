"""Helpers of the controls through the real model path (tests/test_controls_model_path.py).

study/report/controls.py plants numbers after the model (event series, per-head d and E); these controls run the
model itself: `study sweep` (in process, so a test can plant a bug in the attention code) trains tiny models, and the
report's own readers (`load_sweep`, `summarize`) and finding functions judge what the event files hold.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from study import tags
from study.report import findings as F
from study.report.read import load_sweep
from study.report.stats import Family, simultaneous
from study.report.summary import Summary, summarize
from study.sweep import main as sweep_main
from tests.test_sweep import ROOT, write_spec

# ---- control 1: a one-layer model whose W_q/W_k gradient goes like 1/T in closed form --------------------------
#
# One attention layer, logits z_ij = l_ij / T with l_ij = q_i.k_j / sqrt(d), a_i = softmax(z_i). With g_ij = dL/da_ij,
#     dL/dq_i = (1/T) sum_j a_ij (g_ij - sum_k a_ik g_ik) k_j / sqrt(d)        (and alike for k_j),
# and grad W_q = sum_i x_i (dL/dq_i)^T. When every row is far from saturation (|z_ij| << 1), a_i = u_i + O(|z|),
# u_i uniform over the visible keys, and the forward pass (so g, x, k) is T-independent up to the same O(|z|):
#     |grad W_q, W_k| = |G_0| / T x (1 + O(max |z|)),
# with G_0 the gradient of the uniform-attention model, the same at every T. The log-log slope against T is then
# -1 + O(|z| at the smallest T). The O(|z|) term of the gradient is linear in the logits, which have mean about 0
# and random signs, so in the norm it enters mostly at second order: |slope + 1| of about std(z)^2 at the smallest
# T. GPT-2's init (std 0.02) on an 8-wide layer of one head gives logits l about 4x smaller than on a 32-wide one
# (q.k / sqrt(d) scales like std^2 sqrt(d)): small enough that the temperatures are the paper's regime, T <= 0.1,
# three levels of it, where the report judges the last-layer row; the test reads max |z| and std(z) at the
# smallest T from AttentionLogitMonitor and requires max |z| < 1, std(z) < 0.2. The interval over seeds (unpaired:
# each seed is another initialisation) is judged by the report's own band rule (-1 +- 0.25) at its Bonferroni level.
# "T applied twice" makes the logits l / T^2: at these T the rows leave the linear regime, and the slope with them.

TEMPERATURES = (0.03, 0.05, 0.1)
SEEDS = (0, 1, 2)
SLOPE_TOLERANCE = 0.02  # |point slope + 1|: about std(z)^2 at the smallest T
MAX_SCALED_LOGIT = 1.0  # the regime: every logged |l / T| below this at step 0
MAX_LOGIT_STD = 0.2  # and the spread of l / T over a row's keys below this

ONE_LAYER = {
    "model.n_layer": 1,
    "model.n_head": 1,
    "model.n_embd": 8,
    "model.learning_rate": 1.0e-6,  # two steps barely move the weights: the logged gradients are the init's
    "model.warmup_steps": 1,
    "data.block_size": 64,
    "data.batch_size": 8,
    "trainer.max_steps": 2,
    "trainer.val_check_interval": 2,
    "trainer.callbacks.GradientNormMonitor.every_n_steps": 1,
    "trainer.callbacks.AttentionJacobianMonitor.every_n_steps": 1,
}
LOGITS = [{"class_path": "study.callbacks.AttentionLogitMonitor", "init_args": {"every_n_steps": 1}}]


def run_sweep(tmp_path: Path, grid: dict, overrides: dict, **extra) -> list[Summary]:
    """`study sweep` in this process (no --parallel: a bug planted by the test reaches the runs), then the report's
    own readers: one `Summary` per run."""
    spec = write_spec(tmp_path, grid, overrides, checkpoint={"enabled": False}, **extra)
    assert sweep_main(["--config", str(spec), "--no-estimate"]) == 0
    _, runs = load_sweep(tmp_path / "logs" / "tiny", problems := [])
    assert not problems, problems
    return [summarize(run) for run in runs]


def one_layer_sweep(tmp_path: Path) -> list[Summary]:
    return run_sweep(tmp_path, {"temperature": list(TEMPERATURES), "seed": list(SEEDS)}, ONE_LAYER, callbacks=LOGITS)


def step0_logits(summaries: list[Summary], temperature: float) -> tuple[float, float]:
    """(largest |l / T|, largest standard deviation of l / T over a row's visible keys) that the logit monitor saw
    at step 0 over the runs at ``temperature``."""
    out = []
    for tag in (tags.MAX_LOGIT, tags.attention_spread("logit_std", "max")):
        values = [v for s in summaries if s.temperature == temperature for step, v in s.series(tag) or []
                  if step == 0]
        assert values, f"no {tag} logged at T={temperature}"
        out.append(max(abs(v) for v in values))
    return out[0], out[1]


def geometric_slope(summaries: list[Summary], value) -> float:
    """Log-log slope of the per-T geometric mean of ``value(summary)`` (the point estimate the band finding fits)."""
    levels = F.per_t(summaries, value)
    return F._geometric_slope(levels)


def qk_slope_control(summaries: list[Summary]) -> dict:
    """The report's findings judged as the report judges them (one Bonferroni family: `simultaneous`), and the
    last-layer and whole-network 1/T rows with their point slopes."""
    found, family = simultaneous(lambda: F.findings(summaries))
    last = next(f for f in found if f.claim.startswith("5. the last layer's W_q/W_k gradient"))
    whole = next(f for f in found if f.claim.startswith("5. (whole network"))
    return {
        "family": family,
        "last": last,
        "whole": whole,
        "slope_last": geometric_slope(summaries, lambda s: s.layer_grads.get("W_q,W_k", {}).get(0)),
        "slope_whole": geometric_slope(summaries, lambda s: s.values.get("grad_qk")),
    }


def plant_t_twice(monkeypatch) -> list[int]:
    """Plant "T applied twice" in the fused path (`study.attention.core._fused`, the one training runs for stock
    softmax): its scale becomes scaling / T^2. Returns a list that counts the calls, so that a test can check the
    bug was reached."""
    from study.attention import core

    original, calls = core._fused, []

    def twice(query, key, value, visible, bias, sinks, plain_causal, scale, temperature, dropout):
        calls.append(1)
        return original(query, key, value, visible, bias, sinks, plain_causal, scale / temperature, temperature,
                        dropout)

    monkeypatch.setattr(core, "_fused", twice)
    return calls


def force_explicit_path(monkeypatch) -> list[int]:
    """Make every attention call of this process take the explicit path (as with a tap open that takes no fused
    output), training steps included. Returns a list that counts the fused kernel's calls (to check there are none)."""
    from study.attention import core, tap

    original, fused_calls = core._fused, []

    def counted(*args, **kwargs):
        fused_calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tap, "fused_output_allowed", lambda: False)
    monkeypatch.setattr(core, "_fused", counted)
    return fused_calls


# ---- control 2: the fused and explicit attention paths in float64 ------------------------------------------------
class ExplicitPath:
    """A tap that takes no fused output and accepts row blocks: while it is open, `attend` computes the output
    on the explicit path (dense, or blockwise under `blockwise_settings`)."""

    row_blocks = True

    def observe(self, layer, weights, allowed, spec) -> None:
        pass


def path_gradients(model: torch.nn.Module, ids: torch.Tensor, path: str) -> dict[str, torch.Tensor]:
    """{parameter name: gradient} of the language-model loss of ``ids`` through one attention path: "fused"
    (SDPA), "dense" (the explicit scores) or "blockwise" (the explicit path a few query rows at a time)."""
    from contextlib import nullcontext

    from study.attention import blockwise, tap

    model.zero_grad(set_to_none=True)
    opened = nullcontext() if path == "fused" else tap.tapping(ExplicitPath())
    blocks = blockwise.blockwise_settings(min_scores=1, block_scores=64) if path == "blockwise" else nullcontext()
    with opened, blocks:
        model(input_ids=ids, labels=ids).loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def path_discrepancy(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict]:
    """(the largest relative difference of any parameter's gradient between the fused path and the dense or the
    blockwise one, {path: its grouped gradient norms}), all in float64; the model is float32 again afterwards."""
    from study.metrics.gradients import grouped_grad_norms

    model.double()
    try:
        grads, norms = {}, {}
        for path in ("fused", "dense", "blockwise"):
            grads[path] = path_gradients(model, ids, path)
            norms[path] = {k: float(v) for k, v in
                           grouped_grad_norms(model.named_parameters(), by=("kind", "block_kind")).items()}
    finally:
        model.float()
    assert grads["fused"].keys() == grads["dense"].keys() == grads["blockwise"].keys()
    worst = 0.0
    for path in ("dense", "blockwise"):
        for key, g in grads["fused"].items():
            worst = max(worst, float((g - grads[path][key]).norm()) / (float(g.norm()) or 1.0))
    return worst, {**norms, "fused_grads": grads["fused"]}


def plant_t_twice_explicit(monkeypatch) -> list[int]:
    """Plant "T applied twice" in the explicit path (`study.attention.core._normalize` gets scores / T again)."""
    from study.attention import core

    original, calls = core._normalize, []

    def twice(scores, allowed, spec, normalizer, sinks):
        calls.append(1)
        return original(scores / spec.temperature, allowed, spec, normalizer, sinks)

    monkeypatch.setattr(core, "_normalize", twice)
    return calls


# ---- control 3: the learning-rate control for lrcurves ----------------------------------------------------------
SCRATCH = ROOT / "configs" / "sweeps" / "scratch.yaml"
STABLE_LRS = (0.001, 0.003)
DIVERGING_LR = 1000.0  # AdamW moves every weight by about lr x sign(gradient): 1000 per step


def lr_control_spec(tmp_path: Path) -> Path:
    """scratch.yaml's --quick version (its overrides, monitors, guard and z-loss, by `extends`) on a grid of two
    learning rates that train and one that certainly does not, at T = 1, one seed, no arms."""
    quick = yaml.safe_load(SCRATCH.read_text())["quick"]
    overrides = {**quick["overrides"], "data.cache_dir": str(ROOT / "logs" / "cache")}
    spec = {
        "extends": str(SCRATCH),
        "name": "lr-control",
        "save_dir": str(tmp_path / "logs"),
        "arms": [],
        "report": False,
        "quick": {"description": "the learning-rate control", "overrides": overrides,
                  "grid": {"temperature": [1.0], "learning_rate": [*STABLE_LRS, DIVERGING_LR], "seed": [0]}},
    }
    path = tmp_path / "lr-control.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def lr_control_summaries(tmp_path: Path) -> list[Summary]:
    spec = lr_control_spec(tmp_path)
    assert sweep_main(["--config", str(spec), "--quick", "--no-estimate"]) == 0
    _, runs = load_sweep(tmp_path / "logs" / "lr-control-quick", problems := [])
    assert not problems, problems
    return [summarize(run) for run in runs]


# ---- control 4: N* on a smooth d/E curve --------------------------------------------------------------------------
N_LAYERS, N_HEADS = 6, 9  # 54 heads; `head_subsets(6)` pools 9, 18, 18, 27 and 54 of them
WINDOWS = 6
LENGTHS = (64, 128)
CRITICAL_NS = tuple(range(1, 129))  # every N: N* is read off no coarse grid
E_SPREAD = 0.3  # log-normal spread of E over heads
WINDOW_NOISE = 0.05  # per window and head, d's own noise (log-normal)


def smooth_ratio(x: float) -> float:
    """The planted effect d/E against N/L: smooth, no step, and slowly fading (as the frozen GPT-2's, whose d/E is
    8.5 at N/L = 0.06 and 1.48 at 0.57): 1.83 at N/L = 0.06, 1.25 at 0.2, 1.1 at 0.5, 1.05 at 1."""
    return 1.0 + 0.05 / x


def smooth_distances() -> list[dict]:
    """Per layer, the d and E blocks of Algorithm 3's per-layer step ((nL, G, H) pooled over windows and (B, nL, G,
    H) per window), as study/frozen/analysis/critical.py's `_layer` returns them: E per head log-normal (drawn once
    per head), d = E x smooth_ratio(N/L) x a small per-window noise."""
    gen = torch.Generator().manual_seed(0)
    heads = N_LAYERS * N_HEADS
    e_head = torch.exp(E_SPREAD * torch.randn(heads, generator=gen, dtype=torch.float64))
    shape = (WINDOWS, len(LENGTHS), len(CRITICAL_NS), heads)
    e = e_head.expand(shape).clone()
    ratio = torch.tensor([[smooth_ratio(n / length) for n in CRITICAL_NS] for length in LENGTHS], dtype=torch.float64)
    noise = torch.exp(WINDOW_NOISE * torch.randn(WINDOWS, 1, 1, heads, generator=gen, dtype=torch.float64))
    d = e * ratio[None, :, :, None] * noise
    layers = []
    for layer in range(N_LAYERS):
        part = slice(layer * N_HEADS, (layer + 1) * N_HEADS)
        dw, ew = d[..., part], e[..., part]
        layers.append({"d": dw.mean(0), "e": ew.mean(0), "d_windows": dw, "e_windows": ew})
    return layers


def smooth_results() -> dict:
    """results.json's Algorithm 3 blocks for `smooth_distances`, written by the frozen analysis's own results step."""
    from study.frozen.analysis.critical import CRITICAL
    from study.frozen.analysis.grids import Grids
    from study.frozen.analysis.registration import Settings
    from study.report.frozen import ALPHA

    grids = Grids(lengths=list(LENGTHS), n_fixed=1, ns=[], distance_ns=[], critical_ns=list(CRITICAL_NS),
                  separability_ns=[], temperatures=[1.0], epsilons=[1e-3],
                  spectral_rows=torch.arange(1, max(LENGTHS)))  # fmt: skip
    settings = Settings(grids=grids, mc_samples=0, seed=0, alphas=[ALPHA])
    return {**CRITICAL.results(settings, smooth_distances()), "choices": {"alphas": [ALPHA]},
            "model": {"layers": N_LAYERS, "heads": N_HEADS}, "source": {"model": "planted smooth d/E"}}


def family_of(size: int) -> Family:
    return Family(size)
