"""One view of a bundle for every step (docs/security.md, "One reader"): a signed bundle carried
as a tar or parts is opened once, with the one tar reader for untrusted archives, and the
signature is checked over the very bundle.json bytes that verification and loading then use.

The hostile tar here exploits a header sequence that Python's ``tarfile`` and our ``safetar``
read differently (a GNU long name followed by a pax header: ``tarfile`` lets the long name win,
the pax standard lets ``path`` win). Once, the signature step read the archive with ``tarfile``
and saw the publisher's signed bundle.json, while verification read it with ``safetar`` and saw
the attacker's: ``--trust`` passed and the attacker's image got the signed tag."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from bundle.archive import pack_bundle
from importer.input.opened import open_bundle
from importer.input.safetar import SafeTarReader
from tests.kit.helpers import docker, image_facts, run_pyz
from tests.kit.transferkit import random_bundle
from tests.kit.trustkit import error_id, keypair, sign

REFS = ("carry/base:1", "carry/app:2")


# ============================================================================ a raw tar writer


def _header(name: bytes, size: int, typeflag: bytes) -> bytes:
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % 0
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n += 1
    return str(n).encode() + body


def _member(data: bytes, *, gnu_long_name: str | None = None, pax_path: str | None = None,
            name: str = "plain") -> bytes:
    out = b""
    if gnu_long_name is not None:
        raw = gnu_long_name.encode() + b"\0"
        out += _header(b"././@LongLink", len(raw), b"L") + _padded(raw)
    if pax_path is not None:
        pax = _pax_record("path", pax_path)
        out += _header(b"PaxHeader", len(pax), b"x") + _padded(pax)
    return out + _header(name.encode(), len(data), b"0") + _padded(data)


def _swapped_tar(signed: Path, evil: Path, out: Path) -> Path:
    """The attacker's bundle (``evil``) with the publisher's signed bundle.json and signature
    hidden in members that ``tarfile`` names bundle.json / bundle.json.sig and ``safetar``
    reads as folders."""
    parts = [
        _member((evil / "bundle.json").read_bytes(), gnu_long_name="zz-unused", pax_path="bundle.json"),
        _member((signed / "bundle.json").read_bytes(), gnu_long_name="bundle.json", pax_path="zz-b/"),
        _member((signed / "bundle.json.sig").read_bytes(), gnu_long_name="bundle.json.sig", pax_path="zz-c/"),
    ]
    for path in sorted(evil.rglob("*")):
        rel = path.relative_to(evil).as_posix()
        if path.is_file() and rel != "bundle.json":
            parts.append(_member(path.read_bytes(), name=rel))
    out.write_bytes(b"".join(parts) + b"\0" * 1024)
    return out


@pytest.fixture(scope="module")
def signed_and_evil(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the publisher's signed bundle, the attacker's bundle with the same refs, the trusted key)."""
    d = tmp_path_factory.mktemp("oneview")
    _, pub = keypair(d, "publisher")
    signed = random_bundle(d / "signed.bundle", mb=(1, 1), seed=1)
    sign(signed, d / "publisher.key")
    evil = random_bundle(d / "evil.bundle", mb=(1, 1), seed=2)
    return signed, evil, pub


def test_the_two_parsers_really_disagree_on_the_crafted_tar(signed_and_evil: tuple, tmp_path: Path) -> None:
    """The premise: tarfile and safetar name the members differently (else this file tests nothing)."""
    signed, evil, _ = signed_and_evil
    tar = _swapped_tar(signed, evil, tmp_path / "swapped.tar")
    with tarfile.open(tar) as tf:
        f = tf.extractfile("bundle.json")
        assert f is not None and f.read() == (signed / "bundle.json").read_bytes()
    reader = SafeTarReader(io.BytesIO(tar.read_bytes()))
    first = next(reader)
    assert first.name == "bundle.json" and reader.read(-1) != (signed / "bundle.json").read_bytes()


def test_the_opened_bundle_is_what_verification_reads(signed_and_evil: tuple, tmp_path: Path) -> None:
    signed, evil, _ = signed_and_evil
    tar = _swapped_tar(signed, evil, tmp_path / "swapped.tar")
    opened = open_bundle(str(tar))
    assert opened.raw_bundle_json == (evil / "bundle.json").read_bytes()
    assert opened.raw_signature is None  # the hidden signature is a folder to the one reader
    assert opened.read("bundle.json", 1 << 20, "bundle.json") == opened.raw_bundle_json


def test_trust_refuses_a_tar_whose_signed_bundle_json_is_hidden(signed_and_evil: tuple, tmp_path: Path) -> None:
    signed, evil, pub = signed_and_evil
    tar = _swapped_tar(signed, evil, tmp_path / "swapped.tar")
    proc = run_pyz(tar, "--verify-only", "--trust", str(pub), pyz=signed / "bundle-import.pyz")
    assert proc.returncode == 7, proc.stderr
    assert error_id(proc.stderr) == "signature-missing", proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.engine
def test_trust_on_a_swapped_tar_loads_nothing(signed_and_evil: tuple, tmp_path: Path, docker_host: str) -> None:
    signed, evil, pub = signed_and_evil
    tar = _swapped_tar(signed, evil, tmp_path / "swapped.tar")
    for ref in REFS:
        docker(docker_host, "image", "rm", ref, check=False)
    proc = run_pyz(tar, "--verify", "--engine", "docker", "--trust", str(pub), "--no-receipt",
                        pyz=signed / "bundle-import.pyz", docker_host=docker_host)
    try:
        assert proc.returncode == 7 and error_id(proc.stderr) == "signature-missing", proc.stderr
        assert [image_facts(docker_host, ref) for ref in REFS] == [None, None]
    finally:
        docker(docker_host, "image", "rm", *REFS, check=False)


@pytest.mark.engine
@pytest.mark.parametrize("form", ["tar", "parts"])
def test_trust_on_a_tar_or_parts_loads_exactly_the_signed_images(signed_and_evil: tuple, tmp_path: Path,
                                                                  docker_host: str, form: str) -> None:
    signed, _, pub = signed_and_evil
    folder = tmp_path / "signed.bundle"
    shutil.copytree(signed, folder)
    pack_bundle(str(folder), str(tmp_path / "signed.tar"), split=(1 << 20) if form == "parts" else None)
    target = tmp_path / ("signed.tar.parts.json" if form == "parts" else "signed.tar")
    doc = json.loads((signed / "bundle.json").read_bytes())
    for ref in REFS:
        docker(docker_host, "image", "rm", ref, check=False)
    proc = run_pyz(target, "--verify", "--engine", "docker", "--trust", str(pub), "--json", "--no-receipt",
                        pyz=signed / "bundle-import.pyz", docker_host=docker_host)
    try:
        assert proc.returncode == 0, proc.stderr
        receipt = json.loads(proc.stdout)
        assert receipt["signature"]["status"] == "verified"
        assert receipt["bundle"]["digest"] == receipt["signature"]["signedDigest"]
        for image in doc["images"]:
            facts = image_facts(docker_host, image["refs"][0])
            assert facts is not None and facts[0] == image["config"]["digest"]
            assert facts[1] == [x["diffId"] for x in image["layers"]]
    finally:
        docker(docker_host, "image", "rm", *REFS, check=False)
