"""A run's identity holds what it trained from and under which spec (issue 52, N2, N3, N4, N13): the pretrained
model's content, one spec per sweep name, the run folders on disk as their own records name them, and the spec
file as the sweep started with it. Each case is planted and shown refused, named or recovered."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from study.cachefolder import (
    build_atomically,
    content_digest,
    folder_file_hashes,
    folder_problem,
    verified_digest,
)
from study.provenance import model_folder_digest
from study.report.origin import MixedModels, check, origin
from study.report.read import RunData, load_sweep
from study.sweep import main, spec_identity
from study.sweep.config import build_plan
from study.sweep.source import SourceChanged, SourceWatch
from tests.test_sweep import ROOT, env, status, write_spec


# ---- N2: the pretrained model is part of every run's identity --------------------------------------------------
def _model(folder: Path, weights: bytes) -> Path:
    def save(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(weights)

    build_atomically(save, folder)
    return folder


def _zero_in_place(path: Path, offset: int, count: int) -> None:
    """Zero ``count`` bytes at ``offset`` and restore the file's size and modification time."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(count))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


def test_zeroed_blocks_with_size_and_mtime_restored_are_caught_by_the_whole_read(tmp_path):
    hf = _model(tmp_path / "hf", bytes(range(1, 256)) * 4096)
    digest, problem = verified_digest(hf)
    assert problem is None and digest == model_folder_digest(hf)  # the run's record and the sweep's read agree
    assert digest == content_digest(folder_file_hashes(hf))
    _zero_in_place(hf / "model.safetensors", 4096, 4096)
    assert folder_problem(hf) is None  # the cheap check (size, mtime) sees nothing
    digest, problem = verified_digest(hf)
    assert digest is None and problem == "model.safetensors changed since it was built (SHA-256 differs)"


def test_the_content_digest_follows_names_and_bytes_not_times(tmp_path):
    a = _model(tmp_path / "a", b"\x01" * 1000)
    b = _model(tmp_path / "b", b"\x01" * 1000)
    os.utime(b / "model.safetensors", ns=(1, 1))
    assert model_folder_digest(a) == model_folder_digest(b)
    c = _model(tmp_path / "c", b"\x01" * 999 + b"\x02")
    assert model_folder_digest(c) != model_folder_digest(a)
    (b / "model.safetensors").rename(b / "other.safetensors")
    assert model_folder_digest(b) != model_folder_digest(a)


def _pretrain_spec(tmp_path, seeds, steps=2):
    return write_spec(tmp_path, {"temperature": [1.0], "seed": seeds}, {"trainer.max_steps": 2,
                      "trainer.val_check_interval": 2},
                      pretrain={"overrides": {"trainer.max_steps": steps, "trainer.val_check_interval": steps,
                                                "model.warmup_steps": 1}})


@pytest.mark.slow  # builds two plans with a pretraining run: 5-20 s on the 2-core machine
def test_a_run_of_another_pretrained_model_is_refused_naming_both_digests(tmp_path):
    """The run on disk recorded the model it trained from; the sweep's pretrain/ was rebuilt since (another
    model under the same path): the sweep refuses to go on, naming both content digests."""
    from study.sweep.command import _check_pretrained
    from study.sweep.run import write_settings

    plan = build_plan(_pretrain_spec(tmp_path, [0, 1]))
    hf = _model(plan.pretrain.dir / "hf", b"\x05" * 4096)
    run = plan.runs[0]
    run.depends = {**run.depends, f"model {hf}": "content 0123456789abcdef"}  # what the old model gave
    run.dir.mkdir(parents=True)
    write_settings(run)
    plan = build_plan(_pretrain_spec(tmp_path, [0, 1]))
    refused = _check_pretrained(plan)
    assert refused == (f"run {run.name} was trained with other inputs than this sweep would use now: model {hf} "
                       f"changed (content 0123456789abcdef -> {model_folder_digest(hf)}). Restore them, or delete "
                       f"{run.dir} (and any other such run) to redo it, or give the sweep another name; runs made "
                       "with different inputs are never pooled")
    # the zeroed model itself is refused before the comparison, by name
    _zero_in_place(hf / "model.safetensors", 0, 512)
    assert _check_pretrained(plan).startswith(f"the sweep's pretrained model {hf} is damaged (model.safetensors "
                                              "changed since it was built")


