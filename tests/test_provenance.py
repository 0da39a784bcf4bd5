"""`study.provenance`: what each run records about the code, configs, libraries and machine it ran on; the sweep's
watch on the source hash (`study.sweep.source`); the report's refusal to pool runs of different source hashes
(`study.report.origin`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from study import provenance, tags
from study.fit import ProvenanceText  # imports Lightning and transformers once, at collection

ROOT = Path(__file__).resolve().parents[1]
A, B = "sha256 aaaaaaaaaaaaaaaa", "sha256 bbbbbbbbbbbbbbbb"  # two source hashes


# ---- the source hash ------------------------------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path):
    """A git checkout holding a copy of the package, a config, docs and results, committed."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "study", repo / "study", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "configs").mkdir()
    (repo / "configs" / "base.yaml").write_text("trainer:\n  max_steps: 3\n")
    (repo / "docs" / "results").mkdir(parents=True)
    (repo / "docs" / "running.md").write_text("# Running\n")
    (repo / "docs" / "results" / "main.json").write_text("{}\n")
    _git(repo, "init", "-q")
    for key, value in (("user.email", "t@example.org"), ("user.name", "t"), ("commit.gpgsign", "false")):
        _git(repo, "config", key, value)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "start")
    return repo


def test_the_source_hash_ignores_docs_and_results_and_follows_the_code_and_the_configs(checkout):
    package, config = checkout / "study", checkout / "configs" / "base.yaml"
    first = provenance.source_hash([config], package_dir=package)
    assert first == provenance.source_hash([str(config)], package_dir=package)  # a path as str or Path: the same
    assert provenance.package_hash(package) == provenance.package_hash(ROOT / "study")  # a copy elsewhere agrees
    state = provenance.git_state([config], package_dir=package)
    assert state["commit"] == _git(checkout, "rev-parse", "HEAD").strip()
    assert state == {"commit": state["commit"], "dirty": False, "source_dirty": False, "source_diff_hash": None}

    # committing results and docs, and leaving bytecode and a new doc uncommitted: the same source hash
    (checkout / "docs" / "results" / "main.json").write_text('{"verdict": "supported"}\n')
    (checkout / "docs" / "running.md").write_text("# Running\n\nMore.\n")
    _git(checkout, "commit", "-q", "-am", "results")
    (checkout / "docs" / "new.md").write_text("draft\n")
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "x.cpython-310.pyc").write_bytes(b"\0" * 10)
    assert provenance.source_hash([config], package_dir=package) == first
    state = provenance.git_state([config], package_dir=package)
    assert state["dirty"] is True and state["source_dirty"] is False and state["source_diff_hash"] is None

    # an edit of the code changes it, and the tree records the dirty source with a hash of its diff
    fit = package / "fit.py"
    fit.write_text(fit.read_text() + "\n# an edit\n")
    edited = provenance.source_hash([config], package_dir=package)
    assert edited != first
    state = provenance.git_state([config], package_dir=package)
    assert state["source_dirty"] is True and state["source_diff_hash"].startswith("sha256 ")
    other = fit.read_text() + "# another edit\n"
    fit.write_text(other)
    assert provenance.git_state([config], package_dir=package)["source_diff_hash"] != state["source_diff_hash"]
    _git(checkout, "checkout", "--", "study/fit.py")
    assert provenance.source_hash([config], package_dir=package) == first

    # a new module counts (untracked: its content is in the diff hash), and so does an edit of a config
    (package / "extra.py").write_text("X = 1\n")
    assert provenance.source_hash([config], package_dir=package) != first
    assert provenance.git_state([config], package_dir=package)["source_diff_hash"] is not None
    (package / "extra.py").unlink()
    config.write_text("trainer:\n  max_steps: 4\n")
    assert provenance.source_hash([config], package_dir=package) != first
    assert provenance.git_state([config], package_dir=package)["source_dirty"] is True


