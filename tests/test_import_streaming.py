"""Decompress once: into Docker, the import verifies the compressed blobs before touching the
engine and checks each layer's diff_id while it streams into ``docker load``. A bundle whose
blobs all match bundle.json but whose layer does not decompress to its diff_id (an exporter that
lied, or a digest collision) must still load nothing."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import zstandard

from tests.kit.bundlegen import make_bundle
from tests.kit.helpers import docker, image_ids, run_cli
from tests.kit.trustkit import regenerate_sums

pytestmark = pytest.mark.engine


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put_blob(bundle: Path, data: bytes) -> str:
    digest = _sha(data)
    (bundle / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(data)
    return digest


def lying_bundle(root: Path) -> tuple[Path, str]:
    """A bundle, consistent in every digest it lists, whose last layer of the last image holds
    other content than its diff_id (config unchanged); returns it and the lying diff_id."""
    bundle = make_bundle(root)
    doc = json.loads((bundle / "bundle.json").read_text())
    image = doc["images"][-1]
    layer = image["layers"][-1]
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        data = b"not what the config says\n" * 1000
        info = tarfile.TarInfo("other.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    plain = tar_bytes.getvalue()
    blob = zstandard.ZstdCompressor().compress(plain)
    old_layer, old_manifest = layer["digest"], image["manifest"]["digest"]
    layer.update(digest=_put_blob(bundle, blob), size=len(blob), uncompressedSize=len(plain))
    manifest = json.loads((bundle / "blobs" / "sha256" / old_manifest.split(":")[1]).read_bytes())
    for desc in manifest["layers"]:
        if desc["digest"] == old_layer:
            desc.update(digest=layer["digest"], size=layer["size"])
    raw_manifest = json.dumps(manifest, separators=(",", ":")).encode()
    image["manifest"].update(digest=_put_blob(bundle, raw_manifest), size=len(raw_manifest))
    index = json.loads((bundle / "index.json").read_text())
    for desc in index["manifests"]:
        if desc["digest"] == old_manifest:
            desc.update(digest=image["manifest"]["digest"], size=len(raw_manifest))
    raw_index = json.dumps(index, separators=(",", ":")).encode()
    (bundle / "index.json").write_bytes(raw_index)
    still_used = {x["digest"] for img in doc["images"] for x in img["layers"]} | {
        img["manifest"]["digest"] for img in doc["images"]}
    for old in (old_layer, old_manifest):
        if old not in still_used:
            (bundle / "blobs" / "sha256" / old.split(":")[1]).unlink()
    files = []
    for f in doc["files"]:
        path = bundle / f["path"]
        if path.exists():
            data = path.read_bytes()
            files.append({**f, "digest": _sha(data), "size": len(data)})
    for new in (layer["digest"], image["manifest"]["digest"]):
        if not any(f["path"] == "blobs/sha256/" + new.split(":")[1] for f in files):
            data = (bundle / "blobs" / "sha256" / new.split(":")[1]).read_bytes()
            files.append({"path": "blobs/sha256/" + new.split(":")[1], "digest": new, "size": len(data)})
    doc["files"] = sorted(files, key=lambda f: f["path"])
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(bundle)
    return bundle, layer["diffId"]


def test_a_layer_that_lies_about_its_diff_id_loads_nothing(docker_host: str, tmp_path: Path) -> None:
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    shallow = run_cli("importer", str(bundle), "--verify-only", "--shallow")
    assert shallow.returncode == 0, shallow.stderr  # every listed digest matches: only decompressing tells
    deep = run_cli("importer", str(bundle), "--verify-only")
    assert deep.returncode == 3 and diff_id in deep.stderr, deep.stderr
    docker(docker_host, "image", "rm", "fake/app:2", "fake/base:1", check=False)  # nothing present: all streamed
    before = image_ids(docker_host)
    proc = run_cli("importer", str(bundle), "--verify", "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 3, proc.stderr
    # found while streaming into docker load (decompress once) or by a deep pre-verify
    assert ("error[diffid-mismatch]" in proc.stderr or "error[verification-failed]" in proc.stderr), proc.stderr
    assert diff_id in proc.stderr
    assert image_ids(docker_host) == before  # no image, no staging tag, no dangling layer chain image


def test_a_lying_layer_of_an_image_already_present_is_still_caught(docker_host: str, tmp_path: Path) -> None:
    """The genuine fake/app:2 is in the engine, so nothing is streamed for it; its layers are
    still decompressed and checked before the import reports success."""
    genuine = make_bundle(tmp_path / "genuine")
    assert run_cli("importer", str(genuine), "--docker-host", docker_host, "--force", "--no-receipt").returncode == 0
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    before = image_ids(docker_host)
    proc = run_cli("importer", str(bundle), "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 3, proc.stderr
    assert "error[diffid-mismatch]" in proc.stderr and diff_id in proc.stderr
    assert image_ids(docker_host) == before