def _finished(name: str, model: str, digest: str) -> RunData:
    status = {"state": "finished", "depends": {f"model {model}": digest, "base config b.yaml": "sha256 1"}}
    return RunData(name, Path(name), {}, status, {})


def test_the_report_never_pools_runs_of_two_models_even_when_mixed_sources_are_allowed():
    runs = [_finished("s0", "/x/pretrain/hf", "content aaaa"), _finished("s1", "/x/pretrain/hf", "content bbbb"),
            _finished("s2", "/x/pretrain/hf", "content bbbb")]
    found = origin(runs)
    for allow in (False, True):
        with pytest.raises(MixedModels) as refused:
            check(found, allow_mixed=allow)
        assert str(refused.value).startswith(
            "the runs trained from 2 models (model /x/pretrain/hf: content aaaa (1 run), model /x/pretrain/hf: "
            "content bbbb (2 runs))")
    check(origin(runs[1:]), allow_mixed=False)  # one model: pooled
    # a run recorded before runs recorded their model's content is unrecorded, not a second model
    check(origin([*runs[1:], RunData("old", Path("old"), {}, {"state": "finished"}, {})]), allow_mixed=False)


def test_the_probe_cache_is_keyed_on_the_model_digest(tmp_path):
    """A probe.json of the same arguments but another model under the same path is not "cached"."""
    from study.sweep.frozen_steps import MODEL_DIGEST, FrozenStep

    hf = _model(tmp_path / "pretrain" / "hf", b"\x07" * 2048)
    out = tmp_path / "probe"
    argv = ["--model", str(hf), "--out", str(out)]
    step = FrozenStep("probe", "the probe", "study.frozen.probe.command", argv, out / "probe.json",
                      lambda result: result.get("argv"), log=out / "probe.log", lock_dir=tmp_path)
    out.mkdir()
    (out / "probe.json").write_text(json.dumps({"argv": argv}))
    assert not step.cached()  # no record of the model it read: redone
    step.say_done(0, 1.0, step.model_digest())
    assert json.loads((out / MODEL_DIGEST).read_text()) == {"digest": model_folder_digest(hf)} and step.cached()
    (hf / "model.safetensors").write_bytes(b"\x08" * 2048)  # pretrain/ redone: another model under the same path
    assert not step.cached()


@pytest.mark.slow
def test_pretraining_redone_with_other_settings_then_a_seed_added_is_refused(tmp_path, capsys):
    """Issue 52 N2: pretrain/ deleted (as the damage message says) and redone with other settings, the spec lock
    deleted too, then a seed added: the old seed was trained from the old model, so the sweep stops after the
    pretraining with both digests and the new seed is never trained."""
    import shutil

    assert main(["--config", str(_pretrain_spec(tmp_path, [0])), "--no-estimate"]) == 0
    sweep = tmp_path / "logs" / "tiny"
    hf = sweep / "pretrain" / "hf"
    old = status(sweep / "T1_kall_softmax_s0")["depends"][f"model {hf}"]
    assert old == model_folder_digest(hf) and old.startswith("content ")
    shutil.rmtree(sweep / "pretrain")
    for lock in sweep.glob("spec.*.lock"):
        lock.unlink()
    capsys.readouterr()
    assert main(["--config", str(_pretrain_spec(tmp_path, [0, 1], steps=3)), "--no-estimate"]) == 2
    err = capsys.readouterr().err
    assert f"model {hf} changed ({old} -> {model_folder_digest(hf)})" in err
    assert not (sweep / "T1_kall_softmax_s1").exists()


# ---- N3: one sweep name, one spec ------------------------------------------------------------------------------
def test_adding_a_seed_keeps_the_shared_hash_and_a_learning_rate_changes_it(tmp_path):
    one = build_plan(write_spec(tmp_path, {"temperature": [1.0], "seed": [0]}, {"model.learning_rate": 0.001}))
    two = build_plan(write_spec(tmp_path, {"temperature": [1.0, 0.3], "seed": [0, 1]}, {"model.learning_rate": 0.001}))
    other = build_plan(write_spec(tmp_path, {"temperature": [1.0], "seed": [0]}, {"model.learning_rate": 0.003}))
    assert one.shared_hash == two.shared_hash != other.shared_hash
    assert one.shared_hash.startswith("sha256 ")