def test_outside_a_git_checkout_the_commit_is_none(tmp_path):
    package = tmp_path / "study"
    package.mkdir()
    (package / "a.py").write_text("A = 1\n")
    assert provenance.git_state(package_dir=package) == {
        "commit": None, "dirty": None, "source_dirty": None, "source_diff_hash": None}
    assert provenance.source_hash(package_dir=package).startswith("sha256 ")


def test_the_config_chain_is_the_config_files_of_the_command_line_in_order(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("x: 1\n")
    b.write_text("x: 2\n")
    argv = ["fit", "--config", str(a), f"--config={b}", "-c", str(tmp_path / "missing.yaml"), "--trainer.max_steps=1"]
    assert provenance.config_files(argv) == [str(a), str(b)]
    # the order is part of the chain (later files override earlier ones)
    assert provenance.source_hash([a, b]) != provenance.source_hash([b, a])


# ---- the record -----------------------------------------------------------------------------------------------
def test_the_record_names_libraries_machine_kernels_dtype_and_precision(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    config = ROOT / "configs" / "default.yaml"
    record = provenance.collect([config], precision="32-true", dtype=torch.float32, inputs={"data": "sha256 x"})
    assert record["source_hash"] == provenance.source_hash([config])
    assert record["package_hash"] == provenance.package_hash()
    assert record["configs"] == {str(config): provenance.file_digest(config)}
    assert record["versions"] == {name: metadata.version(name) for name in ("torch", "transformers", "lightning")}
    machine = record["machine"]
    assert machine["cpu"] == provenance.cpu_model() and machine["cpu"]
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["env"]["MKL_CBWR"] == "COMPATIBLE" and machine["env"]["ATEN_CPU_CAPABILITY"] is None
    assert set(machine["env"]) == {"MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS",
                                   "MKL_NUM_THREADS"}
    assert machine["torch_threads"] == torch.get_num_threads()
    assert machine["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    assert (record["dtype"], record["precision"], record["inputs"]) == ("float32", "32-true", {"data": "sha256 x"})
    if (ROOT / ".git").exists():
        assert record["git"]["commit"] == _git(ROOT, "rev-parse", "HEAD").strip()
    json.dumps(record)  # JSON-ready as it is
    line = provenance.machine_line(record)
    assert line.startswith(f"{machine['cpu']}, {machine['cpu_capability']}, MKL_CBWR=COMPATIBLE")
    assert "ATEN_CPU_CAPABILITY" not in line
    assert provenance.machine_line(None) == provenance.UNRECORDED == provenance.recorded_source({"state": "finished"})
    assert provenance.recorded_source({"provenance": record}) == record["source_hash"]


def test_the_text_entry_is_written_once_at_fit_start(tmp_path):
    record = {"source_hash": "sha256 0123456789abcdef", "machine": {"cpu": "CPU X", "env": {"MKL_CBWR": None}}}
    logger = TensorBoardLogger(str(tmp_path), name="", version="")
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger], global_step=7)
    ProvenanceText(record).on_fit_start(trainer, None)
    logger.experiment.flush()
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    [event] = acc.Tensors(f"{tags.PROVENANCE}/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 7 and text == provenance.as_markdown(record)
    assert "- **source_hash**: `sha256 0123456789abcdef`" in text and "- **machine.env.MKL_CBWR**: `null`" in text


# ---- the sweep's watch on the source ------------------------------------------------------------------------
class FakeSource:
    """`provenance.source_hash` as a value the test sets (an edit of the source while the sweep runs)."""

    def __init__(self, monkeypatch, value: str = "sha256 aaaaaaaaaaaaaaaa") -> None:
        self.value = value
        monkeypatch.setattr(provenance, "source_hash", lambda *args, **kwargs: self.value)


def test_the_watch_names_both_hashes_and_the_moment(monkeypatch):
    from study.sweep.source import SourceChanged, SourceWatch

    source = FakeSource(monkeypatch)
    watch = SourceWatch([ROOT / "configs" / "default.yaml"])
    watch.check("before launching run a")
    watch.check_run("a", {"provenance": {"source_hash": "sha256 aaaaaaaaaaaaaaaa"}})
    watch.check_run("b", {"state": "failed", "reason": "refused before it started"})  # no record: not a change
    with pytest.raises(SourceChanged, match=r"^run c ran under source hash sha256 cccc, not the sweep's sha256 a+ "):
        watch.check_run("c", {"provenance": {"source_hash": "sha256 cccc"}})
    source.value = "sha256 bbbbbbbbbbbbbbbb"
    with pytest.raises(SourceChanged) as raised:
        watch.check("after run a ended")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("the package source or its configs changed while the sweep ran (source hash "
                              "sha256 aaaaaaaaaaaaaaaa at its start, sha256 bbbbbbbbbbbbbbbb after run a ended)")


def test_a_run_resumed_across_a_change_of_the_code_reads_as_both_sources():
    """A run stopped, the code changed, the run resumed from its checkpoint: its weights carry both versions, and
    the report reads it as a source of its own (which it then refuses to pool with either)."""
    from study.sweep.run import attempt_sources

    first = {"state": "failed", "provenance": {"source_hash": A}}
    assert attempt_sources(first, {"source_hash": B}, resumed=True) == [A, B]
    assert attempt_sources(first, {"source_hash": B}, resumed=False) == [B]  # started over: B alone
    assert attempt_sources({"attempt_sources": [A, A]}, {"source_hash": A}, resumed=True) == [A, A, A]
    assert attempt_sources({"state": "running"}, {"source_hash": B}, resumed=True) == [B]  # an unrecorded attempt
    both = {"provenance": {"source_hash": B}, "attempt_sources": [A, B]}
    assert provenance.recorded_source(both) == f"{A} + {B}"
    assert provenance.recorded_source({**both, "attempt_sources": [B, B]}) == B


def test_a_sweep_names_the_runs_on_disk_that_other_code_made(monkeypatch):
    from study.sweep.source import done_elsewhere

    statuses = {"a": {"provenance": {"source_hash": A}}, "b": {"provenance": {"source_hash": B}}, "c": None,
                "d": {"state": "finished"}}
    assert done_elsewhere(statuses, A) == (
        f"1 run(s) on disk ran under other source hashes ({B}) than this sweep's {A}: the report refuses to pool "
        "them with its runs (study report --allow-mixed-sources pools them, marked); delete them to redo them")
    assert done_elsewhere({"a": statuses["a"], "c": None, "d": statuses["d"]}, A) is None


def _tiny_spec(tmp_path: Path) -> Path:
    from tests.test_sweep import write_spec

    return write_spec(tmp_path, {"temperature": [0.5, 1.0, 2.0]})


def test_a_sweep_stops_when_its_source_changes_between_runs(tmp_path, monkeypatch, capsys):
    """In process: the source changes during the first run; the sweep stops after it with one line naming both
    hashes, and launches no other run."""
    from study.sweep import main
    from study.sweep import pool as sweep_pool
    from study.sweep.run import write_status

    source = FakeSource(monkeypatch)
    ran = []

    def fake_run(run, is_pretrain=False):
        ran.append(run.name)
        status = {"name": run.name, "index": run.index, "state": "finished", "duration_s": 0.1,
                  "provenance": {"source_hash": source.value}}
        source.value = "sha256 bbbbbbbbbbbbbbbb"  # a commit in the checkout while the run trains
        write_status(run.dir, status)
        return status

    monkeypatch.setattr(sweep_pool, "execute_run", fake_run)
    assert main(["--config", str(_tiny_spec(tmp_path)), "--no-estimate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ran == ["T0.5_kall_softmax_s0"]
    assert err[-1] == (
        "study sweep tiny: stopped: the package source or its configs changed while the sweep ran (source hash "
        "sha256 aaaaaaaaaaaaaaaa at its start, sha256 bbbbbbbbbbbbbbbb after run T0.5_kall_softmax_s0 ended); its "
        "runs would mix two versions of the code: restore the source (or commit it) and rerun the same command; "
        "runs already done keep their record, and the report refuses to pool two source hashes")


def test_a_pool_stops_when_a_run_subprocess_recorded_another_source_hash(tmp_path, monkeypatch, capsys):
    """`--parallel`: a run subprocess that imported other code records another source hash; the pool stops the
    other running jobs and the sweep ends in one line naming both hashes."""
    import argparse

    from study.sweep import build_plan
    from study.sweep import pool as sweep_pool
    from study.sweep.source import SourceChanged, SourceWatch

    FakeSource(monkeypatch)
    plan = build_plan(_tiny_spec(tmp_path))
    # each "run" records its status as a run would; the second one sleeps (it is still running at the stop)
    code = ("import json, sys, time, pathlib; d = pathlib.Path(sys.argv[1]); slow = sys.argv[2] == '1'; "
            "time.sleep(30 if slow else 0); (d / 'status.json').write_text(json.dumps({'name': d.name, 'state': "
            "'finished', 'provenance': {'source_hash': 'sha256 ffffffffffffffff'}}))")
    monkeypatch.setattr(sweep_pool, "run_command", lambda spec, index, *a, **k: [
        sys.executable, "-c", code, str(plan.runs[int(index)].dir), "1" if int(index) == 1 else "0"])
    args = argparse.Namespace(parallel=2, devices_per_run=1, save_dir=None, threads=1)
    progress = sweep_pool.SweepProgress(len(plan.runs), 2)
    with pytest.raises(SourceChanged, match=r"^run T0.5_kall_softmax_s0 ran under source hash sha256 f+, not the "
                                            r"sweep's sha256 a+ \(the package source or its configs changed"):
        sweep_pool.run_pool(plan, list(plan.runs), args, [], progress, watch=SourceWatch([plan.base]))
    out = capsys.readouterr().out
    assert "study sweep: stopped by its source changing; 1 running job(s) stopped and recorded (T1_kall_softmax_s0)" in out
    second = json.loads((plan.runs[1].dir / "status.json").read_text())
    assert second["state"] == "failed" and second["reason"] == "interrupted: the sweep was stopped (its source changing)"
    assert not plan.runs[2].dir.exists()  # never launched


@pytest.mark.slow
def test_a_real_run_records_its_provenance_in_its_status_and_its_events(tmp_path):
    """A sweep's run (`study fit` through the sweep) keeps the record in status.json and writes it as the text
    entry; its source hash is the package's and the base config's, its inputs are the sweep's `depends`."""
    from study.sweep import build_plan, main
    from tests.test_sweep import write_spec

    spec = write_spec(tmp_path, {"temperature": [0.5]})
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    plan = build_plan(spec)
    [run] = plan.runs
    status = json.loads((run.dir / "status.json").read_text())
    record = status["provenance"]
    assert record["source_hash"] == provenance.source_hash([plan.base])
    assert record["configs"] == {str(plan.base): provenance.file_digest(plan.base)}
    assert (record["dtype"], record["precision"]) == ("float32", "32-true")
    assert record["machine"]["torch_threads"] == 1  # the sweep's `threads`
    assert record["machine"]["env"]["OMP_NUM_THREADS"] == "1"
    assert record["versions"]["torch"] == metadata.version("torch")
    assert record["git"]["commit"] == (_git(ROOT, "rev-parse", "HEAD").strip() if (ROOT / ".git").exists() else None)
    # the inputs the run read are the digests the sweep's `depends` records (one computation for both)
    depends = {k: v for k, v in status["depends"].items() if not k.startswith("base config ")}
    assert depends and record["inputs"] == depends
    acc = EventAccumulator(str(run.dir), size_guidance={"tensors": 0})
    acc.Reload()
    [event] = acc.Tensors(f"{tags.PROVENANCE}/text_summary")
    assert event.step == 0 and event.tensor_proto.string_val[0].decode() == provenance.as_markdown(record)


# ---- the report -----------------------------------------------------------------------------------------------
def _record(source: str, cpu: str = "CPU X", mkl: str | None = None) -> dict:
    return {"source_hash": source, "git": {"commit": "0123456789abcdef0123", "dirty": False, "source_dirty": False},
            "machine": {"cpu": cpu, "cpu_capability": "AVX2", "env": {"MKL_CBWR": mkl}, "torch_threads": 1}}


def _sweep_with_sources(sweep: Path, records: list[dict | None]) -> None:
    """Finished softmax runs at 3 temperatures x 3 seeds whose gradient norm is 1/T, each with the provenance
    record given in turn (None: a run logged before runs recorded one)."""
    from tests.test_report import write_fake_run

    runs = []
    members = [(t, seed) for t in (0.1, 0.3, 1.0) for seed in (0, 1, 2)]
    for (t, seed), record in zip(members, records):
        name, grad = f"T{t:g}_kall_softmax_s{seed}", 1.0 / t * (1 + 0.01 * seed)
        params = {"temperature": t, "top_k": None, "normalizer": "softmax", "seed": seed}
        write_fake_run(sweep, name, params, {
            "train/loss": [(0, 5.0), (1, 4.0)], "val/ppl": [(2, 50.0)], "grad_norm/total": [(0, grad), (1, grad)],
            "grad_norm/attn_q": [(0, grad), (1, grad)], "grad_norm/attn_k": [(0, grad), (1, grad)],
        })  # fmt: skip
        if record is not None:
            status = json.loads((sweep / name / "status.json").read_text())
            (sweep / name / "status.json").write_text(json.dumps({**status, "provenance": record}))
        runs.append({"name": name, "params": params})
    (sweep / "plan.json").write_text(json.dumps({"sweep": sweep.name, "runs": runs}))


@pytest.fixture
def no_figures(monkeypatch):
    """The report without its figures and planted controls (seconds each; tested in test_report*.py)."""
    from study.report import build

    monkeypatch.setattr(build, "figures", lambda summaries, out: {})
    monkeypatch.setattr(build.planted_controls, "controls", lambda: [])
    monkeypatch.setattr(build.planted_controls, "section", lambda found: [])



def test_the_report_refuses_runs_of_two_source_hashes_in_one_line(tmp_path, capsys, no_figures):
    from study.report import main as report_main

    sweep = tmp_path / "mixed"
    _sweep_with_sources(sweep, [_record(A)] * 6 + [_record(B)] * 3)
    assert report_main([str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err == (f"study report: refused, nothing written: the runs come from 2 source hashes ({A}: 6 runs, {B}: "
                   "3 runs): their findings would pool two versions of the code; rerun them from one, or pass "
                   "--allow-mixed-sources to pool them with every row they feed marked\n")
    assert not (sweep / "report").exists()


def test_with_the_option_every_row_the_runs_feed_says_so(tmp_path, capsys, no_figures):
    from study.report import main as report_main

    sweep = tmp_path / "mixed"
    _sweep_with_sources(sweep, [_record(A)] * 6 + [_record(B, cpu="CPU Y", mkl="COMPATIBLE")] * 3)
    assert report_main([str(sweep), "--allow-mixed-sources"]) == 0
    text = (sweep / "report" / "report.md").read_text()
    data = json.loads((sweep / "report" / "report.json").read_text())
    note = f" (pools runs of 2 source hashes: {A}, {B})"
    header = text.split("## Scorecard")[0]
    assert (f"Source hashes of the runs (the package source and its configs, `study.provenance`): {A}: 6 runs, "
            f"{B}: 3 runs; pooled with --allow-mixed-sources: every row they feed says so.") in header
    assert "Machines: CPU X, AVX2, 1 thread (6 runs); CPU Y, AVX2, MKL_CBWR=COMPATIBLE, 1 thread (3 runs)." in header
    plain = text.split("## In plain words")[1].split("## Scorecard")[0]
    assert plain.strip().startswith(f"These runs come from 2 source hashes ({A}: 6 runs, {B}: 3 runs), pooled with "
                                    "--allow-mixed-sources: every training row pools them.")
    assert data["origin"] == {"sources": {A: 6, B: 3}, "mixed": True, "commits": {"0123456789ab": 9},
                              "dirty_source_runs": 0,
                              "machines": {"CPU X, AVX2, 1 thread": 6, "CPU Y, AVX2, MKL_CBWR=COMPATIBLE, 1 thread": 3}}
    training = [f for f in data["findings"] if f["experiment"] == "training"]
    assert training and all(f["value"].endswith(note) and f["mixed_sources"] == [A, B] for f in training)
    scorecard = [r for r in data["scorecard"] if r["experiment"] == "training"]
    assert scorecard and all(r["ours"].endswith(note) and r["mixed_sources"] == [A, B] for r in scorecard)
    assert all("mixed_sources" not in f for f in data["findings"] if f["experiment"] != "training")
    rows = [line for line in text.split("## Findings")[1].split("## Sanity")[0].splitlines() if "in training" in line]
    assert rows and all(note in line for line in rows)


def test_one_source_hash_and_unrecorded_runs_are_pooled_and_named(tmp_path, capsys, no_figures):
    from study.report import build_report

    sweep = tmp_path / "older"
    _sweep_with_sources(sweep, [_record(A)] * 7 + [None] * 2)
    text = build_report(sweep).read_text()
    data = json.loads((sweep / "report" / "report.json").read_text())
    assert data["origin"]["sources"] == {A: 7, "unrecorded": 2} and data["origin"]["mixed"] is False
    assert f"{A}: 7 runs, unrecorded: 2 runs." in text
    assert "2 run(s) recorded no provenance (made before runs recorded it): their code and machine are unknown." in text
    assert "pools runs of" not in text and not any("mixed_sources" in f for f in data["findings"])


def test_the_learning_rate_sections_rows_say_so_too(tmp_path, monkeypatch, no_figures):
    """The from-scratch section's findings get the same note (passed to `lr_section`) and report.json flag."""
    from study.report import build, lrcurves

    seen = []

    def fake_section(summaries, out=None, value_note=""):
        seen.append(value_note)
        rows = [{"key": "1", "claim": "c", "statistic": "s", "value": f"0.5 [0.1, 0.9]{value_note}", "verdict": "v",
                 "rule": "r"}]
        return lrcurves.LRSection("## Learning-rate curves (from scratch)\n", {"findings": rows})

    monkeypatch.setattr(build, "lr_section", fake_section)
    sweep = tmp_path / "mixed"
    _sweep_with_sources(sweep, [_record(A)] * 6 + [_record(B)] * 3)
    build.build_report(sweep, allow_mixed_sources=True)
    data = json.loads((sweep / "report" / "report.json").read_text())
    note = f" (pools runs of 2 source hashes: {A}, {B})"
    assert seen == [note]
    assert data["lr_curves"]["findings"][0]["value"] == f"0.5 [0.1, 0.9]{note}"
    assert data["lr_curves"]["findings"][0]["mixed_sources"] == [A, B]


def test_the_pretraining_run_counts_among_the_sources(tmp_path, capsys, no_figures):
    """Every fine-tuning run starts from the sweep's pretrained weights: a pretraining run made by other code is
    a second source hash."""
    from study.report import main as report_main

    sweep = tmp_path / "pretrained"
    _sweep_with_sources(sweep, [_record(A)] * 9)
    (sweep / "pretrain").mkdir()
    (sweep / "pretrain" / "status.json").write_text(json.dumps({"state": "finished", "provenance": _record(B)}))
    assert report_main([str(sweep)]) == 2
    assert f"the runs come from 2 source hashes ({A}: 9 runs, {B}: 1 run)" in capsys.readouterr().err
    (sweep / "pretrain" / "status.json").write_text(json.dumps({"state": "finished", "provenance": _record(A)}))
    assert report_main([str(sweep)]) == 0
    assert json.loads((sweep / "report" / "report.json").read_text())["origin"]["sources"] == {A: 10}
