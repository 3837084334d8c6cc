"""Out of space, the place named (issue 40, point 4): small file systems mounted here (tmpfs, as
root). ``bundle export`` and ``bundle pack`` check the free space at the target before writing
and say how much they need; a write that still runs out (an export from Docker, whose image size
is only an estimate; packing while the staging folder is consumed; ``--engine oci``; a
recompression's temp folder) names the file, the folder and the space there, and leaves nothing
under the final name and no temp file.

Engines: none for the layout and pack checks; Docker 20.10 (``docker_host``) for the export from
Docker; a docker-registry for the recompression."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

from importer.errors import FileAccessError, os_error, write_error
from tests.kit import engines
from tests.kit.clijson import failed, ok, validate
from tests.kit.helpers import docker, run_cli, run_pyz
from tests.kit.spacekit import everything_under, small_fs
from tests.kit.transferkit import random_bundle
from tests.kit.trustkit import error_id


@pytest.fixture(scope="module")
def carry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """9 MiB of incompressible zstd layers (6 + 3 MiB), two images sharing the first; a bundle
    folder is an OCI layout too, so it is also the export's source of exact sizes."""
    return random_bundle(tmp_path_factory.mktemp("oos") / "carry.bundle", mb=(6, 3), compression="zstd")


def test_export_checks_the_free_space_first(carry: Path, tmp_path: Path) -> None:
    """A source that knows its blobs' sizes (an OCI layout): refused before a byte is written, the
    folder and both sizes named; the same for --archive (the staging folder is beside the archive)."""
    with small_fs(tmp_path / "usb", "4m") as usb:
        proc = run_cli("bundle", "export", f"oci:{carry}:carry/app:2", "-o", str(usb / "x.bundle"), "--json")
        doc = failed("export", proc, "insufficient-space", 6)
        message = doc["error"]["message"]
        assert f"exporting to {usb / 'x.bundle'}" in message and f"too little on {usb} " in message, message
        assert "need 10." in message and "available 4.0 MiB" in message, message
        assert "nothing was written" in doc["error"]["hint"]
        assert everything_under(usb) == []
        proc = run_cli("bundle", "export", f"oci:{carry}:carry/app:2", "--archive", str(usb / "x.tar"),
                       "--split", "1M")
        assert proc.returncode == 6 and error_id(proc.stderr) == "insufficient-space", proc.stderr
        assert str(usb / "x.tar") in proc.stderr and str(usb) in proc.stderr
        assert everything_under(usb) == []


def test_pack_checks_the_free_space_first_counting_what_force_replaces(carry: Path, tmp_path: Path) -> None:
    """`bundle pack` needs the members, their headers and the importer beside them; the parts an
    earlier pack left there count as free with --force (they are removed first)."""
    with small_fs(tmp_path / "usb", "4m") as usb:
        proc = run_cli("bundle", "pack", str(carry), str(usb / "x.tar"), "--split", "1M", "--json")
        doc = failed("pack", proc, "insufficient-space", 6)
        assert f"packing into {usb / 'x.tar'}" in doc["error"]["message"]
        need = re.search(r"need [\d.]+ MiB \((\d+) bytes\), available", doc["error"]["message"])
        members = sum(f.stat().st_size for f in carry.rglob("*") if f.is_file())
        assert need and members <= int(need.group(1)) < members + (1 << 20), doc["error"]["message"]
        assert everything_under(usb) == []
    with small_fs(tmp_path / "stick", "16m") as stick:
        ok("pack", run_cli("bundle", "pack", str(carry), str(stick / "x.tar"), "--split", "1M", "--json"))
        again = ok("pack", run_cli("bundle", "pack", str(carry), str(stick / "x.tar"), "--split", "1M", "--force",
                                   "--json"))
        assert len(again["parts"]) == 10
        refused = run_cli("bundle", "pack", str(carry), str(stick / "y.tar"))
        assert refused.returncode == 6 and error_id(refused.stderr) == "insufficient-space", refused.stderr


def test_oci_import_out_of_space_names_the_blob_and_the_layout(carry: Path, tmp_path: Path) -> None:
    """--engine oci into a full disk: the blob file, its folder and the space there; no temp file,
    index.json names nothing of this run."""
    with small_fs(tmp_path / "disk", "4m") as disk:
        out = disk / "layout"
        receipt = tmp_path / "r.json"
        proc = run_pyz(carry, "--engine", "oci", "--oci-dir", str(out), "--receipt", str(receipt), "--json")
        assert proc.returncode == 2, proc.stderr
        doc = json.loads(proc.stdout)
        validate("import", doc)
        error = doc["error"]
        assert error["id"] == "file-access" and "No space left on device (ENOSPC)" in error["message"], error
        assert f"into the OCI layout {out}: expected to write {out}/blobs/sha256/" in error["message"], error
        assert f"in the folder {out}/blobs/sha256" in error["message"] and "free of 4.0 MiB" in error["message"]
        assert f"free space on the file system of {out}/blobs/sha256" in error["hint"]
        assert json.loads(receipt.read_text())["error"]["id"] == "file-access"
        assert not [p for p in everything_under(disk) if ".tmp-" in p]
        assert not (out / "index.json").exists()