def test_a_second_spec_under_a_running_or_finished_name_is_refused_before_the_plan(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_spec(tmp_path / "a", {"temperature": [1.0]}, {"model.learning_rate": 0.001},
                       save_dir=str(tmp_path / "logs"))
    second = write_spec(tmp_path / "b", {"temperature": [1.0]}, {"model.learning_rate": 0.003},
                        save_dir=str(tmp_path / "logs"))
    a, b = build_plan(first), build_plan(second)
    held = spec_identity.claim(a.sweep_dir, a.shared_hash, first)  # the first spec's sweep, running
    try:
        assert main(["--config", str(second), "--no-estimate"]) == 2
    finally:
        held.release()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("study sweep: refused: sweep folder ")
    assert f"spec {first} (shared hash {a.shared_hash}) is running under this name; {second} has other settings " \
           f"(shared hash {b.shared_hash})" in err
    assert not (a.sweep_dir / "plan.json").exists() and not (a.sweep_dir / "T1_kall_softmax_s0").exists()
    # the first one has ended: the name stays its own, and a dry run says so without writing anything
    assert main(["--config", str(second), "--dry-run"]) == 2
    assert f"(shared hash {a.shared_hash}) ran under this name" in capsys.readouterr().err
    assert sorted(p.name for p in a.sweep_dir.iterdir()) == [spec_identity.lock_name(a.shared_hash)]
    # the first spec with a seed added keeps the name (one spec)
    spec_identity.claim(a.sweep_dir, build_plan(first).shared_hash, first).release()


def _claim_at_once(sweep_dir: str, shared: str, barrier, results) -> None:
    barrier.wait()
    try:
        held = spec_identity.claim(Path(sweep_dir), shared, Path(f"{shared}.yaml"))
    except spec_identity.SpecConflict as err:
        results.put(("refused", str(err)))
        barrier.wait()
        return
    results.put(("claimed", shared))
    barrier.wait()  # both have tried before either lets go
    held.release()


def test_two_specs_started_together_give_one_refusal(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for attempt in range(3):  # the race, several times over
        sweep = tmp_path / f"s{attempt}"
        barrier, results = ctx.Barrier(2, timeout=60), ctx.Queue()
        procs = [ctx.Process(target=_claim_at_once, args=(str(sweep), h, barrier, results))
                 for h in ("sha256 aaaa", "sha256 bbbb")]
        for p in procs:
            p.start()
        outcomes = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        assert [o[0] for o in outcomes] == ["claimed", "refused"], outcomes
        winner = outcomes[0][1]
        assert f"(shared hash {winner}) is running under this name" in outcomes[1][1]


# ---- N4: the report reads what is on disk ----------------------------------------------------------------------
def _run_folder(sweep: Path, name: str, fingerprint: str, clip: float | None, state: str = "failed") -> None:
    run = sweep / name
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": state, "fingerprint": fingerprint,
                                                 "params": {"temperature": 1.0, "seed": int(name[-1])}}))
    (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"gradient_clip_val": clip},
                                                     "model": {"learning_rate": 0.001}}))


def test_every_run_folder_is_read_and_those_outside_the_grid_are_listed_apart(tmp_path, capsys):
    from study.report.summary import summarize

    sweep = tmp_path / "tiny"
    _run_folder(sweep, "T1_kall_softmax_s0", "f0", 1.0)  # the plan's run
    _run_folder(sweep, "T1_kall_softmax_s1", "f1", 1.0)  # added with --run-index by a larger grid
    _run_folder(sweep, "T1_kall_softmax_s2", "other", None)  # made with other settings than the plan's entry
    plan = {"sweep": "tiny", "runs": [
        {"name": "T1_kall_softmax_s0", "fingerprint": "f0", "params": {"seed": 0},
         "resolved": {"trainer": {"gradient_clip_val": 1.0}}},
        {"name": "T1_kall_softmax_s2", "fingerprint": "f2", "params": {"seed": 2}, "resolved": {}}]}
    (sweep / "plan.json").write_text(json.dumps(plan))
    read, runs = load_sweep(sweep)
    assert [(r.name, r.state) for r in runs] == [("T1_kall_softmax_s0", "failed"), ("T1_kall_softmax_s2", "missing")]
    outside = read["outside_grid"]
    assert [(r.name, r.params["seed"], r.setting("trainer.gradient_clip_val")) for r in outside] == [
        ("T1_kall_softmax_s2", 2, None), ("T1_kall_softmax_s1", 1, 1.0)]
    assert ("study report: 2 run folder(s) outside the grid of plan.json (added with --run-index by another grid, "
            "or left by a grid shrunk since): T1_kall_softmax_s2, T1_kall_softmax_s1; listed apart, in no finding"
            ) in capsys.readouterr().out
    # no plan.json: every folder is a run, named by its own recorded settings (a run clipped at 1.0 is not "off")
    (sweep / "plan.json").unlink()
    read, runs = load_sweep(sweep)
    assert [r.name for r in runs] == ["T1_kall_softmax_s0", "T1_kall_softmax_s1", "T1_kall_softmax_s2"]
    assert read["outside_grid"] == []
    assert [summarize(r).clip for r in runs] == [1.0, 1.0, None]


