"""Hostile schema 1/2 bundles are refused as strictly as schema 3 ones, before any engine sees
them: links instead of files, an empty, partial or oversized SHA256SUMS, an archive whose own
``manifest.json`` names other tags than bundle.json (re-pinned so every digest matches); and a
legacy import loads under staging tags, tagging only after the post-load check."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import zstandard

from importer.format.legacy import load_legacy_manifest
from importer.format.limits import MAX_LEGACY_SUMS
from importer.verify.legacyarchive import MANIFEST_JSON, archive_pass, open_archive
from tests.kit.helpers import docker, run_cli, start_cli
from tests.kit.trustkit import engine_listing, error_id

GOLDEN = Path(__file__).resolve().parent / "golden" / "bundles"
REFS = ("fake/base:1", "fake/app:2")
ARCHIVE = {"v1": "images.tar", "v2": "images.tar.zst"}


def _copy(version: str, tmp_path: Path) -> Path:
    bundle = tmp_path / version
    shutil.copytree(GOLDEN / version, bundle)
    return bundle


def _verify(bundle: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("importer", str(bundle), "--verify-only")


def _sums(bundle: Path) -> list[str]:
    return (bundle / "SHA256SUMS").read_text().splitlines(keepends=True)


# ============================================================================ 1. regular files only


@pytest.mark.parametrize(("version", "name"), [("v1", "images.tar"), ("v2", "images.tar.zst"), ("v1", "bundle.json"),
                                               ("v1", "SHA256SUMS"), ("v2", "bundle-import.pyz")])
def test_a_symlinked_bundle_file_is_refused(version: str, name: str, tmp_path: Path) -> None:
    bundle = _copy(version, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(bundle / name, elsewhere / name)  # the very same bytes, reached through a link
    (bundle / name).symlink_to(elsewhere / name)
    proc = _verify(bundle)
    assert proc.returncode == 3, proc.stderr
    assert "not-a-regular-file" in proc.stderr and name in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ============================================================================ 2. SHA256SUMS, strictly


def test_an_empty_sha256sums_is_refused(tmp_path: Path) -> None:
    bundle = _copy("v2", tmp_path)
    (bundle / "SHA256SUMS").write_bytes(b"")
    proc = _verify(bundle)
    assert proc.returncode == 3 and error_id(proc.stderr) == "verification-failed", proc.stderr
    for name in ("images.tar.zst", "bundle-import.pyz", "bundle.json"):
        assert f"[sums-mismatch] {name}: expected a line in SHA256SUMS, found none" in proc.stderr, proc.stderr


def test_a_partial_sha256sums_is_refused(tmp_path: Path) -> None:
    bundle = _copy("v1", tmp_path)
    lines = _sums(bundle)
    (bundle / "SHA256SUMS").write_text("".join(x for x in lines if not x.endswith("  images.tar\n")))
    proc = _verify(bundle)
    assert proc.returncode == 3, proc.stderr
    assert "[sums-mismatch] images.tar: expected a line in SHA256SUMS, found none" in proc.stderr, proc.stderr


def test_an_oversized_sha256sums_is_refused_not_truncated(tmp_path: Path) -> None:
    bundle = _copy("v1", tmp_path)
    # every line right; blank lines past the limit (a lenient reader would skip them, or cut them off)
    (bundle / "SHA256SUMS").write_bytes((bundle / "SHA256SUMS").read_bytes() + b"\n" * MAX_LEGACY_SUMS)
    proc = _verify(bundle)
    assert proc.returncode == 3 and error_id(proc.stderr) == "limit-exceeded", proc.stderr
    assert f"reading SHA256SUMS: expected at most {MAX_LEGACY_SUMS} bytes, found more" in proc.stderr


@pytest.mark.parametrize("line", [b"%s *images.tar\n", b"%s  images.tar\r\n"])  # sha256sum -c takes both
def test_sha256sums_lines_are_parsed_strictly(line: bytes, tmp_path: Path) -> None:
    bundle = _copy("v1", tmp_path)
    lines = [x.encode() for x in _sums(bundle)]
    digest = next(x for x in lines if x.endswith(b"  images.tar\n"))[:64]
    rewritten = [line % digest if x.endswith(b"  images.tar\n") else x for x in lines]
    (bundle / "SHA256SUMS").write_bytes(b"".join(rewritten))
    proc = _verify(bundle)
    assert proc.returncode == 3 and "[sums-invalid] SHA256SUMS: SHA256SUMS line" in proc.stderr, proc.stderr


# ============================================================================ 3. the archive's manifest.json


def _repin(bundle: Path, version: str, plain: bytes) -> None:
    """Write ``plain`` as the bundle's archive and pin it everywhere, as a careful forger would:
    bundle.json's archive, files and uncompressed digest/size, then SHA256SUMS."""
    name = ARCHIVE[version]
    stored = plain if version == "v1" else zstandard.ZstdCompressor(level=3).compress(plain)
    (bundle / name).write_bytes(stored)
    doc = json.loads((bundle / "bundle.json").read_text())
    pin = {"path": name, "digest": "sha256:" + hashlib.sha256(stored).hexdigest(), "size": len(stored)}
    doc["archive"] = pin
    doc["files"] = [pin if f["path"] == name else f for f in doc["files"]]
    doc["uncompressedDigest"] = "sha256:" + hashlib.sha256(plain).hexdigest()
    doc["uncompressedSize"] = len(plain)
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    names = sorted([f["path"] for f in doc["files"]] + ["bundle.json"])
    (bundle / "SHA256SUMS").write_text("".join(f"{hashlib.sha256((bundle / n).read_bytes()).hexdigest()}  {n}\n"
                                               for n in names))


