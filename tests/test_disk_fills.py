"""A disk that fills during the work (issue 44, point 5): ``bundle export``, ``bundle pack``,
``bundle copy`` / ``bundle-import copy``, ``--files-to`` and ``--engine oci`` on a small real file
system (a tmpfs mounted here, as root: tests/kit/spacekit.py) that runs out while they write, after
any free-space check passed. Each says one error line naming the place, leaves nothing under the
final name and no temp file where the docs promise none, and once space is freed the same command
completes: copy, ``--files-to`` and ``--engine oci`` keep what they finished and resume; export and
pack left nothing of theirs, so the re-run needs no ``--force``.

Engines: none (the sources are OCI layouts and bundle folders; ``--engine oci`` writes a layout)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

import bundle.archive
import bundle.export
from bundle.cli import main as bundle_main
from tests.kit.clijson import failed, ok
from tests.kit.fileskit import model_bundle
from tests.kit.helpers import run_cli, run_pyz, run_zipapp
from tests.kit.spacekit import everything_under, fill, small_fs
from tests.kit.transferkit import random_bundle
from tests.kit.trustkit import error_id

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def carry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """9 MiB of incompressible zstd layers (6 + 3 MiB), two images sharing the first: a bundle
    folder, and an OCI layout to export from (a source that knows its sizes: the check is exact)."""
    return random_bundle(tmp_path_factory.mktemp("fills") / "carry.bundle", mb=(6, 3), compression="zstd")


@pytest.fixture(scope="module")
def packed(carry: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same bundle as one tar and as 1 MiB parts, each with the importer beside it."""
    out = tmp_path_factory.mktemp("packed")
    ok("pack", run_cli("bundle", "pack", str(carry), str(out / "tar" / "carry.tar"), "--json"))
    ok("pack", run_cli("bundle", "pack", str(carry), str(out / "parts" / "carry.tar"), "--split", "1M", "--json"))
    return {"folder": carry, "tar": out / "tar" / "carry.tar", "parts": out / "parts" / "carry.tar.parts.json"}


def _in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    """``bundle ARGV --json`` run here (so a test can fill the disk between the check and the
    writes): (exit code, the JSON document, stderr)."""
    rc = bundle_main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return rc, json.loads(out), err


def _fill_after(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, filler: Path, leave: int) -> None:
    """``module.name`` (a free-space check) passes as before, then the disk fills to ``leave`` bytes."""
    check: Callable[..., Any] = getattr(module, name)

    def then_fill(*args: Any, **kwargs: Any) -> Any:
        result = check(*args, **kwargs)
        fill(filler, leave)
        return result

    monkeypatch.setattr(module, name, then_fill)


def _no_temp(where: Path) -> None:
    left = [p for p in everything_under(where) if ".partial" in p or ".tmp-" in p or p.endswith(".part")]
    assert left == [], left