@pytest.mark.engine
def test_export_from_docker_and_packing_out_of_space_name_the_file(carry: Path, docker_host: str,
                                                                   tmp_path: Path) -> None:
    """Docker's image size counts the files uncompressed: the export says it may not fit and goes on;
    the write that runs out names the staging file and the folder, and nothing is left. Exported
    straight to parts, the staged bundle leaves too little to pack beside it (its largest blob once
    more): refused before the first part, nothing left (tests/test_disk_fills.py: a part that runs out)."""
    loaded = run_pyz(carry, "--docker-host", docker_host, "--no-receipt", "--quiet")
    assert loaded.returncode == 0, loaded.stderr
    try:
        with small_fs(tmp_path / "usb", "6m") as usb:
            proc = run_cli("bundle", "export", "carry/app:2", "-o", str(usb / "x.bundle"), "--json",
                           docker_host=docker_host)
            doc = failed("export", proc, "file-access", 2)
            message = doc["error"]["message"]
            assert "may not fit" in proc.stderr and "need 10." in proc.stderr, proc.stderr
            assert f"exporting to {usb / 'x.bundle'}: expected to write {usb}/x.bundle.partial-" in message, message
            assert f"in the folder {usb}, found No space left on device (ENOSPC)" in message, message
            assert f"nothing is left under {usb / 'x.bundle'}" in message
            assert everything_under(usb) == []
        with small_fs(tmp_path / "stick", "13m") as stick:
            proc = run_cli("bundle", "export", "carry/app:2", "--archive", str(stick / "x.tar"), "--split", "1M",
                           docker_host=docker_host)
            assert proc.returncode == 6 and error_id(proc.stderr) == "insufficient-space", proc.stderr
            assert f"packing into {stick / 'x.tar'}: expected enough free space" in proc.stderr
            assert "largest blob's size once more" in proc.stderr
            assert everything_under(stick) == []
    finally:
        docker(docker_host, "image", "rm", "carry/app:2", "carry/base:1", check=False)


@pytest.mark.engine
def test_recompression_out_of_space_names_the_temp_folder(carry: Path, tmp_path: Path) -> None:
    """`bundle-import --engine registry --compression gzip` with TMPDIR on a full disk: the
    recompressed layer's file and the private temp folder are named, TMPDIR suggested; nothing is
    pushed and the temp folder is gone."""
    with engines.private_registry(f"oos-{os.getpid()}") as reg, small_fs(tmp_path / "tmp", "2m") as tmp:
        proc = run_pyz(carry, "--engine", "registry", "--registry", f"{reg.addr}/site", "--compression", "gzip",
                       "--no-receipt", "--json", env={"TMPDIR": str(tmp)})
        assert proc.returncode == 2, proc.stderr
        error = json.loads(proc.stdout)["error"]
        assert error["id"] == "file-access", error
        assert "recompressing layer sha256:" in error["message"] and "to gzip: expected to write " in error["message"]
        assert f"in the folder {tmp}/sneakernet-import-" in error["message"], error
        assert "No space left on device (ENOSPC)" in error["message"] and "TMPDIR" in error["hint"], error
        assert everything_under(tmp) == []
        import urllib.request

        with urllib.request.urlopen(f"http://{reg.addr}/v2/_catalog", timeout=30) as r:
            assert json.loads(r.read())["repositories"] == []


def test_write_errors_name_the_file_the_folder_and_what_to_do(tmp_path: Path) -> None:
    """ENOSPC, EACCES and EIO of a write, as every CLI's boundary types them (a write names no file:
    the writer names it, importer/streams/fsutil.py)."""
    target = tmp_path / "out" / "blob"
    full = os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target)))
    assert isinstance(full, FileAccessError)
    assert f"expected to write {target} in the folder {target.parent}, found No space left on device (ENOSPC)" in \
        full.message and " free of " in full.message
    assert full.hint and f"free space on the file system of {target.parent}" in full.hint
    denied = write_error(OSError(errno.EACCES, os.strerror(errno.EACCES)), "writing the receipt", str(target))
    assert f"in the folder {target.parent}, found Permission denied (EACCES)" in denied.message
    assert denied.hint and f"write access to {target.parent}" in denied.hint
    broken = write_error(OSError(errno.EIO, os.strerror(errno.EIO)), "copying", str(target))
    assert "(EIO)" in broken.message and broken.hint and "I/O error" in broken.hint
    unknown = os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))  # nobody named it: still typed
    assert isinstance(unknown, FileAccessError) and "ENOSPC" in unknown.message
