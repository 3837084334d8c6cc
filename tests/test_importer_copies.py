"""The importer a user runs must be the one that was signed (issue 24, class 1).

A tar or parts set carries ``bundle-import.pyz`` beside it, and the docs tell the user to run
that file. A swapped copy next to a correctly signed archive must make a trusted importer's
verification fail loudly (and ``copy`` refuse it), and the exporter prints the digest a user can
check with ``sha256sum`` before running anything from the medium."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

from tests.kit.helpers import run_cli
from tests.kit.transferkit import random_bundle
from tests.kit.trustkit import error_id, keypair, sign


def _evil_pyz(size: int | None = None) -> bytes:
    """A zipapp that prints what a verified run prints and exits 0: what an attacker leaves beside
    a signed tar. With ``size``, padded to exactly that many bytes (a same-size swap)."""
    import io

    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("__main__.py", "print('verified: every file matches bundle.json')\n")
    data = buf.getvalue()
    if size is not None:
        assert len(data) <= size
        data += b"\0" * (size - len(data))  # zip readers find the end record from the back: still runs
    return data


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keypair(tmp_path_factory.mktemp("keys"), "publisher")


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    b = random_bundle(tmp_path_factory.mktemp("imp") / "carry.bundle", mb=(1, 1))
    sign(b, keys[0])
    return b


def _pack(bundle: Path, where: Path, kind: str) -> Path:
    """The bundle as a tar or as parts in ``where``; returns what to give the importer."""
    split = ["--split", "1M"] if kind == "parts" else []
    run_cli("bundle", "pack", str(bundle), str(where / "carry.tar"), *split, check=True)
    return where / ("carry.tar.parts.json" if kind == "parts" else "carry.tar")


def _trusted_verify(target: Path, pub: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The importer installed on the host (trusted), verifying the carried bundle."""
    return run_cli("importer", str(target), "--verify-only", "--trust", str(pub), *extra, timeout=300)


@pytest.mark.parametrize("kind", ["tar", "parts"])
def test_an_untouched_importer_beside_the_archive_verifies(signed: Path, keys: tuple[Path, Path], tmp_path: Path,
                                                           kind: str) -> None:
    target = _pack(signed, tmp_path, kind)
    proc = _trusted_verify(target, keys[1])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("swap", ["other-size", "same-size"])
@pytest.mark.parametrize("kind", ["tar", "parts"])
def test_a_swapped_importer_beside_a_signed_archive_fails_verification(
        signed: Path, keys: tuple[Path, Path], tmp_path: Path, kind: str, swap: str) -> None:
    target = _pack(signed, tmp_path, kind)
    pyz = tmp_path / "bundle-import.pyz"
    pyz.write_bytes(_evil_pyz(pyz.stat().st_size if swap == "same-size" else None))
    proc = _trusted_verify(target, keys[1])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert error_id(proc.stderr) == "verification-failed"
    assert "[importer-mismatch] bundle-import.pyz beside carry.tar" in proc.stderr
    assert "do NOT run it" in proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(_trusted_verify(target, keys[1], "--json").stdout)
    assert [p["id"] for p in doc["problems"]] == ["importer-mismatch"]


@pytest.mark.parametrize("odd", ["symlink", "fifo", "folder"])
def test_an_importer_that_is_not_a_regular_file_is_refused_without_reading_it(
        signed: Path, keys: tuple[Path, Path], tmp_path: Path, odd: str) -> None:
    target = _pack(signed, tmp_path, "tar")
    pyz = tmp_path / "bundle-import.pyz"
    real = tmp_path / "elsewhere.pyz"
    real.write_bytes(pyz.read_bytes())  # a link to the right bytes is still not the file the user runs
    pyz.unlink()
    if odd == "symlink":
        pyz.symlink_to(real)
    elif odd == "fifo":
        os.mkfifo(pyz)
    else:
        pyz.mkdir()
    proc = _trusted_verify(target, keys[1])  # a FIFO must not hang it: the run's timeout would fail the test
    assert proc.returncode == 3, proc.stderr
    assert "[importer-mismatch]" in proc.stderr and "cannot be checked" in proc.stderr