def test_export_that_fills_after_the_check_leaves_nothing_and_runs_again(
        carry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The check passed (an OCI layout's exact sizes fit), then something else filled the disk: the
    write that runs out names the staging file and the folder; the staging folder is removed,
    nothing is under -o; freed, the same command (no --force) makes the bundle."""
    with small_fs(tmp_path / "usb", "16m") as usb:
        filler = tmp_path / "usb" / "other-program.bin"
        target = usb / "x.bundle"
        argv = ["export", f"oci:{carry}:carry/app:2", "-o", str(target), "-q"]
        with monkeypatch.context() as m:
            _fill_after(m, bundle.export, "check_export_space", filler, 3 * MiB)
            rc, doc, err = _in_process(argv, capsys)
        assert rc == 2 and doc["error"]["id"] == "file-access", doc
        message = doc["error"]["message"]
        assert f"exporting to {target}: expected to write {usb}/x.bundle.partial-" in message, message
        assert "No space left on device (ENOSPC)" in message and f"nothing is left under {target}" in message
        assert f"free space on the file system of {usb}" in doc["error"]["hint"]
        assert err.count("error[file-access]") == 1, err
        assert everything_under(usb) == ["other-program.bin"]
        filler.unlink()
        rc, doc, err = _in_process(argv, capsys)
        assert rc == 0 and doc["ok"] is True, err
        ok("verify", run_pyz(target, "--verify-only", "--json"))


@pytest.mark.parametrize("leave,at", [(5, "staging"), (3, "parts")], ids=["staging", "parts"])
def test_export_archive_that_fills_leaves_no_part_and_runs_again(
        carry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        leave: int, at: str) -> None:
    """``export --archive --split``: the bundle is staged beside the parts, then consumed as they
    are written; the disk fills while staging (5 MiB left after the export's check) or at a part (3
    MiB left after the pack's): the file is named, no part, index, importer or staging folder is
    left; freed, the same command writes them all."""
    with small_fs(tmp_path / "usb", "24m") as usb:
        filler = tmp_path / "usb" / "other-program.bin"
        argv = ["export", f"oci:{carry}:carry/app:2", "--archive", str(usb / "x.tar"), "--split", "1M", "-q"]
        with monkeypatch.context() as m:
            checked = (bundle.export, "check_export_space") if at == "staging" else (bundle.archive, "check_pack_space")
            _fill_after(m, *checked, filler, leave * MiB)
            rc, doc, err = _in_process(argv, capsys)
        assert rc == 2 and doc["error"]["id"] == "file-access", doc
        message = doc["error"]["message"]
        assert "No space left on device (ENOSPC)" in message and f"in the folder {usb}, " in message, message
        written = f"{usb}/x.tar.partial-" if at == "staging" else f"{usb}/x.tar.part0"
        assert f"expected to write {written}" in message, message
        assert err.count("error[file-access]") == 1, err
        assert everything_under(usb) == ["other-program.bin"]
        filler.unlink()
        rc, doc, err = _in_process(argv, capsys)
        assert rc == 0 and doc["ok"] is True, err
        ok("verify", run_pyz(usb / "x.tar.parts.json", "--verify-only", "--json", pyz=usb / "bundle-import.pyz"))


@pytest.mark.parametrize("split", [None, "1M"], ids=["tar", "parts"])
def test_pack_that_fills_after_the_check_leaves_nothing_and_runs_again(
        carry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        split: str | None) -> None:
    """``bundle pack`` (one tar, or parts): the check passed, the disk filled; the tar or part being
    written is named, and what this run wrote (parts, the importer beside them) is removed, no
    temp file; freed, the same command (no --force: nothing of its own is left) packs it."""
    with small_fs(tmp_path / "usb", "16m") as usb:
        filler = tmp_path / "usb" / "other-program.bin"
        argv = ["pack", str(carry), str(usb / "x.tar"), *(["--split", split] if split else [])]
        with monkeypatch.context() as m:
            _fill_after(m, bundle.archive, "check_pack_space", filler, 4 * MiB)
            rc, doc, err = _in_process(argv, capsys)
        assert rc == 2 and doc["error"]["id"] == "file-access", doc
        message = doc["error"]["message"]
        written = f"{usb}/x.tar.part00" if split else f"{usb}/x.tar "
        assert f"packing into {usb / 'x.tar'}: expected to write {written}" in message, message
        assert f"in the folder {usb}, found No space left on device (ENOSPC)" in message, message
        assert err.count("error[file-access]") == 1, err
        assert everything_under(usb) == ["other-program.bin"]
        filler.unlink()
        rc, doc, err = _in_process(argv, capsys)
        assert rc == 0 and doc["ok"] is True, err
        target = usb / ("x.tar.parts.json" if split else "x.tar")
        ok("verify", run_pyz(target, "--verify-only", "--json", pyz=usb / "bundle-import.pyz"))


@pytest.mark.parametrize("kind,final", [("folder", "bundle.json"), ("tar", "carry.tar"),
                                        ("parts", "carry.tar.parts.json")])
def test_copy_onto_a_disk_that_fills_resumes_once_space_is_freed(
        packed: dict[str, Path], tmp_path: Path, kind: str, final: str) -> None:
    """``bundle copy`` (folder, tar) and ``bundle-import copy`` (parts) onto a stick that fills: the
    file being copied is named, what says "whole" (bundle.json, the tar, the parts index) is not
    there; freed, the same command keeps what it finished, resumes the cut file and verifies."""
    src = packed[kind]
    with small_fs(tmp_path / "usb", "16m") as usb:
        dst = usb / "carry"
        filler = fill(usb / "other-program.bin", 5 * MiB)
        if kind == "parts":
            pyz = src.parent / "bundle-import.pyz"
            argv: tuple[str, ...] = ("copy", str(src), str(dst), "--json")
            proc = run_zipapp(pyz, *argv)
        else:
            proc = run_cli("bundle", "copy", str(src), str(dst), "--json")
        doc = failed("copy", proc, "unwritable-destination", 2)
        message = doc["error"]["message"]
        assert proc.stderr.count("error[") == 1, proc.stderr
        assert f"copying to {dst}: expected to write {dst}/" in message, message
        assert "No space left on device (ENOSPC)" in message, message
        assert "it resumes" in doc["error"]["hint"], doc
        assert not (dst / final).exists()
        cut = [p for p in everything_under(dst) if p.endswith(".partial")]
        assert len(cut) <= 1, cut
        filler.unlink()
        proc = run_zipapp(pyz, *argv) if kind == "parts" else run_cli("bundle", "copy", str(src), str(dst), "--json")
        again = ok("copy", proc)
        assert again["skipped"] or again["resumed"], again
        assert again["verification"]["ok"] is True
        _no_temp(usb)


def test_files_to_a_disk_that_fills_resumes_once_space_is_freed(tmp_path: Path) -> None:
    """``bundle-import BUNDLE --files-to DIR`` (schema 3.6) onto a disk that fills: the file being
    written is named; no file is under its final name unless whole; freed, the same command writes
    the rest and removes its staging folder."""
    src, files = model_bundle(tmp_path / "m", mib=4)
    with small_fs(tmp_path / "disk", "8m") as disk:
        out = disk / "model"
        filler = fill(disk / "other-program.bin", 2 * MiB)
        proc = run_pyz(files, "--files-to", str(out), "--no-receipt", "--json")
        doc = failed("import", proc, "file-access", 2)
        message = doc["error"]["message"]
        assert "No space left on device (ENOSPC)" in message and str(out) in message, message
        assert error_id(proc.stderr) == "file-access" and proc.stderr.count("error[") == 1, proc.stderr
        assert not (out / "model.safetensors").exists()
        filler.unlink()
        ok("import", run_pyz(files, "--files-to", str(out), "--no-receipt", "--json"))
        assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
        assert [p for p in everything_under(out) if ".sneakernet-staging" in p] == []


def test_oci_import_onto_a_disk_that_fills_completes_once_space_is_freed(carry: Path, tmp_path: Path) -> None:
    """``--engine oci --oci-dir`` on a disk that fills: the blob and the layout are named, no temp
    file, index.json names nothing of this run; freed, the same command completes."""
    with small_fs(tmp_path / "disk", "16m") as disk:
        out = disk / "layout"
        filler = fill(disk / "other-program.bin", 5 * MiB)
        proc = run_pyz(carry, "--engine", "oci", "--oci-dir", str(out), "--no-receipt", "--json")
        doc = failed("import", proc, "file-access", 2)
        assert "No space left on device (ENOSPC)" in doc["error"]["message"], doc
        assert f"into the OCI layout {out}" in doc["error"]["message"] and proc.stderr.count("error[") == 1, doc
        assert not (out / "index.json").exists()
        _no_temp(disk)
        filler.unlink()
        ok("import", run_pyz(carry, "--engine", "oci", "--oci-dir", str(out), "--no-receipt", "--json"))
        refs = {m["annotations"]["org.opencontainers.image.ref.name"]
                for m in json.loads((out / "index.json").read_text())["manifests"]}
        assert {"carry/app:2", "carry/base:1"} <= refs or len(refs) == 2, refs
        _no_temp(disk)


def test_out_of_inodes_says_the_inodes_and_leaves_nothing(carry: Path, tmp_path: Path) -> None:
    """A file system that can hold no more files (a tmpfs's nr_inodes; an ext4 of many small files)
    fails a create with ENOSPC while bytes are free: the error gives the inodes free beside the
    bytes and the hint says either can run out; export leaves nothing, a copy no bundle.json, an
    import into an OCI layout (a blob's temp file could not be made) names the layout."""
    with small_fs(tmp_path / "few", "64m", inodes=6) as few:
        proc = run_cli("bundle", "export", f"oci:{carry}:carry/app:2", "-o", str(few / "x.bundle"), "--json")
        doc = failed("export", proc, "file-access", 2)
        message = doc["error"]["message"]
        assert "ENOSPC" in message and " free of 64.0 MiB and " in message and " of 6 inodes " in message, message
        assert "`df -i`" in doc["error"]["hint"], doc
        assert everything_under(few) == []
        proc = run_cli("bundle", "copy", str(carry), str(few / "c"), "--json")
        doc = failed("copy", proc, "unwritable-destination", 2)
        assert " of 6 inodes " in doc["error"]["message"] and "it resumes" in doc["error"]["hint"], doc
        assert "`df -i`" in doc["error"]["hint"], doc
        assert not (few / "c" / "bundle.json").exists()
        shutil.rmtree(few / "c")
        proc = run_pyz(carry, "--engine", "oci", "--oci-dir", str(few / "l"), "--no-receipt", "--json")
        doc = failed("import", proc, "file-access", 2)
        assert f"into the OCI layout {few / 'l'}: expected to write {few}/l/blobs/sha256/" in doc["error"]["message"]
        assert " of 6 inodes " in doc["error"]["message"] and not (few / "l" / "index.json").exists(), doc
        _no_temp(few)


@pytest.mark.parametrize("archive", [False, True], ids=["folder", "archive"])
def test_export_names_what_a_killed_export_left(carry: Path, tmp_path: Path, archive: bool) -> None:
    """An export killed outright (kill -9, a power cut) cannot remove its staging folder; on a disk
    that is then too small, the refusal names that folder to delete (a failed export leaves none)."""
    with small_fs(tmp_path / "usb", "20m") as usb:
        left = usb / (".x.tar.export-0123456789ab.partial-k1ll3d" if archive else "x.bundle.partial-k1ll3d")
        (left / "blobs").mkdir(parents=True)
        (left / "blobs" / "cut").write_bytes(b"\0" * (12 * MiB))
        target = ["--archive", str(usb / "x.tar"), "--split", "1M"] if archive else ["-o", str(usb / "x.bundle")]
        proc = run_cli("bundle", "export", f"oci:{carry}:carry/app:2", *target, "--json")
        doc = failed("export", proc, "insufficient-space", 6)
        assert f"delete {left} (left by an export that was killed" in doc["error"]["hint"], doc
        shutil.rmtree(left)
        ok("export", run_cli("bundle", "export", f"oci:{carry}:carry/app:2", *target, "--json"))


def test_export_archive_that_cannot_be_packed_beside_its_staging_says_so_before_writing(
        carry: Path, tmp_path: Path) -> None:
    """``export --archive`` packs the staged bundle beside it, deleting each blob once packed: the
    peak is the bundle and its largest blob once more. The export fits (10.1 MiB on 13 MiB), the
    pack would not: refused before the first byte of the tar, naming what it needs; nothing left."""
    with small_fs(tmp_path / "usb", "13m") as usb:
        proc = run_cli("bundle", "export", f"oci:{carry}:carry/app:2", "--archive", str(usb / "x.tar"), "--json")
        doc = failed("export", proc, "insufficient-space", 6)
        assert f"packing into {usb / 'x.tar'}: expected enough free space" in doc["error"]["message"], doc
        assert "largest blob's size once more" in doc["error"]["hint"], doc
        assert everything_under(usb) == []
