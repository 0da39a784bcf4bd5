"""`study.cachefolder`: checksums written at build, checked on use; damaged and half-built folders are rebuilt."""

from __future__ import annotations

import json
import os

import pytest

from study.cachefolder import CHECKSUMS, build_atomically, folder_problem, usable


def _build(folder):
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (folder / "sub").mkdir()
    (folder / "sub" / "config.json").write_text('{"a": 1}')


@pytest.fixture
def entry(tmp_path):
    target = tmp_path / "cache" / "entry"
    build_atomically(_build, target)
    return target


def test_a_built_folder_records_every_file_and_is_sound(entry):
    record = json.loads((entry / CHECKSUMS).read_text())["files"]
    assert sorted(record) == ["sub/config.json", "weights.bin"]
    assert record["weights.bin"]["size"] == 256 * 64
    assert folder_problem(entry) is None and usable(entry)
    assert [p.name for p in entry.parent.iterdir()] == ["entry"]  # no temporary folder left


def test_bytes_changed_in_place_are_seen(entry):
    with open(entry / "weights.bin", "r+b") as f:
        f.seek(1000)
        f.write(b"\0" * 4096)
    assert folder_problem(entry) == "weights.bin changed since it was built (SHA-256 differs)"


def test_the_cheap_check_reads_no_file_whose_stat_is_unchanged(entry, monkeypatch):
    import study.cachefolder

    monkeypatch.setattr(study.cachefolder, "file_sha256", lambda path: pytest.fail(f"hashed {path}"))
    assert folder_problem(entry) is None


def test_a_touched_but_unchanged_file_is_still_sound(entry):
    os.utime(entry / "weights.bin", ns=(1, 1))
    assert folder_problem(entry) is None  # hashed, same content


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda e: (e / "sub" / "config.json").unlink(), "sub/config.json is missing"),
        (lambda e: (e / "weights.bin").write_bytes(b"short"), "weights.bin has 5 bytes, 16384 when built"),
        (lambda e: (e / CHECKSUMS).unlink(), "it has no checksums.json (half-built, or built before caches were checked)"),
        (lambda e: (e / CHECKSUMS).write_text("{"), "its checksums.json is unreadable (JSONDecodeError)"),
    ],
)  # fmt: skip
def test_each_damage_is_named_and_the_folder_rebuilt(entry, damage, reason, capsys):
    damage(entry)
    assert folder_problem(entry) == reason
    assert not usable(entry) and not entry.exists()  # moved aside and removed
    assert f"cache {entry} is damaged ({reason}): rebuilding it" in capsys.readouterr().err
    build_atomically(_build, entry)
    assert folder_problem(entry) is None


def test_a_half_built_folder_in_the_way_is_replaced(tmp_path):
    """A folder left in place without its checksums (an older build, killed mid-way) used to make the rename fail
    with "[Errno 39] Directory not empty" on every later try."""
    target = tmp_path / "entry"
    target.mkdir()
    (target / "stray.bin").write_bytes(b"x")
    build_atomically(_build, target)
    assert folder_problem(target) is None and not (target / "stray.bin").exists()
