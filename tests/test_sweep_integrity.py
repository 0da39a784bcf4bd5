"""A sweep runs nothing it should not, mixes nothing and loses nothing: runs with no step fail, a status that
cannot be written does not stop the sweep, names stay inside save_dir, changed dependencies are refused."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from study.sweep import main
from study.sweep import run as sweep_run
from tests.test_sweep import status, write_spec


@pytest.mark.slow
def test_training_data_that_gives_no_batch_is_refused_before_any_run(tmp_path, capsys):
    """3 blocks for a batch of 4: refused when the plan is checked (`study.fit.preflight`), before any run folder."""
    spec = write_spec(tmp_path, {"temperature": [1.0]}, {"data.max_train_blocks": 3})
    assert main(["--config", str(spec), "--no-estimate"]) == 2
    err = capsys.readouterr().err
    assert "data.batch_size = 4: must be <= the at most 3 training blocks" in err and "nothing was run" in err, err
    assert not (tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0").exists()


@pytest.mark.slow  # a whole fit in a subprocess
@pytest.mark.parametrize(
    "overrides, reason",
    [({"trainer.max_epochs": 0}, "trained no step (max_steps=6, limit_train_batches=1.0)")],
)
def test_a_run_that_trains_no_step_is_failed_not_finished(tmp_path, overrides, reason):
    spec = write_spec(tmp_path, {"temperature": [1.0]}, overrides)
    assert main(["--config", str(spec), "--no-estimate"]) == 1
    st = status(tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0")
    assert st["state"] == "failed" and st["reason"].startswith(reason), st
    assert any(name.startswith("base config ") for name in st["depends"])  # what the run trained with


def test_a_status_that_cannot_be_written_does_not_stop_the_sweep(tmp_path, monkeypatch, capsys):
    """A full disk: the atomic write fails, and the in-place fallback has no file to write into (the run's first
    status) or cannot write either; both used to raise out of the sweep."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sweep_run, "write_text_atomically", full)
    sweep_run.write_status(tmp_path / "run", {"name": "run", "state": "running"})
    assert not (tmp_path / "run" / "status.json").exists()
    err = capsys.readouterr().err
    assert err.startswith("study sweep: could not record run as running (OSError: [Errno 28] No space left on "
                          "device; in place: FileNotFoundError") and err.rstrip().endswith("going on")
    # with a status there, the compact record is written in place
    monkeypatch.undo()
    (tmp_path / "run" / "status.json").write_text(json.dumps({"name": "run", "state": "running", "args": ["x"] * 50}))
    monkeypatch.setattr(sweep_run, "write_text_atomically", full)
    sweep_run.write_status(tmp_path / "run", {"name": "run", "state": "failed", "reason": "disk full"})
    assert status(tmp_path / "run")["state"] == "failed" and capsys.readouterr().err == ""


@pytest.mark.parametrize("name", ["../../escape", "..", "a/b", "/tmp/abs-sweep-i23", "a\\b"])
def test_a_sweep_name_that_is_not_one_folder_is_refused_before_any_write(tmp_path, name, capsys):
    work = tmp_path / "work"
    work.mkdir()
    spec = write_spec(work, {"temperature": [1.0]}, name=name)
    before = sorted(p for p in tmp_path.rglob("*"))
    assert main(["--config", str(spec), "--dry-run"]) == 2
    assert sorted(p for p in tmp_path.rglob("*")) == before and not Path("/tmp/abs-sweep-i23").exists()
    err = capsys.readouterr().err
    assert f"sweep name {name!r} is not a plain folder name" in err


def test_a_run_name_that_is_not_one_folder_is_refused(tmp_path, monkeypatch):
    from study.sweep import axes
    from study.sweep.config import SweepConfigError, build_plan

    monkeypatch.setattr(axes, "run_name", lambda params, swept=frozenset(): "../outside")
    with pytest.raises(SweepConfigError, match="run name '../outside' is not a plain folder name"):
        build_plan(write_spec(tmp_path, {"temperature": [1.0]}))


