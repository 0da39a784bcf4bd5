"""What a person sees when a sweep runs: a header, one line per stage or run, a closing line; the rest in log files."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tensorboard.plugins.hparams.metadata import SESSION_START_INFO_TAG

from study import tags
from study.report.read import read_scalars
from study.sweep import main
from tests.test_sweep import ROOT, env, write_spec

# Subprocesses and whole sweeps: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow


def test_console_is_a_header_one_line_per_run_and_a_closing_line(tmp_path):
    spec = write_spec(
        tmp_path,
        {"temperature": [0.1, 1.0]},
        {"trainer.max_steps": 2, "trainer.val_check_interval": 2},
        pretrain={"overrides": {"trainer.max_steps": 2, "trainer.val_check_interval": 2, "model.warmup_steps": 1}},
        probe={"temperatures": [0.1, 1.0], "windows": 2, "seq_len": 16, "jacobian_rows": 8, "hessian_iterations": 2,
               "single_layers": [0]},
        analyze={"windows": 3, "max_length": 16, "temperatures": [0.01, 0.03, 0.05, 1.0], "epsilons": [0.001],
                 "mc_samples": 0, "figures": False},
        report=True,
    )
    done = subprocess.run([sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--no-estimate"],
                          env=env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    sweep = tmp_path / "logs" / "tiny"
    patterns = [
        r"study sweep tiny: 2 runs \(0 already done\), pretraining first -> .*",
        r"pretrain: finished in \d+:\d\d \(.*pretrain\)",
        r"\[1/2\] T0\.1_kall_softmax_s0: finished in .* \| ETA \d+:\d\d",
        r"\[2/2\] T1_kall_softmax_s0: finished in .*",
        r"probe: finished in \d+:\d\d \(.*probe\.json\)",
        r"analyze: finished in \d+:\d\d \(.*analyze/results\.json\)",
        r"study sweep tiny: 2 finished in \d+:\d\d; report: .*report\.md; TensorBoard: study tensorboard .*tiny",
    ]
    assert len(lines) == len(patterns), done.stdout
    for line, pattern in zip(lines, patterns):
        assert re.fullmatch(pattern, line), (line, pattern)
    # Library notices are silenced at their source; what each stage printed is in its log file, not lost.
    assert "Loading weights" not in done.stdout + done.stderr and "litlogger" not in done.stdout + done.stderr
    assert "T=0.1" in (sweep / "probe.log").read_text()
    assert "3 x 16 tokens" in (sweep / "analyze.log").read_text()
    report = (sweep / "report" / "report.md").read_text()
    assert "3. critical N* ~ 0.06 L (frozen" in report and "1. Lemma 1 (frozen" in report
    assert (sweep / "pretrain" / "sweep.log").stat().st_size > 0


def test_pretraining_curves_are_drawn_apart_from_the_fine_tuning_runs(tmp_path):
    """The pretraining run logs under Lightning's logger prefix (`pretrain-train/loss`): TensorBoard gives it its
    own charts, so the fine-tuning runs (steps from 0) are not squashed against its longer step axis."""
    spec = write_spec(
        tmp_path, {"seed": [0]}, {"trainer.max_steps": 2, "trainer.val_check_interval": 2},
        pretrain={"overrides": {"trainer.max_steps": 4, "trainer.val_check_interval": 4, "trainer.log_every_n_steps": 1,
                               "model.warmup_steps": 1}},
    )
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    sweep = tmp_path / "logs" / "tiny"
    base, run = read_scalars(sweep / "pretrain"), read_scalars(sweep / "T1_kall_softmax_s0")
    assert [s for s, _ in base[tags.pretrain(tags.TRAIN_LOSS)]] == [0, 1, 2, 3] and tags.TRAIN_LOSS not in base
    assert [s for s, _ in run["train/loss"]] == [0, 1] and not any(t.startswith("pretrain") for t in run)
    # Nor is it a row of the sweep's HParams table: the base of the settings, not one of them.
    assert SESSION_START_INFO_TAG not in summary_tags(sweep / "pretrain")
    assert SESSION_START_INFO_TAG in summary_tags(sweep / "T1_kall_softmax_s0")


def summary_tags(folder):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return {v.tag for f in folder.glob("events.out.tfevents.*") for e in EventFileLoader(str(f)).Load() for v in e.summary.value}


def test_a_diverged_run_reads_one_step_number():
    """The guard's reason names the step of the event; the run's step count beside it read as a second event."""
    from study.sweep.config import Run
    from study.sweep.pool import SweepProgress

    progress = SweepProgress(2, 1, None)
    run = Run(0, "T0.01_kall_softmax_s1_lr100_sgd", None, {}, [], {})
    status = {"state": "diverged", "duration_s": 24.6, "global_step": 4,
              "reason": "non-finite gradient norm (inf) at step 3"}  # fmt: skip
    line = progress.update(run, status)
    assert "at step 3" in line and "step 4" not in line
    finished = progress.update(run, {"state": "finished", "duration_s": 1.0, "global_step": 10})
    assert "(step 10" in finished


def test_the_eta_is_the_runs_slot_time_not_the_sweeps_elapsed_time():
    """A run's own duration leaves out its process's start-up and the slots' contention (half the wait, measured);
    the sweep's elapsed time includes the frozen-model steps and the estimate that held slots before any run ended
    (a demo read "ETA 56:05" after two runs, 14 minutes before its end). The rate is the runs' slot time."""
    import time

    from study.sweep.config import Run
    from study.sweep.pool import SweepProgress

    progress = SweepProgress(6, 2, estimate_s=60.0)
    assert progress.eta() == 60.0  # nothing ended: the up-front estimate
    run = Run(0, "T1_s0", None, {}, [], {})
    progress.start = time.perf_counter() - 300.0  # 300 s of wall clock so far (the probe and the analysis first)
    progress.update(run, {"state": "finished", "duration_s": 10.0}, slot_s=16.0)
    assert progress.eta() == 16.0 * 5 / 2  # its slot time, not its duration, per slot
    progress.update(run, {"state": "finished", "duration_s": 12.0}, slot_s=20.0)
    assert progress.eta() == 18.0 * 4 / 2  # not 300 s / 2 runs x 4 left
    progress.update(run, {"state": "finished", "duration_s": 7.0})  # a run in this process: its own duration
    assert progress.eta() == (16.0 + 20.0 + 7.0) / 3 * 3 / 2
    progress.update(run, {"state": "finished", "duration_s": 99.0}, skipped=True)  # done before: no rate
    assert progress.eta() == (16.0 + 20.0 + 7.0) / 3 * 2 / 2


def test_the_estimate_reads_a_fresh_processs_start_up_and_leaves_it_out_when_the_probe_fails():
    import subprocess
    import sys

    from study.sweep.estimate import startup_seconds

    ok = subprocess.Popen([sys.executable, "-c", "print(2.5)"], stdout=subprocess.PIPE, text=True)
    assert startup_seconds(ok) == 2.5
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdout=subprocess.PIPE, text=True)
    assert startup_seconds(failed) == 0.0
    garbled = subprocess.Popen([sys.executable, "-c", "print('no number')"], stdout=subprocess.PIPE, text=True)
    assert startup_seconds(garbled) == 0.0
