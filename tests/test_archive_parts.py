"""One tar, media-sized parts (issue 5): `bundle pack` / `bundle export --archive --split`, the
parts index, the importer reading a tar or a set of parts in place (one sequential pass, no
concatenation), and every part defect named: missing, extra, reordered, truncated, corrupted."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import jsonschema
import pytest

from tests.kit import engines
from tests.kit.fuzzkit import flip_byte
from tests.kit.helpers import docker, image_facts, run_cli, run_pyz
from tests.kit.imagegen import simple_context
from tests.kit.transferkit import random_bundle

REPO = Path(__file__).resolve().parents[1]
PARTS_SCHEMA = json.loads((REPO / "schemas" / "parts" / "parts-v1.schema.json").read_text())
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_bundle(tmp_path_factory.mktemp("arch") / "carry.bundle")


@pytest.fixture(scope="module")
def parts(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """carry.tar cut into 2 MiB parts; returns the folder holding them."""
    out = tmp_path_factory.mktemp("parts")
    run_cli("bundle", "pack", str(bundle), str(out / "carry.tar"), "--split", "2M", check=True)
    return out


def pyz(folder: Path, target: Path, *args: str, docker_host: str | None = None) -> subprocess.CompletedProcess[str]:
    """The importer written beside the archive, run as a user does (python3 -I, no PYTHONPATH)."""
    return run_pyz(target, *args, pyz=folder / "bundle-import.pyz", docker_host=docker_host, timeout=600)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_tar_holds_bundle_json_sums_and_importer_first(bundle: Path, tmp_path: Path) -> None:
    out = run_cli("bundle", "pack", str(bundle), str(tmp_path / "one.tar"), "--json", check=True)
    res = json.loads(out.stdout)
    with tarfile.open(tmp_path / "one.tar") as tar:
        names = tar.getnames()
        assert names[:3] == ["bundle.json", "SHA256SUMS", "bundle-import.pyz"]
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
        pyz_member = tar.extractfile("bundle-import.pyz")
        assert pyz_member is not None
        assert (tmp_path / "bundle-import.pyz").read_bytes() == pyz_member.read()  # the same importer beside
    files = json.loads((bundle / "bundle.json").read_text())["files"]
    assert sorted(names) == sorted(["bundle.json", "SHA256SUMS"] + [f["path"] for f in files])
    assert res["digest"] == _sha((tmp_path / "one.tar").read_bytes()) and res["parts"] == []


def test_parts_are_no_larger_than_size_and_join_to_the_same_tar(bundle: Path, parts: Path, tmp_path: Path) -> None:
    index = json.loads((parts / "carry.tar.parts.json").read_text())
    assert not list(jsonschema.Draft202012Validator(PARTS_SCHEMA).iter_errors(index))
    names = [p["name"] for p in index["parts"]]
    assert names == [f"carry.tar.part{i:03d}" for i in range(len(names))] and len(names) >= 5
    assert sorted(p.name for p in parts.glob("carry.tar.part[0-9]*")) == names
    joined = b""
    for rec in index["parts"]:
        data = (parts / rec["name"]).read_bytes()
        assert len(data) == rec["size"] <= 2 * MiB and _sha(data) == rec["digest"]
        joined += data
    assert all(p["size"] == 2 * MiB for p in index["parts"][:-1])  # even parts: only the last is short
    assert _sha(joined) == index["archive"]["digest"] and len(joined) == index["archive"]["size"]
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "carry.tar"), check=True)
    assert (tmp_path / "carry.tar").read_bytes() == joined  # the same stream, cut
    assert index["bundle"]["digest"] == _sha((bundle / "bundle.json").read_bytes())
    assert index["importer"]["digest"] == _sha((parts / "bundle-import.pyz").read_bytes())


@pytest.mark.parametrize("name", ["carry.tar.parts.json", "carry.tar.part002", "carry.tar"])
def test_verify_only_reads_the_parts_in_place(parts: Path, name: str) -> None:
    proc = pyz(parts, parts / name, "--verify-only", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["verification"]
    assert report["ok"] and report["layersChecked"] == 2 and report["filesChecked"] == 9
    assert not (parts / "carry.tar").exists()  # nothing joined, nothing unpacked
    assert sorted(p.name for p in parts.iterdir()) == sorted(
        [f"carry.tar.part{i:03d}" for i in range(len(list(parts.glob('carry.tar.part[0-9]*'))))]
        + ["carry.tar.parts.json", "bundle-import.pyz"])


def test_verify_only_reads_a_single_tar(bundle: Path, tmp_path: Path) -> None:
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "one.tar"), check=True)
    proc = pyz(tmp_path, tmp_path / "one.tar", "--verify-only", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verification"]["layersChecked"] == 2


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


DEFECTS = {
    "missing": (lambda d: (d / "carry.tar.part002").unlink(), "missing-part", "carry.tar.part002"),
    "extra": (lambda d: shutil.copy(d / "carry.tar.part001", d / "carry.tar.part009"), "extra-part",
              "carry.tar.part009"),
    "reordered": (lambda d: _swap(d / "carry.tar.part001", d / "carry.tar.part002"), "reordered-part",
                  "carry.tar.part001"),
    "truncated": (lambda d: os.truncate(d / "carry.tar.part003", 1000), "truncated-part", "carry.tar.part003"),
    "corrupted": (lambda d: flip_byte(d / "carry.tar.part002", MiB), "part-digest-mismatch", "carry.tar.part002"),
    "corrupted-first": (lambda d: flip_byte(d / "carry.tar.part000", 100), "part-digest-mismatch", "carry.tar.part000"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_every_part_defect_is_named(parts: Path, tmp_path: Path, defect: str) -> None:
    damage, problem_id, part = DEFECTS[defect]
    copy = tmp_path / "p"
    shutil.copytree(parts, copy)
    damage(copy)
    proc = pyz(copy, copy / "carry.tar.parts.json", "--verify-only", "--json")
    assert proc.returncode == 3, proc.stderr
    assert f"[{problem_id}] {part}" in proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert {"id": problem_id, "path": part} in [{"id": p["id"], "path": p["path"]} for p in problems]


def test_a_damaged_blob_in_a_single_tar_is_named(bundle: Path, tmp_path: Path) -> None:
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "one.tar"), check=True)
    with tarfile.open(tmp_path / "one.tar") as tar:
        biggest = max(tar.getmembers(), key=lambda m: m.size)
    flip_byte(tmp_path / "one.tar", biggest.offset_data + biggest.size // 2)
    proc = pyz(tmp_path, tmp_path / "one.tar", "--verify-only")
    assert proc.returncode == 3
    assert f"[digest-mismatch] {biggest.name}" in proc.stderr


def test_bundle_json_must_come_first(bundle: Path, tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "handmade.tar", "w") as tar:
        for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
            tar.add(path, arcname=str(path.relative_to(bundle)))  # blobs/ sorts before bundle.json
    proc = run_cli("importer", str(tmp_path / "handmade.tar"), "--verify-only")
    assert proc.returncode == 4
    assert "expected bundle.json as the first member" in proc.stderr and "bundle pack" in proc.stderr


def test_split_size_and_stale_parts(bundle: Path, tmp_path: Path) -> None:
    tiny = run_cli("bundle", "pack", str(bundle), str(tmp_path / "c.tar"), "--split", "4")
    assert tiny.returncode == 2 and "at least 65536 bytes" in tiny.stderr
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "c.tar"), "--split", "1M", check=True)
    many = len(list(tmp_path.glob("c.tar.part[0-9]*")))
    again = run_cli("bundle", "pack", str(bundle), str(tmp_path / "c.tar"), "--split", "4M")
    assert again.returncode == 2 and "--force" in again.stderr
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "c.tar"), "--split", "4M", "--force", check=True)
    left = sorted(p.name for p in tmp_path.glob("c.tar.part[0-9]*"))
    assert len(left) < many and left == [f"c.tar.part{i:03d}" for i in range(len(left))]  # no stale part
    assert pyz(tmp_path, tmp_path / "c.tar.parts.json", "--verify-only").returncode == 0


# ------------------------------------------------------------------ with a real engine


@pytest.mark.engine
def test_import_into_docker_straight_from_the_parts(parts: Path, bundle: Path, docker_host: str) -> None:
    doc = json.loads((bundle / "bundle.json").read_text())
    proc = pyz(parts, parts / "carry.tar.parts.json", "--verify", "--engine", "docker", "--json", "--no-receipt",
               docker_host=docker_host)
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt["result"] == "pass" and [c["result"] for c in receipt["images"]] == ["match", "match"]
    try:
        for image in doc["images"]:
            facts = image_facts(docker_host, image["refs"][0])
            assert facts is not None and facts[0] == image["config"]["digest"]
            assert facts[1] == [x["diffId"] for x in image["layers"]]
    finally:
        docker(docker_host, "image", "rm", "carry/app:2", "carry/base:1", check=False)


@pytest.mark.engine
def test_export_archive_split_then_import_from_the_parts(docker_host: str, busybox: str, tmp_path: Path) -> None:
    image_id = engines.build_image(docker_host, simple_context(tmp_path / "ctx", busybox, "parts"), "parts/app:1")
    media = tmp_path / "usb"
    out = run_cli("bundle", "export", "parts/app:1", "--archive", str(media / "app.tar"), "--split", "256K",
                  "--json", docker_host=docker_host, check=True)
    res = json.loads(out.stdout)["archive"]
    assert res["archive"] == str(media / "app.tar.parts.json") and len(res["parts"]) >= 2
    assert sorted(p.name for p in media.iterdir()) == sorted(
        [p["name"] for p in res["parts"]] + ["app.tar.parts.json", "bundle-import.pyz"])  # no staging left
    docker(docker_host, "image", "rm", "parts/app:1")
    proc = pyz(media, media / "app.tar.parts.json", "--verify", "--no-receipt", docker_host=docker_host)
    assert proc.returncode == 0, proc.stderr
    facts = image_facts(docker_host, "parts/app:1")
    assert facts is not None and facts[0] == image_id
    docker(docker_host, "image", "rm", "parts/app:1")


def test_a_tar_into_an_engine_that_loads_from_folders_is_refused_before_any_change(bundle: Path,
                                                                                 tmp_path: Path) -> None:
    """Only Docker reads a tar or parts in place (reads_archives); the OCI target is refused up
    front with the unpack command, and nothing is written to it."""
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "one.tar"), check=True)
    out = tmp_path / "layout"
    proc = run_cli("importer", str(tmp_path / "one.tar"), "--engine", "oci", "--oci-dir", str(out), "--no-receipt")
    assert proc.returncode == 2, proc.stderr
    assert "expected a bundle folder for this engine, found a tar/parts" in proc.stderr
    assert "tar -xf FILE.tar -C B" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_a_member_that_ends_early_while_packed_is_refused() -> None:
    """The pack writes each member straight into the tar (no tarfile stream buffer): a file that
    ends before the size its header announced (changed while packed) is refused, never padded."""
    import io
    import tarfile

    from bundle.archive import _copy_member
    from importer.errors import SizeMismatch
    from importer.streams.readers import HashingReader

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        with pytest.raises(SizeMismatch, match="expected 20 bytes, found 10: it changed while it was being packed"):
            _copy_member("blobs/sha256/x", HashingReader(io.BytesIO(b"0123456789")), tar, 20)
        _copy_member("ok", HashingReader(io.BytesIO(b"0123456789")), tar, 10)
    assert b"0123456789" in out.getvalue()


def test_pack_writes_the_bytes_tarfile_writes(bundle: Path, tmp_path: Path) -> None:
    """The parts and the whole are hashed on threads of their own (importer/streams/hashlane.py):
    the archive is still the PAX tar that tarfile's own stream mode writes for the same members,
    byte for byte, and every digest the pack reports is the sha256 of the bytes on disk."""
    from bundle.archive import member_order, pack_bundle
    from importer.format.manifest import IMPORTER_PYZ
    from importer.input.opened import open_bundle

    ref = tmp_path / "ref.tar"
    with tarfile.open(ref, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel in member_order(open_bundle(str(bundle), carrying="packing").manifest(), str(bundle)):
            data = (bundle / rel).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.uname, info.gname = len(data), 0, "", ""
            info.mode = 0o755 if rel == IMPORTER_PYZ else 0o644
            tar.addfile(info, io.BytesIO(data))
    expected = ref.read_bytes()
    one = pack_bundle(str(bundle), str(tmp_path / "one" / "c.tar"))
    assert (tmp_path / "one" / "c.tar").read_bytes() == expected
    assert (one.size, str(one.digest)) == (len(expected), _sha(expected)) and one.parts == []
    # parts of an odd size: members, headers and padding cut at every place; the last part short
    cut = pack_bundle(str(bundle), str(tmp_path / "cut" / "c.tar"), split=MiB + 4097)
    sizes = [p.size for p in cut.parts]
    assert len(sizes) >= 5 and set(sizes[:-1]) == {MiB + 4097} and 0 < sizes[-1] <= MiB + 4097
    joined = b""
    for rec in cut.parts:
        data = (tmp_path / "cut" / rec.name).read_bytes()
        assert (len(data), _sha(data)) == (rec.size, str(rec.digest)), rec.name
        joined += data
    assert joined == expected and str(cut.digest) == _sha(expected)
    assert not [t.name for t in threading.enumerate() if t.name.endswith(" sha256")]  # the lanes ended


def test_a_pack_that_fails_ends_its_hashing_threads_and_leaves_nothing(bundle: Path, tmp_path: Path) -> None:
    """A write that fails midway (here ENOSPC on the third part): the one error, no part or temp
    file left, and no hashing thread left running (a bounded queue it blocks on, never a hang)."""
    import errno

    from bundle import archive
    from importer.errors import BundleError

    real = archive.PartWriter._close_part
    closed: list[int] = []

    def failing(self: archive.PartWriter) -> None:
        closed.append(1)
        if len(closed) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self)

    out = tmp_path / "usb"
    archive.PartWriter._close_part = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(BundleError, match="packing into"):
            archive.pack_bundle(str(bundle), str(out / "c.tar"), split=MiB)
    finally:
        archive.PartWriter._close_part = real  # type: ignore[method-assign]
    assert sorted(os.listdir(out)) == []
    assert not [t.name for t in threading.enumerate() if t.name.endswith(" sha256")]