@pytest.mark.slow
def test_a_run_outside_the_grid_is_in_no_finding_and_listed_in_report_md_and_json(tmp_path):
    from tests.test_report import _sweep_of_fake_runs, write_fake_run

    clean = _sweep_of_fake_runs(tmp_path / "clean")
    sweep = tmp_path / "outside"
    write_fake_run(sweep, "T0.1_kall_softmax_s9", {"temperature": 0.1, "top_k": None, "normalizer": "softmax",
                                                   "seed": 9}, {"grad_norm/total": [(0, 1000.0), (1, 1000.0)]})
    text = _sweep_of_fake_runs(sweep)  # the fake run above is not in plan.json

    def section(text, start, end):
        return text.split(start)[1].split(end)[0]

    for start, end in (("| claim (docs/paper.md) |", "## Sanity"), ("## Sanity", "## Runs")):
        assert section(text, start, end) == section(clean, start, end), start
    assert text.split("\n")[2].startswith("9 runs: 9 finished.")
    assert "Outside the grid: 1 run folder(s) that plan.json does not hold with these settings" in text
    assert "`T0.1_kall_softmax_s9` finished (learning rate None, clip off)" in text
    data = json.loads((sweep / "report" / "report.json").read_text())
    assert [r["name"] for r in data["outside_grid"]] == ["T0.1_kall_softmax_s9"]
    assert "outside_grid" not in json.loads((tmp_path / "clean" / "report" / "report.json").read_text())


# ---- N13: the sweep watches its spec file ----------------------------------------------------------------------
def test_an_edited_spec_is_named_with_both_digests(tmp_path):
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    plan = build_plan(spec)
    watch = SourceWatch([plan.base], spec=(plan.spec_path, plan.spec_digest))
    watch.check("before launching run x")
    spec.write_text(spec.read_text().replace("temperature:\n  - 1.0", "temperature:\n  - 0.3"))
    with pytest.raises(SourceChanged) as changed:
        watch.check("before launching run x")
    now = spec_identity.spec_digest(spec)
    assert str(changed.value).startswith(f"the sweep spec {spec} changed (spec digest {plan.spec_digest} -> {now}) "
                                         "while the sweep ran (seen before launching run x)")


def test_a_run_process_refuses_a_spec_changed_since_the_sweep_launched_it(tmp_path, capsys):
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    started = build_plan(spec).spec_digest
    spec.write_text(spec.read_text() + "\n# edited\n")
    assert main(["--config", str(spec), "--run-index", "0", "--spec-digest", started]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        f"study sweep: refused: the sweep spec {spec} changed (spec digest {started} -> "
        f"{spec_identity.spec_digest(spec)}) since the sweep launched this run")
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_a_spec_edited_during_a_parallel_sweep_stops_it_in_one_line(tmp_path):
    """Issue 52 N13: with --parallel 2 the runs are subprocesses; the spec edited once the first has started:
    the sweep stops naming the spec and both digests (it used to print "? in 13.4s" and "2 missing")."""
    spec = write_spec(tmp_path, {"temperature": [1.0, 0.3, 0.1]})
    started = build_plan(spec).spec_digest
    sweep = tmp_path / "logs" / "tiny"
    proc = subprocess.Popen([sys.executable, "-m", "study.cli", "sweep", "--config", str(spec), "--parallel", "2",
                             "--no-estimate"], cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 300
    while not list(sweep.glob("*/settings.json")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    spec.write_text(spec.read_text().replace("- 0.1", "- 3.0"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, (out, err)
    now = spec_identity.spec_digest(spec)
    stopped = [line for line in err.splitlines() if line.startswith("study sweep tiny: stopped:")]
    assert len(stopped) == 1 and f"the sweep spec {spec} changed (spec digest {started} -> {now})" in stopped[0]
    assert not (sweep / "T3_kall_softmax_s0").exists()