def test_the_parts_index_cannot_vouch_for_a_swapped_importer(signed: Path, keys: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    """The parts index is not signed: an attacker who swaps the pyz rewrites its record too."""
    target = _pack(signed, tmp_path, "parts")
    evil = _evil_pyz()
    (tmp_path / "bundle-import.pyz").write_bytes(evil)
    index = json.loads(target.read_text())
    index["importer"] = {"path": "bundle-import.pyz", "digest": "sha256:" + hashlib.sha256(evil).hexdigest(),
                         "size": len(evil)}
    target.write_text(json.dumps(index))
    proc = _trusted_verify(target, keys[1])
    assert proc.returncode == 3 and "[importer-mismatch]" in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", ["tar", "parts"])
@pytest.mark.parametrize("copier", ["bundle", "importer"])
def test_copy_refuses_a_swapped_importer_before_writing(signed: Path, tmp_path: Path, kind: str,
                                                        copier: str) -> None:
    usb = tmp_path / "usb"
    usb.mkdir()
    target = _pack(signed, usb, kind)
    (usb / "bundle-import.pyz").write_bytes(_evil_pyz())
    dst = tmp_path / "disk"
    proc = run_cli(copier, "copy", str(target), str(dst), timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert error_id(proc.stderr) == "verification-failed" and "[importer-mismatch]" in proc.stderr
    assert not dst.exists() or not any(dst.iterdir()), "nothing may be copied"


def test_copy_checks_the_importer_it_copied(signed: Path, tmp_path: Path) -> None:
    """An importer swapped at the source while it is being copied (after the plan checked it) is
    caught by the digest check of the copy itself: the bad bytes never reach DST under its name."""
    usb = tmp_path / "usb"
    usb.mkdir()
    target = _pack(signed, usb, "tar")
    good = (usb / "bundle-import.pyz").read_bytes()
    dst = tmp_path / "disk"
    ok = run_cli("bundle", "copy", str(target), str(dst), "--json", timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert (dst / "bundle-import.pyz").read_bytes() == good
    # DST's copy damaged afterwards: verifying DST (as the far side does) names it
    (dst / "bundle-import.pyz").write_bytes(_evil_pyz(len(good)))
    proc = run_cli("importer", str(dst / "carry.tar"), "--verify-only", timeout=300)
    assert proc.returncode == 3 and "[importer-mismatch]" in proc.stderr, proc.stderr


def test_export_prints_the_importer_digest_to_check_before_running_it(tmp_path: Path) -> None:
    """`bundle export` (and pack) end with the pyz's sha256, which `sha256sum` reproduces."""
    src = random_bundle(tmp_path / "src.bundle", mb=(1, 1))
    layout = tmp_path / "layout"
    proc = run_cli("importer", str(src), "--engine", "oci", "--oci-dir", str(layout), "--no-receipt", timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out.bundle"
    proc = run_cli("bundle", "export", f"oci:{layout}:carry/app:2", "-o", str(out), "--archive",
                   str(tmp_path / "usb" / "out.tar"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    real = hashlib.sha256((out / "bundle-import.pyz").read_bytes()).hexdigest()
    beside = hashlib.sha256((tmp_path / "usb" / "bundle-import.pyz").read_bytes()).hexdigest()
    assert real == beside
    lines = re.findall(r"^importer: (\S+) is sha256 ([0-9a-f]{64});.*`sha256sum \S+`", proc.stdout, re.MULTILINE)
    assert (str(out / "bundle-import.pyz"), real) in lines, proc.stdout
    assert (str(tmp_path / "usb" / "bundle-import.pyz"), real) in lines, proc.stdout
    doc = json.loads(run_cli("bundle", "export", f"oci:{layout}:carry/app:2", "-o", str(tmp_path / "j.bundle"),
                             "--json", check=True, timeout=300).stdout)
    assert doc["importer"]["digest"] == "sha256:" + real
    sums = subprocess.run(["sha256sum", doc["importer"]["path"]], capture_output=True, text=True, check=True)
    assert sums.stdout.split()[0] == real


def test_first_run_check_by_hand_on_a_tar(signed: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    """docs/security.md, "First run": the tar's bundle.json and signature out with tar, checked with
    openssl, and the importer beside it found in that signed bundle.json, all before running Python."""
    target = _pack(signed, tmp_path, "tar")
    doc = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    block = doc.split("<!-- first-run-tar -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    for old, new in (("/tmp/", f"{scratch}/"), ("/media/usb", str(tmp_path)), ("train.tar", target.name),
                     ("/etc/sneakernet/trusted.d/publisher.pub", str(keys[1]))):
        assert old in block
        block = block.replace(old, new)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-ec", block], capture_output=True, text=True, timeout=60, check=False)

    proc = run()
    assert proc.returncode == 0 and "Signature Verified Successfully" in proc.stdout, proc.stdout + proc.stderr
    assert "importer pinned" in proc.stdout
    (tmp_path / "bundle-import.pyz").write_bytes(_evil_pyz())
    proc = run()
    assert proc.returncode != 0 and "importer pinned" not in proc.stdout
    assert target.exists()


def test_a_fifo_beside_the_archive_does_not_block_the_copy_plan(signed: Path, tmp_path: Path) -> None:
    usb = tmp_path / "usb"
    usb.mkdir()
    target = _pack(signed, usb, "tar")
    (usb / "bundle-import.pyz").unlink()
    os.mkfifo(usb / "bundle-import.pyz")
    result: list[subprocess.CompletedProcess[str]] = []
    t = threading.Thread(target=lambda: result.append(run_cli("bundle", "copy", str(target), str(tmp_path / "d"),
                                                                 timeout=120)))
    t.start()
    t.join(150)
    assert result and result[0].returncode == 3, result
