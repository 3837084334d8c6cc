"""`bundle copy` / `bundle-import copy` on a hostile source: the copy reads regular files only and
follows no link inside the bundle. A symlink (to a root-only file, to /dev/zero, as the blobs
folder), a FIFO, a folder or nothing where a file should be each end in one error line with its
documented id and exit code: no traceback, no hang, and nothing under a final name at DST."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from tests.kit.helpers import run_cli
from tests.kit.trustkit import error_id

#: The two CLIs: the exporter's `bundle copy` and the importer's `bundle-import copy`.
CLIS = ["bundle", "importer"]
SECRET = b"root:$6$not-for-the-bundle$secret-hash:19000:0:99999:7:::\n"
TIMEOUT = 60  # a copy that blocks on a FIFO must fail the test, not hang it



@pytest.fixture()
def src(pristine: Path, tmp_path: Path) -> Path:
    out = tmp_path / "src.bundle"
    shutil.copytree(pristine, out)
    return out


@pytest.fixture()
def secret(tmp_path: Path) -> Path:
    """Stands for /etc/shadow: a file only root may read, outside every bundle."""
    path = tmp_path / "shadow"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def _layer(bundle: Path) -> Path:
    """The biggest blob (a layer): what a crafted bundle would swap."""
    return max((bundle / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)


def _copy(cli: str, src: Path, dst: Path) -> tuple[int, str]:
    proc = run_cli(cli, "copy", str(src), str(dst), "-q", timeout=TIMEOUT)
    return proc.returncode, proc.stdout + proc.stderr


def _final_files(dst: Path) -> list[str]:
    """Files at DST under a name the copy gives only to a verified file (not NAME.partial)."""
    if not dst.exists():
        return []
    return sorted(str(p.relative_to(dst)) for p in dst.rglob("*")
                  if not p.is_dir() and not p.name.endswith(".partial"))


def _assert_refused(cli: str, src: Path, dst: Path, ref: str, code: int) -> str:
    rc, out = _copy(cli, src, dst)
    assert "Traceback" not in out, out
    assert error_id(out) == ref, out
    assert rc == code, out
    assert len([line for line in out.splitlines() if line.startswith("error[")]) == 1, out
    assert _final_files(dst) == [], out
    for p in dst.rglob("*") if dst.exists() else []:
        assert p.is_dir() or SECRET not in p.read_bytes(), p
    return out


@pytest.mark.parametrize("cli", CLIS)
def test_symlink_to_a_root_only_file_in_place_of_a_blob(cli: str, src: Path, secret: Path, tmp_path: Path) -> None:
    layer = _layer(src)
    layer.unlink()
    layer.symlink_to(secret)
    out = _assert_refused(cli, src, tmp_path / "dst", "not-a-regular-file", 3)
    assert layer.name in out and "symbolic link" in out


@pytest.mark.parametrize("cli", CLIS)
def test_symlink_to_a_root_only_file_in_place_of_an_unpinned_file(cli: str, src: Path, secret: Path,
                                                                   tmp_path: Path) -> None:
    """bundle.json.sig is not pinned by bundle.json: nothing but the copy itself would stop it."""
    (src / "bundle.json.sig").symlink_to(secret)
    out = _assert_refused(cli, src, tmp_path / "dst", "not-a-regular-file", 3)
    assert "bundle.json.sig" in out


@pytest.mark.parametrize("cli", CLIS)
def test_the_blob_folder_as_a_symlink(cli: str, src: Path, tmp_path: Path) -> None:
    """Even a link to the right bytes is refused: a bundle never holds links."""
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(src / "blobs"), str(elsewhere))
    (src / "blobs").symlink_to(elsewhere)
    out = _assert_refused(cli, src, tmp_path / "dst", "not-a-regular-file", 3)
    assert "blobs" in out and "symbolic link" in out


@pytest.mark.parametrize("cli", CLIS)
def test_a_fifo_in_place_of_a_blob(cli: str, src: Path, tmp_path: Path) -> None:
    layer = _layer(src)
    layer.unlink()
    os.mkfifo(layer)
    out = _assert_refused(cli, src, tmp_path / "dst", "not-a-regular-file", 3)
    assert layer.name in out and "FIFO" in out


@pytest.mark.parametrize("cli", CLIS)
def test_dev_zero_linked_in_place_of_a_blob(cli: str, src: Path, tmp_path: Path) -> None:
    layer = _layer(src)
    layer.unlink()
    layer.symlink_to("/dev/zero")
    out = _assert_refused(cli, src, tmp_path / "dst", "not-a-regular-file", 3)
    assert "/dev/zero" in out


@pytest.mark.parametrize("cli", CLIS)
def test_a_missing_blob(cli: str, src: Path, tmp_path: Path) -> None:
    layer = _layer(src)
    layer.unlink()
    out = _assert_refused(cli, src, tmp_path / "dst", "missing-file", 3)
    assert layer.name in out


@pytest.mark.parametrize("cli", CLIS)
def test_a_folder_in_place_of_a_blob(cli: str, src: Path, tmp_path: Path) -> None:
    layer = _layer(src)
    layer.unlink()
    layer.mkdir()
    out = _assert_refused(cli, src, tmp_path / "dst", "not-a-regular-file", 3)
    assert layer.name in out and "folder" in out


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.parametrize("make, ref, code", [(lambda p: p / "nonexistent", "bundle-not-found", 2),
                                             (lambda p: (p / "empty").mkdir() or p / "empty", "invalid-manifest", 4)],
                         ids=["no-such-path", "folder-without-bundle-json"])
def test_a_missing_source(cli: str, make: Callable[[Path], Path], ref: str, code: int, tmp_path: Path) -> None:
    _assert_refused(cli, make(tmp_path), tmp_path / "dst", ref, code)


@pytest.mark.parametrize("cli", CLIS)
def test_a_symlink_beside_a_tar(cli: str, src: Path, secret: Path, tmp_path: Path) -> None:
    """The importer beside FILE.tar is not pinned by the tar: a link there would be carried out."""
    usb = tmp_path / "usb"
    run_cli("bundle", "pack", str(src), str(usb / "one.tar"), check=True)
    (usb / "bundle-import.pyz").unlink()
    (usb / "bundle-import.pyz").symlink_to(secret)
    out = _assert_refused(cli, usb / "one.tar", tmp_path / "dst", "verification-failed", 3)
    assert "[importer-mismatch] bundle-import.pyz" in out and "(not-a-regular-file)" in out


@pytest.mark.parametrize("cli", CLIS)
def test_a_fifo_in_place_of_a_part(cli: str, src: Path, tmp_path: Path) -> None:
    usb = tmp_path / "usb"
    run_cli("bundle", "pack", str(src), str(usb / "c.tar"), "--split", "64K", check=True)
    part = sorted(usb.glob("c.tar.part*"))[0]
    part.unlink()
    os.mkfifo(part)
    out = _assert_refused(cli, usb / "c.tar.parts.json", tmp_path / "dst", "not-a-regular-file", 3)
    assert part.name in out and "FIFO" in out


@pytest.mark.parametrize("cli", CLIS)
def test_a_linked_folder_at_the_destination_is_not_written_through(cli: str, src: Path, tmp_path: Path) -> None:
    dst, elsewhere = tmp_path / "dst", tmp_path / "elsewhere"
    dst.mkdir()
    elsewhere.mkdir()
    (dst / "blobs").symlink_to(elsewhere)
    rc, out = _copy(cli, src, dst)
    assert (rc, error_id(out)) == (2, "unwritable-destination") and "Traceback" not in out, out
    assert list(elsewhere.iterdir()) == [] and (dst / "blobs").is_symlink()


@pytest.mark.parametrize("cli", CLIS)
def test_a_linked_partial_at_the_destination_is_replaced_not_followed(cli: str, src: Path, secret: Path,
                                                                       tmp_path: Path) -> None:
    layer = _layer(src)
    partial = tmp_path / "dst" / "blobs" / "sha256" / (layer.name + ".partial")
    partial.parent.mkdir(parents=True)
    partial.symlink_to(secret)
    rc, out = _copy(cli, src, tmp_path / "dst")
    assert rc == 0, out
    assert secret.read_bytes() == SECRET and (tmp_path / "dst" / "blobs" / "sha256" / layer.name).read_bytes() \
        == layer.read_bytes()


# --- the helper itself (importer/streams/fsutil.py), for what a test cannot build as a bundle file

def test_open_regular_refuses_a_device_by_its_own_name() -> None:
    """What a device bind-mounted over a blob's name looks like: no link, yet not a file."""
    from importer.errors import NotRegularFile
    from importer.streams.fsutil import open_regular

    with pytest.raises(NotRegularFile, match="character device"):
        open_regular("/dev/zero", "reading")


def test_open_regular_refuses_another_size_before_reading(tmp_path: Path) -> None:
    from importer.errors import SizeMismatch
    from importer.streams.fsutil import open_regular

    (tmp_path / "f").write_bytes(b"12345")
    with pytest.raises(SizeMismatch, match="expected 4 bytes"):
        open_regular(str(tmp_path / "f"), "reading", 4, root=str(tmp_path))


def test_read_exactly_reads_one_byte_past_the_size_at_most(tmp_path: Path) -> None:
    from importer.errors import SizeMismatch
    from importer.streams.fsutil import open_regular, read_exactly

    path = tmp_path / "f"
    path.write_bytes(b"a" * 10)
    with open_regular(str(path), "reading", 10) as f:
        path.write_bytes(b"a" * 1000)  # grows after the size check
        with pytest.raises(SizeMismatch, match="found more"):
            b"".join(read_exactly(f, 10, str(path), "reading", chunk=3))
        assert f.tell() == 11
