"""Engine-free bundles for fast tests: fake `docker save` streams through the real exporter."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import zstandard

from bundle.blobstore import BlobStore
from bundle.sources.docker_daemon import read_docker_save
from bundle.writer import write_bundle
from tests.kit.fakesave import FakeImage, docker_save, layer_tar, sample_images
from tests.kit.trustkit import regenerate_sums

FLEET_REFS = ("fleet/base:1", "fleet/app:2")  # fleet_bundle's images


def make_bundle(root: Path, *, compression: str = "zstd") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(str(root), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save(sample_images())), store, compression=compression)
    write_bundle(str(root), store, images, {"kind": "test"})
    return root


def make_multiplatform_bundle(root: Path, *, layout: Path | None = None) -> Path:
    """A schema-3.2 bundle of one image index (linux/amd64, arm64, ppc64le: the layout
    layoutgen.write_layout writes) exported with ``--all-platforms``, engine-free."""
    from bundle.export import export_images
    from tests.kit.layoutgen import REF, write_layout

    layout = layout or root.parent / f"{root.name}.layout"
    write_layout(layout)
    export_images([f"oci:{layout}:{REF}"], str(root), compression="gzip", all_platforms=True)
    return root


def fleet_bundle(root: Path, seed: bytes = b"") -> Path:
    """Two small images sharing a layer, named fleet/base:1 and fleet/app:2; gzip layers, which
    Debian 12's Docker 20.10 can pull from a registry (it cannot pull zstd)."""
    base = layer_tar({"bin/tool": b"#!/bin/sh\necho tool\n" * 200 + seed, "etc/os-release": b"ID=fleet\n"})
    top = layer_tar({"app/main.py": b"print('fleet')\n" * 500 + seed})
    images = [FakeImage(FLEET_REFS[0], [base]), FakeImage(FLEET_REFS[1], [base, top])]
    root.mkdir(parents=True)
    store = BlobStore(str(root), fsync=False)
    found = read_docker_save(io.BytesIO(docker_save(images)), store, compression="gzip")
    write_bundle(str(root), store, found, {"kind": "test"})
    return root


BIG_REFS = ("big/base:1", "big/app:2")  # big_bundle's images


def big_bundle(root: Path, *, compression: str = "none", mib: int = 3) -> Path:
    """Two images whose top layer holds ``mib`` MiB of random bytes (more than one 1 MiB chunk of
    the load streams), the base a small text layer; ``compression="none"``: every layer stored
    uncompressed (digest = diff_id), as ``--compression auto`` keeps random weights."""
    import os

    base = layer_tar({"etc/os-release": b"ID=big\n" * 100})
    top = layer_tar({"weights.bin": os.urandom(mib * 1024 * 1024)})
    images = [FakeImage(BIG_REFS[0], [base]), FakeImage(BIG_REFS[1], [base, top])]
    root.mkdir(parents=True)
    store = BlobStore(str(root), fsync=False)
    found = read_docker_save(io.BytesIO(docker_save(images)), store, compression=compression)
    write_bundle(str(root), store, found, {"kind": "test"})
    return root


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


def bomb_bundle(root: Path) -> tuple[Path, str]:
    """A bundle, consistent in every digest it lists, whose last layer of the last image records a
    quarter of its real uncompressed size (a decompression bomb as bundle.json sees it; config and
    diff_id true, so an engine that checks only diff_ids loads it); returns it and that layer's digest."""
    bundle = make_bundle(root)
    doc = json.loads((bundle / "bundle.json").read_text())
    layer = doc["images"][-1]["layers"][-1]
    layer["uncompressedSize"] = max(1, layer["uncompressedSize"] // 4)
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(bundle)
    return bundle, str(layer["digest"])
