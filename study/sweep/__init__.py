"""`study sweep`: a grid of `study fit` runs (over the axes of `study.sweep.axes`) with resume and a report.

    study sweep --config configs/sweeps/default.yaml            # the embedded main job (CPU; its time: README)
    study sweep --config configs/sweeps/default.yaml --quick    # its smoke version (the small GPT-2 pipeline)
    study sweep --config X --dry-run                            # validate and print the plan, run nothing
    study sweep --config X --parallel 4 [--devices-per-run 2]   # subprocesses, each pinned to its GPUs
    study sweep --config X --trainer.devices=2 --trainer.strategy=ddp   # each run on 2 devices (DDP)
    study sweep --config X --run-index 7                        # one run of the plan (SLURM / torchrun arrays)
    study sweep --config X --run-index pretrain                 # the shared pretraining run

Layout under `<save_dir>/<name>/` (name = the YAML's `name`, `-quick` appended with --quick):

    plan.json                    every run, its parameters, its `study fit` arguments and resolved settings
    pretrain/                    the pretraining run (if the sweep has one); pretrain/hf = save_pretrained model
    T0.1_k4_softmax_s0/          one run: TensorBoard events, config.yaml, hparams, checkpoints/, status.json, run.lock
    probe/probe.json             `study probe` on the frozen model (the spec's `probe:` section; + figure, events)
    analyze/results.json         `study analyze` on the frozen model (the spec's `analyze:` section; + figures)
    probe.lock, analyze.lock     who runs those two steps (with --parallel they run beside the runs, first)
    probe.log, analyze.log       their output (outside their folders: the probe swaps its folder in whole)
    report/report.md             `study report` output (figures beside it)

A run's `status.json` says running / finished / failed / diverged, with the reason. Rerunning the sweep skips
finished and diverged runs and resumes the others from their last readable checkpoint (same batches, steps after
the checkpoint purged from TensorBoard). Several processes may share one sweep: each run is trained by whoever
holds its `run.lock` (`study.sweep.lock`); see docs/robustness.md. Extra `--trainer.*`,
`--model.*`, `--data.*` arguments are passed to every run (they are part of its settings).

Spec format: see `configs/sweeps/default.yaml` (every key commented) and `study.sweep.config`.
"""

from study.sweep.command import main
from study.sweep.config import SweepConfigError, build_plan

__all__ = ["SweepConfigError", "build_plan", "main"]