def _fake_finished(sweep_dir: Path, index: int, spec: Path) -> dict:
    """Mark run `index` of the spec's plan as finished, as a sweep records it."""
    from study.sweep.config import build_plan

    entry = json.loads(json.dumps(build_plan(spec).as_dict(), default=str))["runs"][index]
    run = sweep_dir / entry["name"]
    run.mkdir(parents=True, exist_ok=True)
    status = {"name": entry["name"], "state": "finished", "fingerprint": entry["fingerprint"], "depends": entry["depends"]}
    (run / "status.json").write_text(json.dumps(status))
    return entry


def test_an_edited_base_config_is_refused_not_pooled(tmp_path, capsys):
    """Editing learning_rate in the base YAML and adding a seed trained the new run at the new rate and pooled it
    with the old one as two seeds of one setting."""
    from tests.test_sweep import ROOT

    base = tmp_path / "base.yaml"
    base.write_text((ROOT / "configs" / "default.yaml").read_text())
    spec = write_spec(tmp_path, {"seed": [0]}, base=str(base))
    assert main(["--config", str(spec), "--dry-run"]) == 0
    entry = _fake_finished(tmp_path / "logs" / "tiny", 0, spec)
    assert entry["depends"][f"base config {base}"].startswith("sha256 ")
    assert "data: the embedded corpus" in entry["depends"]
    base.write_text(base.read_text().replace("learning_rate: ", "learning_rate: 2.0e-3 # was "))
    spec = write_spec(tmp_path, {"seed": [0, 1]}, base=str(base))
    capsys.readouterr()
    assert main(["--config", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"run {entry['name']} was trained with other inputs than this sweep would use now: base config {base} " \
           "changed (sha256 " in err and "never pooled" in err
    assert not (tmp_path / "logs" / "tiny" / "plan.json").exists()  # a dry run writes nothing


def test_a_changed_data_file_is_refused_by_name(tmp_path, text_files, capsys):
    train, val = text_files
    overrides = {"data.source": "files", "data.train_files": [train], "data.val_files": [val], "data.vocab_size": 300}
    spec = write_spec(tmp_path, {"temperature": [1.0]}, overrides)
    assert main(["--config", str(spec), "--dry-run"]) == 0
    _fake_finished(tmp_path / "logs" / "tiny", 0, spec)
    assert main(["--config", str(spec), "--dry-run"]) == 0  # unchanged: accepted
    Path(train).write_text(Path(train).read_text() + "one more line\n")
    capsys.readouterr()
    assert main(["--config", str(spec), "--dry-run"]) == 2
    assert f"file {train} (data.train_files[0]) changed (sha256 " in capsys.readouterr().err


# ---- the sweep's own pretrained model (issue 32, item 4) -------------------------------------------------------
def _pretrain_spec(tmp_path, seeds):
    return write_spec(tmp_path, {"temperature": [1.0], "seed": seeds}, {"trainer.max_steps": 2,
                      "trainer.val_check_interval": 2},
                      pretrain={"overrides": {"trainer.max_steps": 2, "trainer.val_check_interval": 2,
                                                "model.warmup_steps": 1}})


@pytest.mark.slow
def test_a_damaged_pretrained_model_is_refused_by_name(tmp_path, capsys):
    """Checksums are written when pretrain/hf is built (here by hand, as `execute_run` does); a byte changed
    afterwards is refused before any run trains from it, naming the folder and what to do."""
    from study.cachefolder import write_checksums
    from study.sweep.config import build_plan

    plan = build_plan(_pretrain_spec(tmp_path, [0]))
    hf = plan.pretrain.dir / "hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    write_checksums(hf)
    assert sweep_run.pretrained_problem(plan) is None
    with open(hf / "model.safetensors", "r+b") as f:  # 256 bytes zeroed in place
        f.seek(4096)
        f.write(bytes(256))
    problem = sweep_run.pretrained_problem(plan)
    assert problem is not None and str(hf) in problem and "model.safetensors changed" in problem
    assert f"delete {plan.pretrain.dir}" in problem
    # the runs check it too, before they read it (a run of the pool, another process)
    st = sweep_run.execute_run(plan.runs[0])
    assert st["state"] == "failed" and str(hf) in st["reason"]
    assert not (plan.runs[0].dir / "checkpoints").exists()


@pytest.mark.slow
def test_a_pretrained_model_damaged_between_sweeps_is_not_trained_from(tmp_path, capsys):
    assert main(["--config", str(_pretrain_spec(tmp_path, [0])), "--no-estimate"]) == 0
    hf = tmp_path / "logs" / "tiny" / "pretrain" / "hf"
    assert (hf / "checksums.json").is_file()
    with open(hf / "model.safetensors", "r+b") as f:
        f.seek(1024)
        f.write(bytes(4096))
    capsys.readouterr()
    assert main(["--config", str(_pretrain_spec(tmp_path, [0, 1])), "--no-estimate"]) == 2  # a seed added
    err = capsys.readouterr().err
    assert f"the sweep's pretrained model {hf} is damaged" in err
    assert not (tmp_path / "logs" / "tiny" / "T1_kall_softmax_s1").exists()


def test_a_status_that_cannot_be_written_while_the_log_is_on_the_full_disk_does_not_raise(tmp_path, monkeypatch):
    """The note that a status was lost goes to stderr, which during a run is the run's log on that same disk
    (/dev/full stands for it): it is lost too, and nothing raises out of the sweep (issue 32, item 5)."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with sweep_run.run_console(Path("/dev/full")):
        monkeypatch.setattr(sweep_run, "write_text_atomically", full)
        sweep_run.write_status(tmp_path / "run", {"name": "run", "state": "failed"})
    monkeypatch.undo()
    assert not (tmp_path / "run" / "status.json").exists()


# ---- links and dry runs (issue 32, items 6 and 10) ----------------------------------------------------------------
@pytest.mark.parametrize("planted", ["run.lock", "sweep.log", "checkpoints", "status.json"])
def test_a_link_planted_in_a_run_folder_is_refused_and_its_target_untouched(tmp_path, planted, capsys):
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("precious")
    run = tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0"
    run.mkdir(parents=True)
    (run / planted).symlink_to(outside if planted == "checkpoints" else outside / "precious.txt")
    assert main(["--config", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"study sweep: {run / planted} is a link out of the sweep folder" in err and len(err.splitlines()) == 1
    assert (outside / "precious.txt").read_text() == "precious" and [p.name for p in outside.iterdir()] == [
        "precious.txt"]


def test_links_planted_after_the_sweep_started_are_refused_where_it_writes(tmp_path):
    from study.sweep.lock import RunLock

    outside = tmp_path / "precious.txt"
    outside.write_text("precious")
    run = tmp_path / "sweep" / "run"
    run.mkdir(parents=True)
    (run / "run.lock").symlink_to(outside)
    with pytest.raises(OSError, match="run.lock is a link: refused"):
        RunLock(run).acquire()
    (run / "run.lock").unlink()
    (run / "sweep.log").symlink_to(outside)
    with pytest.raises(OSError), sweep_run.run_console(run / "sweep.log"):
        pass
    assert outside.read_text() == "precious"
    assert sweep_run.links_out_of(run) == [run / "sweep.log"]
    (run / "sweep.log").unlink()
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "epoch=0-step=2.ckpt").write_bytes(b"x")
    (run / "checkpoints" / "last.ckpt").symlink_to(run / "checkpoints" / "epoch=0-step=2.ckpt")  # save_last: link
    assert sweep_run.links_out_of(run) == []
    assert sweep_run.links_out_of(tmp_path / "sweep") == []


def test_the_save_dir_itself_may_be_a_link(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "logs").symlink_to(scratch)
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    assert main(["--config", str(spec), "--dry-run"]) == 0


def test_a_dry_run_writes_nothing(tmp_path, capsys):
    """A dry run with a smaller grid under an existing sweep's name replaced its plan.json, and the report then
    covered only the runs of the smaller grid."""
    spec = write_spec(tmp_path, {"temperature": [0.5, 1.0]})
    assert main(["--config", str(spec), "--dry-run"]) == 0
    assert not (tmp_path / "logs").exists()
    sweep = tmp_path / "logs" / "tiny"
    sweep.mkdir(parents=True)
    (sweep / "plan.json").write_text('{"sweep": "tiny", "runs": [{"name": "a"}, {"name": "b"}]}')
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    assert main(["--config", str(spec), "--dry-run"]) == 0
    assert (sweep / "plan.json").read_text() == '{"sweep": "tiny", "runs": [{"name": "a"}, {"name": "b"}]}'
    assert [p.name for p in sweep.iterdir()] == ["plan.json"]
    assert "nothing written" in capsys.readouterr().out


# ---- settings recorded apart from status.json (issue 32, item 7) ---------------------------------------------
@pytest.mark.slow
def test_a_damaged_status_does_not_let_a_run_resume_under_other_settings(tmp_path, capsys):
    """An unfinished run whose status.json was cut, then the lr override changed: it used to resume from the old
    checkpoint while status, plan and report said the new rate."""
    from study.sweep.config import build_plan

    spec = write_spec(tmp_path, {"temperature": [1.0]}, {"model.learning_rate": 0.001})
    run = build_plan(spec).runs[0]
    run.dir.mkdir(parents=True)
    sweep_run.write_settings(run)  # as execute_run records it before training
    (run.dir / "status.json").write_text('{"name": "T1_kall_softmax_s0", "state": "runn')  # cut by a kill
    spec = write_spec(tmp_path, {"temperature": [1.0]}, {"model.learning_rate": 0.05})
    assert main(["--config", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{run.dir} was made with other settings (fingerprint {run.fingerprint} != " in err


# ---- bad values refused before anything is built (issue 32, item 11) -----------------------------------------
@pytest.mark.parametrize(
    "grid, overrides, extra, argv, expected",
    [
        ({"top_k": [None, 8]}, {"data.block_size": 8}, {}, [],
         "model.attention.top_k 8 >= data.block_size 8: it selects every key"),
        ({"temperature": None}, {}, {}, [], "grid `temperature` is null"),
        ({"temperature": [1.0]}, {"trainer.val_check_interval": 10}, {}, [],
         "trainer.val_check_interval 10 > trainer.max_steps 6"),
        ({"temperature": [1.0]}, {"trainer.max_steps": 0}, {}, [], "trainer.max_steps 0 trains no step"),
        ({"temperature": [1.0]}, {"model.learning_rate": -1}, {}, [], "model.learning_rate must be a positive number, got -1"),
        ({"temperature": [1.0]}, {}, {"checkpoint": {"every_n_train_steps": 0}}, [],
         "`checkpoint.every_n_train_steps` must be a positive integer or null, got 0"),
        ({"temperature": [1.0]}, {}, {"checkpoint": {"every_n_train_steps": -5}}, [],
         "got -5"),
        ({"temperature": [1.0]}, {}, {"save_dir": ["a", "b"]}, [], "`save_dir` must be one folder path, got ['a', 'b']"),
        ({"temperature": [1.0]}, {}, {}, ["--threads", "0"], "--threads = 0: must be an integer in [1, "),
        ({"temperature": [1.0]}, {}, {}, ["--threads", "-1"], "--threads = -1: must be an integer in [1, "),
        ({"temperature": [1.0]}, {}, {}, ["--run-index", "-1"], "--run-index '-1' is not in 0..0"),
    ],
)
def test_bad_values_are_refused_in_one_line_before_anything_is_built(tmp_path, capsys, grid, overrides, extra, argv,
                                                                     expected):
    spec = write_spec(tmp_path, grid, overrides, **extra)
    if "save_dir" in extra:  # write_spec sets its own; the bad one replaces it
        import yaml

        data = yaml.safe_load(spec.read_text())
        data["save_dir"] = extra["save_dir"]
        spec.write_text(yaml.safe_dump(data))
    assert main(["--config", str(spec), "--no-estimate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "logs").exists()


def test_yaml_refuses_a_duplicate_key_and_reads_1e_300_as_a_number(tmp_path):
    from study.errors import ConfigError, load_yaml

    path = tmp_path / "spec.yaml"
    path.write_text("overrides:\n  model.learning_rate: 1e-300\n  trainer.max_steps: 5e1\n")
    assert load_yaml(path) == {"overrides": {"model.learning_rate": 1e-300, "trainer.max_steps": 50.0}}
    path.write_text("grid:\n  temperature: [1.0]\n  temperature: [0.1]\n")
    with pytest.raises(ConfigError, match=r"spec.yaml:3:3: YAML syntax error: duplicate key 'temperature' \(also on line 2\)"):
        load_yaml(path)