def _plain_archive(bundle: Path, version: str) -> bytes:
    data = (bundle / ARCHIVE[version]).read_bytes()
    return data if version == "v1" else zstandard.ZstdDecompressor().decompressobj().decompress(data)


def _with_repo_tags(plain: bytes, tags: list[list[str]]) -> bytes:
    """The same docker-archive with manifest.json's RepoTags replaced (members in the same order)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(plain)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name == MANIFEST_JSON:
                doc = json.loads(data)
                for entry, repo_tags in zip(doc, tags):
                    entry["RepoTags"] = repo_tags
                data = json.dumps(doc).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_repo_tags_in_the_archive_must_be_bundle_json_refs(version: str, tmp_path: Path) -> None:
    bundle = _copy(version, tmp_path)
    _repin(bundle, version, _with_repo_tags(_plain_archive(bundle, version), [["evil/tag:1"], ["fake/app:2"]]))
    proc = _verify(bundle)
    assert proc.returncode == 3, proc.stderr
    assert (f"[archive-manifest-mismatch] {ARCHIVE[version]}: manifest.json entry 1 (fake/base:1): expected RepoTags "
            "['fake/base:1'] as in bundle.json, found ['evil/tag:1']") in proc.stderr, proc.stderr


def test_layers_and_config_in_the_archive_must_be_bundle_json_ones(tmp_path: Path) -> None:
    bundle = _copy("v1", tmp_path)
    plain = _plain_archive(bundle, "v1")
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        doc = json.loads(tar.extractfile(MANIFEST_JSON).read())  # type: ignore[union-attr]
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(plain)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name == MANIFEST_JSON:  # image 2 claims image 1's config and drops its top layer
                doc[1]["Config"], doc[1]["Layers"] = doc[0]["Config"], doc[1]["Layers"][:2]
                data = json.dumps(doc).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    _repin(bundle, "v1", out.getvalue())
    proc = _verify(bundle)
    assert proc.returncode == 3, proc.stderr
    assert "manifest.json entry 2 (fake/app:2): expected the config sha256:fa418c72" in proc.stderr, proc.stderr
    assert "manifest.json entry 2 (fake/app:2): expected 3 layer(s) as in bundle.json, found 2" in proc.stderr


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_rewriting_pass_changes_only_the_repo_tags(version: str) -> None:
    """What streams into an engine: every member's bytes as in the archive, minus the members
    that could name images, and manifest.json last with the staging tags."""
    raw = (GOLDEN / version / "bundle.json").read_bytes()
    manifest = load_legacy_manifest(raw, int(version[1]))
    out = io.BytesIO()
    with open_archive(str(GOLDEN / version), manifest) as reader:
        archive_pass(reader, manifest, out=out, staged=[["sneakernet-staging/0123456789ab:0"], None])
    plain = _plain_archive(GOLDEN / version, version)
    with tarfile.open(fileobj=io.BytesIO(plain)) as before, tarfile.open(fileobj=io.BytesIO(out.getvalue())) as after:
        old = {m.name: before.extractfile(m).read() for m in before.getmembers() if m.isfile()}  # type: ignore
        new = {m.name: after.extractfile(m).read() for m in after.getmembers() if m.isfile()}  # type: ignore
        assert after.getmembers()[-1].name == MANIFEST_JSON
    assert set(old) - set(new) == {"repositories"} and set(new) == set(old) - {"repositories"}
    assert all(new[name] == old[name] for name in new if name != MANIFEST_JSON)
    entries = json.loads(new[MANIFEST_JSON])
    assert [e["RepoTags"] for e in entries] == [["sneakernet-staging/0123456789ab:0"], None]
    assert [e["Layers"] for e in entries] == [e["Layers"] for e in json.loads(old[MANIFEST_JSON])]


def test_members_that_could_name_images_never_reach_an_engine(tmp_path: Path) -> None:
    """An engine reads index.json's ref names instead of manifest.json when oci-layout is there:
    both are left out of what streams into it (docker 25+ writes them beside manifest.json)."""
    bundle = _copy("v1", tmp_path)
    out = io.BytesIO()
    index = json.dumps({"schemaVersion": 2, "manifests": [{"annotations": {
        "io.containerd.image.name": "docker.io/evil/tag:1", "org.opencontainers.image.ref.name": "1"}}]}).encode()
    with tarfile.open(fileobj=io.BytesIO(_plain_archive(bundle, "v1"))) as src, \
            tarfile.open(fileobj=out, mode="w") as dst:
        for name, data in ((b"oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), (b"index.json", index)):
            info = tarfile.TarInfo(name.decode())
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    _repin(bundle, "v1", out.getvalue())
    assert _verify(bundle).returncode == 0  # they are allowed in the bundle ...
    manifest = load_legacy_manifest((bundle / "bundle.json").read_bytes(), 1)
    sent = io.BytesIO()
    with open_archive(str(bundle), manifest) as reader:
        archive_pass(reader, manifest, out=sent, staged=[["sneakernet-staging/0123456789ab:0"], None])
    with tarfile.open(fileobj=io.BytesIO(sent.getvalue())) as tar:
        names = tar.getnames()
    assert "index.json" not in names and "oci-layout" not in names and names[-1] == MANIFEST_JSON  # ... not sent
    assert b"evil/tag" not in sent.getvalue()


def test_a_changed_archive_aborts_the_stream_before_manifest_json(tmp_path: Path) -> None:
    bundle = _copy("v1", tmp_path)
    manifest = load_legacy_manifest((bundle / "bundle.json").read_bytes(), 1)
    data = bytearray((bundle / "images.tar").read_bytes())
    data[data.index(b"fake/base:1")] ^= 0x01  # the same size, one bit of manifest.json changed
    (bundle / "images.tar").write_bytes(bytes(data))
    out = io.BytesIO()
    with pytest.raises(Exception) as info, open_archive(str(bundle), manifest) as reader:
        archive_pass(reader, manifest, out=out, staged=[["a:1"], ["b:2"]])
    assert getattr(info.value, "reference", "") == "digest-mismatch"
    assert b"manifest.json" not in out.getvalue() and b"fake/" not in out.getvalue()


# ============================================================================ with a real dockerd


def _forget(docker_host: str) -> None:
    doc = json.loads((GOLDEN / "v1" / "bundle.json").read_text())
    for ref in (*REFS, "evil/tag:1"):
        docker(docker_host, "image", "rm", ref, check=False)
    for image in doc["images"]:
        docker(docker_host, "image", "rm", "-f", image["configDigest"], check=False)


def _has(docker_host: str, name: str) -> bool:
    return docker(docker_host, "image", "inspect", name, check=False).returncode == 0


@pytest.mark.engine
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_other_repo_tags_in_the_archive_reach_no_engine(version: str, docker_host: str, tmp_path: Path) -> None:
    bundle = _copy(version, tmp_path)
    _repin(bundle, version, _with_repo_tags(_plain_archive(bundle, version), [["evil/tag:1"], ["fake/app:2"]]))
    _forget(docker_host)
    before = engine_listing(docker_host)
    proc = run_cli("importer", str(bundle), "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 3 and "archive-manifest-mismatch" in proc.stderr, proc.stderr
    assert not _has(docker_host, "evil/tag:1")
    doc = json.loads((bundle / "bundle.json").read_text())
    assert not any(_has(docker_host, image["configDigest"]) for image in doc["images"])
    assert engine_listing(docker_host) == before  # nothing loaded, nothing tagged


@pytest.mark.engine
def test_a_symlinked_archive_reaches_no_engine(docker_host: str, tmp_path: Path) -> None:
    bundle = _copy("v1", tmp_path)
    (tmp_path / "images.tar").write_bytes((bundle / "images.tar").read_bytes())
    (bundle / "images.tar").unlink()
    (bundle / "images.tar").symlink_to(tmp_path / "images.tar")
    _forget(docker_host)
    before = engine_listing(docker_host)
    proc = run_cli("importer", str(bundle), "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 3 and "not-a-regular-file" in proc.stderr, proc.stderr
    assert engine_listing(docker_host) == before


@pytest.mark.engine
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_legacy_import_loads_under_staging_tags(version: str, docker_host: str, tmp_path: Path) -> None:
    """Held right after the load: the engine holds the images under this run's staging tags
    only, none of the bundle's tags; then the run tags them and drops the staging tags."""
    bundle = _copy(version, tmp_path)
    _forget(docker_host)
    marker = tmp_path / "held"
    env = {"SNEAKERNET_LOCK_DIR": str(tmp_path / "locks"), "SNEAKERNET_TEST_HOLD_AT": "loaded",
           "SNEAKERNET_TEST_HOLD_FILE": str(marker), "SNEAKERNET_TEST_HOLD_SECONDS": "60"}
    proc = start_cli("importer", str(bundle), "--docker-host", docker_host, "--json", "--no-receipt", env=env,
                     drop_env=("PYTHON",))
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    was_held = marker.exists()
    held = engine_listing(docker_host) if was_held else []
    if was_held:
        marker.unlink()  # seen: the import goes on now, not after the whole hold
    out, err = proc.communicate(timeout=300)
    assert was_held, f"the import never held at 'loaded' (rc {proc.returncode}):\n{err}"
    staging = sorted(line.split()[1] for line in held if "sneakernet-staging/" in line)
    assert len(staging) == 2 and all(s.endswith((":0", ":1")) for s in staging), held
    assert not any(ref in line.split()[1] for line in held for ref in REFS), held
    assert proc.returncode == 0, err
    receipt = json.loads(out)
    assert sorted(receipt["staging"]["refs"]) == staging
    assert all(_has(docker_host, ref) for ref in REFS)
    assert not [line for line in engine_listing(docker_host) if "sneakernet-staging/" in line]
