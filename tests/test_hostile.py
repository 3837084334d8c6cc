"""Hostile input: a corpus of crafted archives built here (traversal, absolute paths, symlink
and hardlink escapes, device nodes, giant headers, too many members, duplicates) against
importer/input/safetar.py, real archives from GNU tar and from our own writers, fuzzing, and
decompression bombs whose recorded size is small (zstd and gzip) against verification."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from importer.errors import BundleError, LimitExceeded
from importer.input.safetar import (
    ARCHIVE_POLICY,
    BUNDLE_POLICY,
    LAYER_POLICY,
    ArchiveDuplicate,
    ArchiveLinkEscape,
    ArchiveMalformed,
    ArchivePathEscape,
    ArchiveSpecialFile,
    SafeTarReader,
    TarPolicy,
    extract,
)
from importer.verify.bundle import verify_bundle
from tests.kit.bundlegen import make_bundle
from tests.kit.helpers import run_pyz
from tests.kit.trustkit import error_id, regenerate_sums

# ============================================================================ the corpus


def _info(name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.linkname = link
    info.mode = 0o644
    return info


def _tar(*entries: tuple[tarfile.TarInfo, bytes], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in entries:
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return _info(name), data


def _giant_header(kind: bytes, size: int) -> bytes:
    """A pax ('x') or GNU long-name ('L') header that announces ``size`` bytes, and then ends."""
    header = _info("././@LongLink" if kind == b"L" else "./PaxHeaders/x", kind, size=size)
    header.size = size
    return header.tobuf(tarfile.GNU_FORMAT) + b"1" * 512  # GNU: base-256 sizes above 8 GiB


CORPUS: dict[str, tuple[Callable[[], bytes], type[BundleError], str]] = {
    "traversal": (lambda: _tar(_file("ok"), _file("../../evil")), ArchivePathEscape, "archive-path-escape"),
    "traversal-inside-path": (lambda: _tar(_file("a/b/../../../evil")), ArchivePathEscape, "archive-path-escape"),
    "absolute-path": (lambda: _tar(_file("/tmp/evil-absolute")), ArchivePathEscape, "archive-path-escape"),
    "symlink-escape": (lambda: _tar((_info("up", tarfile.SYMTYPE, link="../../.."), b"")),
                       ArchiveLinkEscape, "archive-link-escape"),
    "symlink-absolute": (lambda: _tar((_info("etc", tarfile.SYMTYPE, link="/etc"), b"")),
                         ArchiveLinkEscape, "archive-link-escape"),
    "symlink-then-write-through": (lambda: _tar((_info("d", tarfile.SYMTYPE, link="."), b""),
                                                _file("d/passwd")), ArchiveLinkEscape, "archive-link-escape"),
    "symlink-sneaky-dotdot": (lambda: _tar((_info("s", tarfile.SYMTYPE, link="sub/../.."), b"")),
                              ArchiveLinkEscape, "archive-link-escape"),
    "hardlink-escape": (lambda: _tar((_info("h", tarfile.LNKTYPE, link="../../etc/passwd"), b"")),
                        ArchiveLinkEscape, "archive-link-escape"),
    "hardlink-absolute": (lambda: _tar((_info("h", tarfile.LNKTYPE, link="/etc/passwd"), b"")),
                          ArchiveLinkEscape, "archive-link-escape"),
    "hardlink-to-nothing": (lambda: _tar((_info("h", tarfile.LNKTYPE, link="not-there"), b"")),
                            ArchiveLinkEscape, "archive-link-escape"),
    "char-device": (lambda: _tar((_info("dev/sda", tarfile.CHRTYPE), b"")), ArchiveSpecialFile,
                    "archive-special-file"),
    "block-device": (lambda: _tar((_info("dev/mem", tarfile.BLKTYPE), b"")), ArchiveSpecialFile,
                     "archive-special-file"),
    "fifo": (lambda: _tar((_info("pipe", tarfile.FIFOTYPE), b"")), ArchiveSpecialFile, "archive-special-file"),
    "duplicate-name": (lambda: _tar(_file("a", b"first"), _file("./a", b"second")), ArchiveDuplicate,
                       "archive-duplicate-member"),
    "giant-pax-header": (lambda: _giant_header(tarfile.XHDTYPE, 1 << 40), LimitExceeded, "limit-exceeded"),
    "giant-gnu-long-name": (lambda: _giant_header(tarfile.GNUTYPE_LONGNAME, 1 << 33), LimitExceeded,
                            "limit-exceeded"),
    "long-name-over-bound": (lambda: _tar(_file("d/" + "n" * 5000)), LimitExceeded, "limit-exceeded"),
    "bad-checksum": (lambda: b"\x01" * 512 + b"\0" * 1024, ArchiveMalformed, "archive-malformed"),
    "truncated-member": (lambda: _tar(_file("big", b"y" * 5000))[:1024 + 100], ArchiveMalformed,
                         "archive-malformed"),
    "sparse-member": (lambda: _tar((_info("s", tarfile.GNUTYPE_SPARSE), b""), fmt=tarfile.GNU_FORMAT),
                      ArchiveMalformed, "archive-malformed"),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_archive_is_refused_with_its_id(name: str) -> None:
    build, error, ident = CORPUS[name]
    with pytest.raises(error) as caught:
        list(SafeTarReader(io.BytesIO(build()), ARCHIVE_POLICY, what=name))
    assert caught.value.reference == ident
    assert caught.value.hint


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_archive_extracts_nothing_outside(name: str, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(BundleError):
        extract(io.BytesIO(CORPUS[name][0]()), str(dest), ARCHIVE_POLICY, what=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not Path("/tmp/evil-absolute").exists()
    for p in dest.rglob("*"):  # whatever was written before the refusal stays inside dest
        assert p.resolve().is_relative_to(dest.resolve()) or p.is_symlink()
        assert not p.is_char_device() and not p.is_block_device() and not p.is_fifo()


def test_giant_header_is_refused_before_it_is_read() -> None:
    class Counting(io.BytesIO):
        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.asked = 0

        def read(self, n: int | None = -1) -> bytes:
            self.asked += n if n and n > 0 else 0
            return super().read(n)

    f = Counting(_giant_header(tarfile.XHDTYPE, 1 << 40))
    with pytest.raises(LimitExceeded, match="1099511627776"):
        next(SafeTarReader(f, ARCHIVE_POLICY))
    assert f.asked <= 1024  # never asked for the announced terabyte


def test_member_count_bound() -> None:
    data = _tar(*[_file(f"f{i}") for i in range(11)])
    assert len(list(SafeTarReader(io.BytesIO(data), TarPolicy(max_members=11)))) == 11
    with pytest.raises(LimitExceeded, match="at most 10 members"):
        list(SafeTarReader(io.BytesIO(data), TarPolicy(max_members=10)))


def test_member_size_and_total_bounds() -> None:
    data = _tar(_file("a", b"1" * 600), _file("b", b"2" * 600))
    with pytest.raises(LimitExceeded):
        list(SafeTarReader(io.BytesIO(data), TarPolicy(max_member_size=500)))
    with pytest.raises(LimitExceeded):
        list(SafeTarReader(io.BytesIO(data), TarPolicy(max_total=1000)))


def test_bundle_policy_refuses_every_link() -> None:
    for entry in ((_info("l", tarfile.SYMTYPE, link="a"), b""), (_info("h", tarfile.LNKTYPE, link="a"), b"")):
        with pytest.raises(ArchiveLinkEscape):
            list(SafeTarReader(io.BytesIO(_tar(_file("a"), entry)), BUNDLE_POLICY))


def test_layer_policy_reads_what_images_hold() -> None:
    """Absolute symlinks point into the image, devices exist, folders repeat: readable, never extracted."""
    data = _tar((_info("dev", tarfile.DIRTYPE), b""), (_info("dev/null", tarfile.CHRTYPE), b""),
                (_info("bin", tarfile.DIRTYPE), b""), (_info("bin/sh", tarfile.SYMTYPE, link="/bin/busybox"), b""),
                (_info("bin/", tarfile.DIRTYPE), b""), _file("bin/busybox", b"elf"),
                (_info("bin/ash", tarfile.LNKTYPE, link="/bin/busybox"), b""))
    members = list(SafeTarReader(io.BytesIO(data), LAYER_POLICY))
    assert [(m.name, m.type) for m in members][-1] == ("bin/ash", "hardlink")
    with pytest.raises(ValueError):
        extract(io.BytesIO(data), "/nonexistent-never-used", LAYER_POLICY)
    with pytest.raises(ArchiveSpecialFile):
        list(SafeTarReader(io.BytesIO(data), ARCHIVE_POLICY))


# ============================================================================ real archives


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("tree") / "src"
    deep = src / "data" / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / ("f" * 200)).write_text("long\n")
    (src / "data" / "hl-src").write_text("hello\n")
    os.link(src / "data" / "hl-src", src / "data" / "hl-dst")
    (src / "data" / "rel-link").symlink_to("hl-src")
    (src / "data" / "ünïcødé-файл.txt").write_text("unicode\n")
    (src / "data" / "empty").write_bytes(b"")
    (src / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    return src


@pytest.mark.parametrize("fmt", ["gnu", "posix", "oldgnu"])
def test_gnu_tar_archives_read_and_extract_exactly(tree: Path, tmp_path: Path, fmt: str) -> None:
    archive = tmp_path / "t.tar"
    subprocess.run(["tar", f"--format={fmt}", "-cf", str(archive), "-C", str(tree), "."], check=True)
    with open(archive, "rb") as f:
        mine = [(m.name, m.type, m.size, m.linkname) for m in SafeTarReader(f, ARCHIVE_POLICY)]
    theirs = []
    with tarfile.open(archive) as listing:
        infos = list(listing)
    for i in infos:
        kind = {tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink"}.get(i.type, "file")
        name = i.name[2:] if i.name.startswith("./") else i.name
        link = i.linkname[2:] if kind == "hardlink" and i.linkname.startswith("./") else i.linkname
        theirs.append((name.rstrip("/") or ".", kind, i.size if kind == "file" else 0, link))
    assert mine == theirs
    dest = tmp_path / "out"
    dest.mkdir()
    with open(archive, "rb") as f:
        extract(f, str(dest), ARCHIVE_POLICY)
    assert subprocess.run(["diff", "-r", "--no-dereference", str(tree), str(dest)], capture_output=True).returncode == 0
    assert (dest / "data" / "hl-dst").stat().st_ino == (dest / "data" / "hl-src").stat().st_ino


def test_our_docker_archive_and_its_layers_read_back(tmp_path: Path) -> None:
    from importer.format.manifest import load_bundle_manifest
    from importer.sinks.dockerarchive import write_docker_archive

    b = make_bundle(tmp_path / "b")
    manifest = load_bundle_manifest((b / "bundle.json").read_bytes())
    buf = io.BytesIO()
    write_docker_archive(buf, str(b), manifest.images, with_tags=True)
    buf.seek(0)
    reader = SafeTarReader(buf, ARCHIVE_POLICY, what="docker-archive")
    layers = 0
    for m in reader:
        if m.name.endswith("/layer.tar"):
            inner = SafeTarReader(io.BytesIO(reader.read(m.size)), LAYER_POLICY, what=m.name)
            layers += 1
            assert all(x.type in ("file", "dir") for x in inner)
    assert layers == len({x.diff_id for x in manifest.unique_layers()})


# ============================================================================ fuzzing


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_damaged_archives_raise_only_bundle_errors(tmp_path: Path, data: st.DataObject) -> None:
    base = bytearray(_tar(_file("a/b", b"x" * 700), (_info("a/l", tarfile.SYMTYPE, link="b"), b""),
                          (_info("a/h", tarfile.LNKTYPE, link="a/b"), b""), _file("c" * 150, b"long")))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(base)))
    sample = bytes(base[:cut])
    dest = tmp_path / f"d{data.draw(st.integers(0, 10**9))}"
    dest.mkdir()
    # refused (BundleError), or FileExistsError: a checksum-valid folder/file clash, still inside dest
    with contextlib.suppress(BundleError, FileExistsError):
        extract(io.BytesIO(sample), str(dest), ARCHIVE_POLICY)
    for p in dest.rglob("*"):
        assert os.path.realpath(p).startswith(str(dest)) or p.is_symlink()
    shutil.rmtree(dest)


# ============================================================================ decompression bombs


def _zstd_bomb() -> bytes:
    frame = zstandard.ZstdCompressor(level=19).compress(b"\0" * (64 << 20))
    return frame * 1024  # 64 GiB of zeros in a few MB


def _gzip_bomb() -> bytes:
    return gzip.compress(b"\0" * (64 << 20), 9) * 8  # 512 MiB of zeros


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_decompression_bomb_stops_at_the_recorded_size(tmp_path: Path, compression: str) -> None:
    """bundle.json (and SHA256SUMS) consistent with the bomb blob, but uncompressedSize small:
    decompression must stop one byte past 1 MiB with limit-exceeded."""
    b = make_bundle(tmp_path / "b", compression=compression)
    doc = json.loads((b / "bundle.json").read_text())
    layer = doc["images"][1]["layers"][-1]
    bomb = _zstd_bomb() if compression == "zstd" else _gzip_bomb()
    import hashlib

    digest = "sha256:" + hashlib.sha256(bomb).hexdigest()
    (b / "blobs" / "sha256" / layer["digest"][7:]).unlink()
    (b / "blobs" / "sha256" / digest[7:]).write_bytes(bomb)
    for f in doc["files"]:
        if f["digest"] == layer["digest"]:
            f.update(path=f"blobs/sha256/{digest[7:]}", digest=digest, size=len(bomb))
    layer.update(digest=digest, size=len(bomb), uncompressedSize=1 << 20)
    (b / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    regenerate_sums(b)
    started = time.monotonic()
    problems = {(p.id, p.path): p.message for p in verify_bundle(str(b)).problems}
    assert time.monotonic() - started < 20
    key = ("limit-exceeded", f"blobs/sha256/{digest[7:]}")
    assert key in problems, problems
    assert "expected at most 1048576 bytes" in problems[key]
    proc = run_pyz(b, "--verify-only")
    assert proc.returncode == 3 and error_id(proc.stderr) == "verification-failed"
    assert f"[limit-exceeded] blobs/sha256/{digest[7:]}" in proc.stderr


# Found by the fuzzer (tests/test_fuzz.py): numeric header fields GNU tar refuses.
@pytest.mark.parametrize(("offset", "value"), [
    (100, b"\x80" + b"\0" * 6 + b"\x01"),  # the mode in base-256 (GNU tar: mode_t must be octal)
    (136, b"\xbc" + b"0" * 11),  # an mtime in base-256 past 2**63
    (108, b"\x80" + b"\0" * 2 + b"\x01" + b"\0" * 4),  # a uid past 2**32
    (100, b"0o00644\0"),  # int(..., 8) would take Python's prefix
    (124, b"+0000000012\0"),  # ... and a sign
])
def test_numeric_fields_are_octal_or_bounded_base256(offset: int, value: bytes) -> None:
    data = bytearray(_tar((_info("a"), b"x" * 10)))
    at = next(i for i in range(0, len(data), 512) if data[i:i + 1] == b"a")  # the member's ustar header
    data[at + offset:at + offset + len(value)] = value
    data[at + 148:at + 156] = b" " * 8
    data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + 512])
    with pytest.raises(ArchiveMalformed):
        list(SafeTarReader(io.BytesIO(bytes(data)), BUNDLE_POLICY))
