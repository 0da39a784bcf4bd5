"""No write follows a link a user planted, and outputs are written whole (issue 52: N5, N6, N11, F5).

Each case plants the link (or the kill, or the full disk) and shows it refused or not followed, with the target
outside unchanged. The temporary names are now unpredictable, so a planted link cannot wait at them; the cases
plant it at the predictable names the writers used before (`.status.json.tmp`, `.last.ckpt.<pid>.tmp`, ...) and
show that neither a link there nor a file already there is touched.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from study import atomic
from study.report import build_report
from study.report import main as report_main
from study.sweep import run as sweep_run
from tests.test_report import write_fake_run

PRECIOUS = "precious, outside the folder"


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "precious.txt"
    target.parent.mkdir(exist_ok=True)
    target.write_text(PRECIOUS)
    return target


def _entries(folder: Path) -> dict[str, bytes]:
    """Every entry under ``folder`` (links as their text), for comparing a folder before and after."""
    return {
        str(p.relative_to(folder)): (b"link:" + os.readlink(p).encode()) if p.is_symlink()
        else p.read_bytes() if p.is_file() else b"dir"
        for p in sorted(folder.rglob("*"))
    }  # fmt: skip


# ---- temporary files: created exclusively, never at a name another process could plant -----------------------------
def _old_names(folder: Path) -> list[str]:
    """The predictable temporary names the writers of status.json, settings.json, plan.json, hparams.json and the
    checkpoints opened before (the pid is in run.lock)."""
    pid = os.getpid()
    return [".status.json.tmp", ".settings.json.tmp", f".plan.json.{pid}", f".hparams.json.{pid}",
            f".last.ckpt.{pid}.tmp", f".report.{pid}.tmp.md"]


@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_link_or_file_at_an_old_temporary_name_is_neither_followed_nor_clobbered(tmp_path, planted):
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from study.fit import VerifiedCheckpointIO
    from study.hparams import write_experiment
    from study.sweep.config import Run

    target = _outside(tmp_path)
    run = tmp_path / "sweep" / "run"
    run.mkdir(parents=True)
    for name in _old_names(run):
        if planted == "link":
            (run / name).symlink_to(target)
        else:
            (run / name).write_text("someone else's file")
    sweep_run.write_status(run, {"name": "run", "state": "running"})
    recorded = Run(index=0, name="run", dir=run, params={}, args=["--seed", "0"])
    sweep_run.write_settings(recorded)
    write_experiment(run, {"temperature": [1.0]}, ["val/loss"])
    VerifiedCheckpointIO(TorchCheckpointIO()).save_checkpoint({"global_step": 3}, run / "last.ckpt")
    atomic.write_text_atomically(run / "report.md", "the report")

    assert target.read_text() == PRECIOUS
    for name in _old_names(run):
        assert (run / name).is_symlink() if planted == "link" else (run / name).read_text() == "someone else's file"
    assert sweep_run.read_status(run)["state"] == "running" and not (run / "status.json").is_symlink()
    assert json.loads((run / "settings.json").read_text())["fingerprint"] == recorded.fingerprint
    from study.checkpoints import checkpoint_step

    assert checkpoint_step(run / "last.ckpt") == 3 and (run / "report.md").read_text() == "the report"
    written = {"status.json", "settings.json", "hparams.json", "last.ckpt", "report.md"}
    assert {p.name for p in run.iterdir()} == written | set(_old_names(run))  # no temporary file left behind


def test_a_link_at_the_target_itself_is_replaced_not_followed(tmp_path):
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from study.fit import VerifiedCheckpointIO

    target = _outside(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").symlink_to(target)
    (run / "last.ckpt").symlink_to(target)
    sweep_run.write_status(run, {"name": "run", "state": "finished"})
    VerifiedCheckpointIO(TorchCheckpointIO()).save_checkpoint({"global_step": 1}, run / "last.ckpt")
    assert target.read_text() == PRECIOUS
    assert not (run / "status.json").is_symlink() and not (run / "last.ckpt").is_symlink()


def test_the_checkpoint_is_written_in_a_folder_of_its_own_created_for_it(tmp_path, monkeypatch):
    """Lightning's writer opens the file by name, and fsspec moves its /tmp file onto that name (a copy, which
    follows a link, when /tmp is another file system, as on a tmpfs save_dir): the name must lie in a folder no
    other process could have planted into."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from study.fit import VerifiedCheckpointIO

    seen = []

    class Recording(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            seen.append(Path(path))
            assert not Path(path).exists() and Path(path).parent.is_dir()
            super().save_checkpoint(checkpoint, path, storage_options)

    (tmp_path / "checkpoints").mkdir()
    VerifiedCheckpointIO(Recording()).save_checkpoint({"global_step": 2}, tmp_path / "checkpoints" / "last.ckpt")
    assert seen[0].name == "last.ckpt" and seen[0].parent.parent == tmp_path / "checkpoints"
    assert seen[0].parent.name.startswith(".last.ckpt.") and seen[0].parent.name.endswith(".tmp")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["last.ckpt"]


def test_exclusive_creation_refuses_anything_already_at_the_name(tmp_path, monkeypatch):
    """Were the random name guessed and a link planted there, the create fails and a fresh name is drawn."""
    target = _outside(tmp_path)
    (tmp_path / ".status.json.guessed.tmp").symlink_to(target)
    calls = []

    def once_then_fresh(name):
        calls.append(name)
        return f".{name}.guessed.tmp" if len(calls) == 1 else f".{name}.fresh.tmp"

    monkeypatch.setattr(atomic, "unpredictable_name", once_then_fresh)
    atomic.write_text_atomically(tmp_path / "status.json", "{}")
    assert len(calls) == 2 and target.read_text() == PRECIOUS and (tmp_path / "status.json").read_text() == "{}"


@pytest.mark.slow
def test_links_planted_while_a_run_trains_are_not_followed(tmp_path, monkeypatch):
    """A real run of a tiny sweep; at each checkpoint save (mid-training) links are planted at every name the run
    used to write by (the pid is the one run.lock holds): the run finishes, and nothing outside is written."""
    from study.fit import VerifiedCheckpointIO
    from study.sweep import main
    from tests.test_sweep import status, write_spec

    target = _outside(tmp_path)
    spec = write_spec(tmp_path, {"temperature": [1.0]})
    run = tmp_path / "logs" / "tiny" / "T1_kall_softmax_s0"
    save = VerifiedCheckpointIO.save_checkpoint
    planted = []

    def plant_then_save(self, checkpoint, path, storage_options=None):
        for folder in (run, run / "checkpoints"):
            folder.mkdir(exist_ok=True)  # the first save makes checkpoints/; the planting comes just before it
            for name in _old_names(folder):
                if not os.path.lexists(folder / name):
                    (folder / name).symlink_to(target)
                    planted.append(folder / name)
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(VerifiedCheckpointIO, "save_checkpoint", plant_then_save)
    assert main(["--config", str(spec), "--no-estimate"]) == 0
    assert status(run)["state"] == "finished" and planted
    assert target.read_text() == PRECIOUS and all(p.is_symlink() for p in planted)


# ---- study report and study probe refuse links out of their folders, before any work --------------------------------
def _small_sweep(sweep: Path, temperatures: tuple[float, ...] = (0.1, 1.0)) -> Path:
    """Finished softmax runs (by default T 0.1 and 1) as a sweep leaves them, and their plan."""
    runs = []
    for t in temperatures:
        name = f"T{t:g}_kall_softmax_s0"
        params = {"temperature": t, "top_k": None, "normalizer": "softmax", "seed": 0}
        if (sweep / name).exists():
            runs.append({"name": name, "params": params})
            continue
        write_fake_run(sweep, name, params, {
            "train/loss": [(0, 5.0), (1, 4.0)], "val/ppl": [(2, 50.0)], "grad_norm/total": [(0, 1 / t), (1, 1 / t)],
        })  # fmt: skip
        runs.append({"name": name, "params": params})
    (sweep / "plan.json").write_text(json.dumps({"sweep": sweep.name, "runs": runs}))
    return sweep


def _one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_a_report_folder_that_is_a_link_out_is_refused_and_nothing_is_written_outside(tmp_path, capsys, monkeypatch):
    sweep = _small_sweep(tmp_path / "sweep")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "report.md").write_text(PRECIOUS)
    (sweep / "report").symlink_to(outside)
    monkeypatch.setattr("study.report.build.read_sweep", lambda *a: pytest.fail("work started before the refusal"))
    assert report_main([str(sweep)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"study report: refused, nothing written: {sweep / 'report'} is a link out of {sweep}")
    assert _entries(outside) == {"report.md": PRECIOUS.encode()}


def test_a_report_md_that_is_a_link_out_is_refused(tmp_path, capsys):
    sweep = _small_sweep(tmp_path / "sweep")
    target = _outside(tmp_path)
    (sweep / "report").mkdir()
    (sweep / "report" / "report.md").symlink_to(target)
    assert report_main([str(sweep)]) == 2
    assert f"{sweep / 'report' / 'report.md'} is a link out of {sweep}" in _one_line(capsys.readouterr().err)
    assert target.read_text() == PRECIOUS and (sweep / "report" / "report.md").is_symlink()


def test_a_link_inside_the_report_folder_is_replaced_by_a_regular_file(tmp_path, monkeypatch):
    """A link that stays inside the sweep is not refused; the new report replaces it without writing through it."""
    monkeypatch.setattr("study.report.build.figures", lambda primary, out: {})  # not what is tested: seconds saved
    sweep = _small_sweep(tmp_path / "sweep")
    (sweep / "notes.md").write_text("the sweep's own notes")
    (sweep / "report").mkdir()
    (sweep / "report" / "report.md").symlink_to(sweep / "notes.md")
    path = build_report(sweep)
    assert not path.is_symlink() and "T0.1_kall_softmax_s0" in path.read_text()
    assert (sweep / "notes.md").read_text() == "the sweep's own notes"


def test_a_report_out_folder_holding_other_files_is_refused(tmp_path, capsys):
    """The report replaces its folder as a whole: a folder with files it did not write is not replaced."""
    sweep = _small_sweep(tmp_path / "sweep")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text(PRECIOUS)
    assert report_main([str(sweep), "--out", str(out)]) == 2
    assert f"{out} holds thesis.tex, which no report writes" in _one_line(capsys.readouterr().err)
    assert _entries(out) == {"thesis.tex": PRECIOUS.encode()}


def test_probe_refuses_an_out_folder_with_a_link_out_before_loading_the_model(tmp_path, capsys, monkeypatch):
    from study.frozen.probe import command as probe

    target = _outside(tmp_path)
    out = tmp_path / "d"
    out.mkdir()
    (out / "probe.json").symlink_to(target)
    monkeypatch.setattr(probe, "check_args", lambda args: pytest.fail("work started before the refusal"))
    assert probe.main(["--model", "no-such-model", "--out", str(out)]) == 2
    assert _one_line(capsys.readouterr().err).startswith(f"study probe: {out / 'probe.json'} is a link out of {out}")
    assert target.read_text() == PRECIOUS and (out / "probe.json").is_symlink()


def test_probe_writes_its_json_and_figure_whole_and_never_through_a_link(tmp_path, monkeypatch):
    """A link that stays inside --out passes the check; the probe's files replace it, never follow it."""
    from study.frozen.probe import command as probe

    out = tmp_path / "d"
    out.mkdir()
    (out / "probe.png").write_text("an earlier figure")
    (out / "probe.json").symlink_to(out / "probe.png")
    report = {"seconds": 0.0, "results": []}
    monkeypatch.setattr(probe, "check_args", lambda args: [])
    monkeypatch.setattr(probe, "run_probe", lambda *a, **k: report)
    monkeypatch.setattr("study.frozen.probe.writers.write_figure", lambda report, out: None)
    monkeypatch.setattr("study.frozen.probe.writers.console_lines", lambda report: [])
    assert probe.main(["--model", "m", "--out", str(out), "--no-tensorboard"]) == 0
    assert not (out / "probe.json").is_symlink() and json.loads((out / "probe.json").read_text()) == report
    assert sorted(p.name for p in out.iterdir()) == ["probe.json"]  # the old folder's files went with it


# ---- the report is written whole: a kill or a full disk leaves the previous one --------------------------------------
def test_a_report_killed_after_its_first_figure_leaves_the_old_report_whole(tmp_path, monkeypatch):
    from study.report import figures

    sweep = _small_sweep(tmp_path / "sweep")
    build_report(sweep)
    before = _entries(sweep / "report")
    assert "report.md" in before and any(name.endswith(".png") for name in before)
    _small_sweep(sweep, (0.1, 0.3, 1.0))  # a run added: every figure of the new report differs from the old one
    save, saved = figures._save, []

    def killed_after_the_first_figure(fig, path):
        if saved:
            figures._plt().close(fig)
            raise KeyboardInterrupt  # what a kill between two figures leaves: the first one written, nothing after
        saved.append(path)
        save(fig, path)

    monkeypatch.setattr(figures, "_save", killed_after_the_first_figure)
    with pytest.raises(KeyboardInterrupt):
        build_report(sweep)
    assert saved and _entries(sweep / "report") == before  # no new figure beside the old report
    assert not [p.name for p in sweep.iterdir() if p.name.startswith(".")]  # nor a half-built folder beside it


def _on_a_full_disk(monkeypatch, suffix: str) -> None:
    """Every temporary file whose target ends in ``suffix`` is written to /dev/full: each write fails with ENOSPC
    in the kernel, below matplotlib, PIL and Python's file objects."""
    create = atomic.create_file_exclusively

    def full(folder, name):
        fd, path = create(folder, name)
        if not name.endswith(suffix):
            return fd, path
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), path

    monkeypatch.setattr(atomic, "create_file_exclusively", full)


def test_a_full_disk_while_a_figure_is_written_names_the_figure(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    _on_a_full_disk(monkeypatch, ".png")
    with pytest.raises(OSError) as raised:
        atomic.save_figure(fig, tmp_path / "curves.png", dpi=50)
    plt.close(fig)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "curves.png")
    assert "No space left on device" in str(raised.value) and "fileno" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_the_report_is_written_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    sweep = _small_sweep(tmp_path / "sweep")
    build_report(sweep)
    before = _entries(sweep / "report")
    _on_a_full_disk(monkeypatch, ".png")
    assert report_main([str(sweep)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"study report: could not write {sweep / 'report'}/") and ".png: " in line
    assert "No space left on device" in line and "fileno" not in line
    assert _entries(sweep / "report") == before
    assert not [p.name for p in sweep.iterdir() if p.name.startswith(".")]
