"""FAT32 targets (issue 44, point 5): no file of 4 GiB or more fits, so `bundle pack` /
`bundle export --archive` onto FAT split by themselves (and say so), while `bundle export -o DIR`
and `bundle copy` refuse a file that would not fit before leaving anything there. A real vfat
file system (loop-mounted, tests/kit/spacekit.py); the 4 GiB limit is lowered with the test
hook SNEAKERNET_TEST_FAT_LIMIT (importer/streams/fatfs.py) so that megabytes stand for gigabytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from importer.streams import fatfs
from tests.kit.helpers import run_cli, run_pyz
from tests.kit.spacekit import everything_under, vfat_fs
from tests.kit.transferkit import random_bundle

MiB = 1024 * 1024
HOOK = {fatfs.TEST_LIMIT_ENV: str(MiB)}  # "4 GiB" is 1 MiB here


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_bundle(tmp_path_factory.mktemp("fat") / "carry.bundle", mb=(3, 1))


def _kernel_mounts_vfat() -> bool:
    """Whether this kernel has a vfat driver (registered, or a module it can load): the real
    mount runs only there. This machine kind's kernel has none, so CI runs the declared folder."""
    if "vfat" in Path("/proc/filesystems").read_text(encoding="utf-8").split():
        return True
    return any(Path("/lib/modules").glob("*/kernel/fs/fat/vfat.ko*"))


@pytest.fixture(params=["declared", *(["vfat"] if _kernel_mounts_vfat() else [])])
def stick(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """vfat: a real loop-mounted vfat image; declared: a plain folder that a copy of the mount
    table (the SNEAKERNET_TEST_MOUNTINFO hook) says is vfat, for kernels that cannot mount one."""
    if request.param == "vfat":
        with vfat_fs(tmp_path / "stick") as mounted:
            yield mounted
        return
    folder = tmp_path / "stick"
    folder.mkdir()
    table = tmp_path / "mountinfo"
    real = Path("/proc/self/mountinfo").read_text(encoding="utf-8")
    table.write_text(real + f"999 1 0:99 / {folder} rw - vfat /dev/loop99 rw\n", encoding="utf-8")
    monkeypatch.setitem(HOOK, fatfs.TEST_MOUNTINFO_ENV, str(table))
    monkeypatch.setenv(fatfs.TEST_MOUNTINFO_ENV, str(table))
    yield folder


def test_the_file_system_type_is_read_from_the_mount_table(stick: Path, tmp_path: Path) -> None:
    assert fatfs.fs_type(str(stick)) == "vfat" and fatfs.is_fat(str(stick / "not" / "yet" / "made.tar"))
    assert not fatfs.is_fat(str(tmp_path / "elsewhere"))


def test_pack_onto_fat_without_split_writes_parts_and_says_so(bundle: Path, stick: Path) -> None:
    proc = run_cli("bundle", "pack", str(bundle), str(stick / "carry.tar"), env=HOOK, check=True)
    assert proc.stderr.count("note:") == 1 and "FAT (vfat)" in proc.stderr and "no --split" in proc.stderr
    parts = sorted(stick.glob("carry.tar.part[0-9]*"))
    assert len(parts) > 3 and all(p.stat().st_size < MiB for p in parts) and not (stick / "carry.tar").exists()
    assert run_pyz(stick / "carry.tar.parts.json", "--verify-only", pyz=stick / "bundle-import.pyz").returncode == 0
    # a --split FAT cannot hold is cut smaller too; one it can hold is kept
    again = run_cli("bundle", "pack", str(bundle), str(stick / "b.tar"), "--split", "2M", env=HOOK, check=True)
    assert "--split of 2097152 bytes" in again.stderr
    kept = run_cli("bundle", "pack", str(bundle), str(stick / "c.tar"), "--split", "512K", "--force", env=HOOK,
                   check=True)
    assert "note:" not in kept.stderr and (stick / "c.tar.part000").stat().st_size == 512 * 1024


def test_pack_elsewhere_is_unchanged(bundle: Path, tmp_path: Path) -> None:
    proc = run_cli("bundle", "pack", str(bundle), str(tmp_path / "carry.tar"), env=HOOK, check=True)
    assert "note:" not in proc.stderr and (tmp_path / "carry.tar").stat().st_size > 3 * MiB


def test_copy_of_a_too_big_file_onto_fat_is_refused_before_writing(bundle: Path, stick: Path,
                                                                     tmp_path: Path) -> None:
    for cli in ("bundle", "importer"):
        proc = run_cli(cli, "copy", str(bundle), str(stick / "carry.bundle"), env=HOOK)
        assert proc.returncode == 2 and "error[fat-file-too-big]" in proc.stderr, proc.stderr
        assert "blobs/sha256/" in proc.stderr and "--split 3900M" in proc.stderr and "exFAT" in proc.stderr
        assert "Traceback" not in proc.stderr and everything_under(stick) == []
    run_cli("bundle", "copy", str(bundle), str(tmp_path / "copy"), env=HOOK, check=True)  # not FAT: as before


def test_folder_export_of_a_too_big_file_onto_fat_is_refused_with_nothing_left(stick: Path, tmp_path: Path) -> None:
    files = tmp_path / "weights"
    files.mkdir()
    (files / "model.bin").write_bytes(os.urandom(2 * MiB))
    carry = ("bundle", "export", "--files", str(files), "--artifact-ref", "models/w:1")
    proc = run_cli(*carry, "-o", str(stick / "w.bundle"), env=HOOK)
    assert proc.returncode == 2 and "error[fat-file-too-big]" in proc.stderr, proc.stderr
    assert "2097152 bytes" in proc.stderr and "vfat" in proc.stderr
    assert "--archive FILE.tar --split 3900M" in proc.stderr
    assert "Traceback" not in proc.stderr and everything_under(stick) == []
    # the same export as an archive onto the stick: parts, each under the limit
    ok = run_cli(*carry, "--archive", str(stick / "w.tar"), env=HOOK, check=True)
    assert "note:" in ok.stderr and all(p.stat().st_size < MiB for p in stick.glob("w.tar.part[0-9]*"))
    assert (stick / "w.tar.parts.json").exists() and not list(stick.glob(".w.tar.export-*"))
