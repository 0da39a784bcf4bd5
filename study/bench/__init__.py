"""`study bench`: training-step time and peak memory of each attention path, with and without monitors.

    study bench [--quick] [--quiet] [--out DIR] [--models small,gpt2-vocab,smollm2] [--peak-flops 989e12] [--parity]
    study bench --gpu-suite       the prepared GPU command (GPT-2 124M at L = 512, 1024, 2048; parity; MFU)
    study bench --lengths 512,1024,2048,4096,8192   the length sweep alone (`lengths`): memory and time of
                                  stock SDPA, the dense and the blockwise explicit path on SmolLM2's shape
    study bench --interception    the SDPA interception's own cost (`interception`): LitGPT unpatched vs
                                  intercepted at T = 1, an unlogged step, in one process
    python scripts/bench.py ...   (the same)

Modules: `command` (arguments, then dispatch), `shapes` (what is measured), `timing` (interleaved Lightning
steps, timed by `study.callbacks.steptime` as the sweep's estimate is), `memory` (peak of one step), `parity`
(every path against stock), `lengths` (the length sweep: memory and time against L), `interception` (the
SDPA interception's overhead), `budgets` (ratios and verdicts), `suite` (all of it), `markdown` (the tables).

What is measured, in ONE process:

- Step time of a REAL Lightning training step (`CausalLMModule.training_step` + backward + gradient clipping + AdamW
  step + the callbacks' hooks), from ``on_train_batch_start`` (first callback) to ``on_train_batch_end`` (last
  callback). Data loading is not timed. Each variant runs its own `Trainer.fit` in its own thread, but only one
  thread runs at a time: a baton passes round-robin after every ``chunk`` steps, so variants are INTERLEAVED
  (drift and noise from other jobs on the machine hit every variant alike). Time per variant = median over the
  timed steps after ``warmup`` steps.
- Monitors logging every N steps: their tap opens on steps with ``global_step % N == 0``. The amortised step time
  is ``((N - 1) * median(non-logging steps) + median(logging steps)) / N``; when the run is too short to hold a
  timed logging step of that variant, the logging-step median of the every-step variant (same monitors, same
  work) stands in (the JSON says which).
- Peak memory, in a separate pass after the timing (so profiling never slows the timed steps): on a GPU,
  ``torch.cuda.max_memory_allocated`` over one steady-state step (third step, AdamW state allocated). On a CPU,
  torch has no allocator statistics and tracemalloc / RSS do not see torch's allocations reliably; we run one
  steady-state step under ``torch.profiler`` with ``profile_memory=True`` and take the peak of the running sum of
  its allocation/free events (the most tensor memory live at once during the step, above what was live before
  it), plus the bytes that live across steps (parameters, buffers, AdamW state). Monitor variants are profiled on
  a logging step (their peak).
- Analysis speed: `study.frozen.analysis.protocol.benchmark_against_oracle` (vectorised Theorem-1 statistics vs the per-row
  loop oracle), repeated, median.
- On a GPU also tokens/s (always reported) and model FLOPs utilisation: ``6 * params * tokens/s / peak_flops``
  (all parameters, embeddings included; attention's own L^2 FLOPs are left out, as in the usual 6ND estimate).
  ``--peak-flops`` defaults to 989e12, the dense bf16 peak of an H100/H200 SXM.

Budgets (CPU, ratios on the same model): temperature only <= 1.03 x stock SDPA; top-k <= 1.3 x stock eager;
monitors every 50 steps <= 1.05 x no monitors; every step <= 1.5 x; peak memory with monitors <= 1.1 x.
The result is written as ``bench.json`` and ``bench.md`` in ``--out``.

Progress (`study.progress`; ``--quiet`` turns it off): a bar with the time left on a terminal, else one line per
timing round (interleaved shapes) or per variant's fit (one-at-a-time shapes), and per variant's memory pass.
"""

from study.bench.budgets import BUDGETS, budgets
from study.bench.command import main, parse_args, settings_from_args
from study.bench.markdown import to_markdown, write
from study.bench.parity import check_parity
from study.bench.shapes import GPU_SUITE, SHAPES, Settings, Shape, Variant, variants
from study.bench.suite import machine, run_benchmark

__all__ = [
    "BUDGETS",
    "GPU_SUITE",
    "SHAPES",
    "Settings",
    "Shape",
    "Variant",
    "budgets",
    "check_parity",
    "machine",
    "main",
    "parse_args",
    "run_benchmark",
    "settings_from_args",
    "to_markdown",
    "variants",
    "write",
]
