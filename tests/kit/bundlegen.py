"""Engine-free bundles for fast tests: fake `docker save` streams through the real exporter."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import zstandard

from bundle.blobstore import BlobStore
from bundle.exportloop import read_docker_save
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
MANY_REF = "many/layers:1"  # many_layers_bundle's image


def many_layers_bundle(root: Path, layers: int = 12, *, compression: str = "zstd") -> Path:
    """One image of ``layers`` small layers (a few KiB to 1.5 MiB, the last of more than one
    1 MiB chunk), as a 100-layer image has them: per-layer costs dominate its streams."""
    import random

    rng = random.Random(layers)
    tars = [layer_tar({f"l{n}/data.bin": rng.randbytes(rng.randint(2_000, 300_000))
                       + b"text " * (250_000 if n == layers - 1 else rng.randint(10, 200_000))})
            for n in range(layers)]
    root.mkdir(parents=True)
    store = BlobStore(str(root), fsync=False)
    found = read_docker_save(io.BytesIO(docker_save([FakeImage(MANY_REF, tars)])), store, compression=compression)
    write_bundle(str(root), store, found, {"kind": "test"})
    return root




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


# ============================================================================ schema 3.5: signed, CUDA

#: make_signed_bundle's images; their signatures name the repository of each
SIGNED_REFS = ("registry.example:5000/fuzz/base:1", "registry.example:5000/fuzz/app:2")
#: what make_signed_bundle's app image declares (its Env and layers), and the ``cuda`` record
#: make_signed_multiplatform_bundle writes for its image
CUDA_ENV = ["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471"]
CUDA_RECORD = {"cudaVersion": "12.4.1", "require": {"NVIDIA_REQUIRE_CUDA": CUDA_ENV[1].split("=", 1)[1]},
               "disableRequire": False, "compatLibs": ["550.54.15"], "torchCuda": "12.4"}


class _CudaImage(FakeImage):
    @property
    def config(self) -> bytes:
        doc = json.loads(super().config)
        doc["config"]["Env"] = ["PATH=/bin", *CUDA_ENV]
        return json.dumps(doc).encode()


def kit_key(bundle: Path) -> tuple[Any, Path]:
    """(private key, public key file) of the test key a signed bundle of this module was signed
    with: ``cosign.key``/``cosign.pub`` beside the bundle (what ``--require-signed`` is given)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key((bundle.parent / "cosign.key").read_bytes(), password=None)
    return key, bundle.parent / "cosign.pub"


def _new_kit_key(directory: Path) -> Any:
    from cryptography.hazmat.primitives import serialization

    from tests.kit.supplykit import ecdsa_key

    key, _pub = ecdsa_key(directory, "cosign")
    (directory / "cosign.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return key


def make_signed_bundle(root: Path) -> Path:
    """A schema 3.5 bundle made by the real exporter of two images (SIGNED_REFS, zstd), the app
    one declaring CUDA needs (its Env: CUDA_VERSION, NVIDIA_REQUIRE_CUDA; a layer holding a
    compat library and torch's version.py: a full ``cuda`` record); then, as the source registry
    would have them attached: each image's cosign signature (``sha256-<hex>.sig``, a
    simple-signing payload signed by the kit key, kit_key) and, on the app image, an SPDX SBOM
    referrer with its ``sha256-<hex>`` fallback index. Every blob listed in ``files``."""
    root.mkdir(parents=True, exist_ok=True)
    key = _new_kit_key(root.parent)
    base = layer_tar({"bin/tool": b"#!/bin/sh\necho tool\n" * 50, "etc/os-release": b"ID=fake\n"})
    top = layer_tar({"usr/local/cuda-12.4/compat/libcuda.so.550.54.15": b"\x7fELF fake\n",
                     "usr/lib/python3/dist-packages/torch/version.py": b"cuda: Optional[str] = '12.4'\n",
                     "app/main.py": b"print('hi')\n" * 1000})
    store = BlobStore(str(root), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save([FakeImage(SIGNED_REFS[0], [base]),
                                                      _CudaImage(SIGNED_REFS[1], [base, top])])), store,
                              compression="zstd")
    write_bundle(str(root), store, images, {"kind": "test"})
    doc = json.loads((root / "bundle.json").read_text())
    assert doc["images"][1].get("cuda"), "the exporter no longer writes the app image's cuda record"
    for image in doc["images"]:
        repo = image["refs"][0].rsplit(":", 1)[0]
        attach_signature(root, doc, image, image["manifest"]["digest"], repo, key)
    attach_sbom(root, doc, doc["images"][1], doc["images"][1]["manifest"])
    _finish(root, doc)
    return root


#: make_signed_files_bundle's file artifact; its signature names this ref's repository
SIGNED_FILES_REF = "registry.example:5000/fuzz/model:1"


def make_signed_files_bundle(root: Path) -> Path:
    """A schema 3.7 bundle made by the real exporter: make_signed_bundle's app image (its ``cuda``
    record, its cosign signature by the kit key) and a file artifact of a small model folder
    (``--model``, SIGNED_FILES_REF) signed by the kit key as ``bundle export --sign-artifacts-key``
    signs it (bundle/artifactsign.py). Every blob listed in ``files``."""
    from bundle.artifactsign import sign_artifacts
    from bundle.fileartifact import scan_files, write_artifact

    root.mkdir(parents=True, exist_ok=True)
    key = _new_kit_key(root.parent)
    src = root.parent / "model"
    (src / "tokenizer").mkdir(parents=True, exist_ok=True)
    for rel, data in {"model.safetensors": bytes(range(256)) * 64, "config.json": b'{"layers": 2}\n',
                      "tokenizer/tokenizer.json": b'{"vocab": {}}\n', "README.md": b"# fuzz\n"}.items():
        (src / rel).write_bytes(data)
    base = layer_tar({"bin/tool": b"#!/bin/sh\necho tool\n" * 50, "etc/os-release": b"ID=fake\n"})
    top = layer_tar({"usr/local/cuda-12.4/compat/libcuda.so.550.54.15": b"\x7fELF fake\n",
                     "usr/lib/python3/dist-packages/torch/version.py": b"cuda: Optional[str] = '12.4'\n"})
    store = BlobStore(str(root), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save([_CudaImage(SIGNED_REFS[1], [base, top])])), store,
                              compression="zstd")
    files = scan_files([str(src)], [], SIGNED_FILES_REF, model=True)
    assert files is not None
    write_bundle(str(root), store, images, {"kind": "test"},
                 file_artifacts=sign_artifacts(store, (write_artifact(store, files),), [key]))
    doc = json.loads((root / "bundle.json").read_text())
    assert doc["schemaVersion"] == "3.7" and doc["artifacts"][0]["signatures"]
    image = doc["images"][0]
    attach_signature(root, doc, image, image["manifest"]["digest"], SIGNED_REFS[1].rsplit(":", 1)[0], key)
    _finish(root, doc, "3.7")
    return root


def make_signed_multiplatform_bundle(root: Path) -> Path:
    """make_multiplatform_bundle's three-platform image (ref multi/app:1), made schema 3.5: its
    carried index signed by the kit key (which covers every platform it lists), its primary
    platform signed too, an SBOM referrer on the primary, and a ``cuda`` record (CUDA_RECORD)."""
    make_multiplatform_bundle(root)
    key = _new_kit_key(root.parent)
    doc = json.loads((root / "bundle.json").read_text())
    image = doc["images"][0]
    repo = image["refs"][0].rsplit(":", 1)[0]
    attach_signature(root, doc, image, image["index"]["digest"], repo, key)
    attach_signature(root, doc, image, image["manifest"]["digest"], repo, key)
    attach_sbom(root, doc, image, image["manifest"])
    image["cuda"] = dict(CUDA_RECORD)
    _finish(root, doc)
    return root


def _add_blob(root: Path, doc: dict[str, Any], data: bytes, media_type: str) -> dict[str, Any]:
    digest = _put_blob(root, data)
    path = "blobs/sha256/" + digest[7:]
    if not any(f["path"] == path for f in doc["files"]):
        doc["files"].append({"path": path, "digest": digest, "size": len(data)})
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def attach_signature(root: Path, doc: dict[str, Any], image: dict[str, Any], digest: str, identity: str,
                     key: Any, *, payload: bytes | None = None) -> dict[str, Any]:
    """A cosign signature of ``digest`` as ``identity`` (the payload cosign writes, or ``payload``)
    by ``key``, stored as cosign stores it (a manifest whose one simple-signing layer carries the
    signature annotation) and recorded in ``image``'s artifacts; returns the record."""
    import base64

    from tests.kit.supplykit import OCI_CONFIG, OCI_MANIFEST, SIMPLE_SIGNING, sign_bytes
    from tests.kit.supplykit import payload as make_payload

    body = payload if payload is not None else make_payload(digest, identity)
    layer = _add_blob(root, doc, body, SIMPLE_SIGNING)
    config = {"architecture": "", "os": "", "config": {}, "created": "0001-01-01T00:00:00Z",
              "rootfs": {"type": "layers", "diff_ids": [_sha(body)]}}
    cfg = _add_blob(root, doc, json.dumps(config, separators=(",", ":")).encode(), OCI_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg, "layers": [
        {**layer, "annotations": {"dev.cosignproject.cosign/signature":
                                  base64.b64encode(sign_bytes(key, body)).decode()}}]}
    ref = _add_blob(root, doc, json.dumps(manifest, separators=(",", ":")).encode(), OCI_MANIFEST)
    record = {"kind": "signature", "subject": digest, "manifest": ref, "blobs": [cfg, layer],
              "tag": "sha256-" + digest[7:] + ".sig", "repository": identity}
    image.setdefault("artifacts", []).append(record)
    return record


def attach_sbom(root: Path, doc: dict[str, Any], image: dict[str, Any], subject: dict[str, Any]) -> None:
    """An SPDX SBOM as an OCI 1.1 referrer of ``subject`` (a descriptor) and the ``sha256-<hex>``
    fallback index listing it, both recorded in ``image``'s artifacts."""
    from tests.kit.supplykit import OCI_EMPTY, OCI_INDEX, OCI_MANIFEST, SPDX

    empty = _add_blob(root, doc, b"{}", OCI_EMPTY)
    sbom = _add_blob(root, doc, json.dumps({"spdxVersion": "SPDX-2.3", "name": subject["digest"]}).encode(), SPDX)
    referrer = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": SPDX, "config": empty,
                "layers": [sbom], "subject": {k: subject[k] for k in ("mediaType", "digest", "size")}}
    ref = _add_blob(root, doc, json.dumps(referrer, separators=(",", ":")).encode(), OCI_MANIFEST)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{**ref, "artifactType": SPDX}]}
    idx = _add_blob(root, doc, json.dumps(index, separators=(",", ":")).encode(), OCI_INDEX)
    hexpart = subject["digest"][7:]
    image.setdefault("artifacts", []).extend([
        {"kind": "referrers-index", "subject": subject["digest"], "manifest": idx, "blobs": [],
         "tag": "sha256-" + hexpart},
        {"kind": "referrer", "subject": subject["digest"], "manifest": ref, "blobs": [empty, sbom],
         "artifactType": SPDX}])


def _finish(root: Path, doc: dict[str, Any], version: str = "3.5") -> None:
    doc["schemaVersion"] = version
    doc["files"] = sorted(doc["files"], key=lambda f: f["path"])
    (root / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    regenerate_sums(root)


def make_signed_picked_bundle(root: Path) -> Path:
    """One platform (linux/arm64) of layoutgen.write_layout's image, exported alone (schema 3.5),
    as a registry export carries it when the tag's index is signed: the index it was picked from
    byte for byte (a record of kind ``index``, subject itself), its cosign signature by the kit key
    (which covers the platform the index lists), and a ``cuda`` record (CUDA_RECORD)."""
    from bundle.export import export_images
    from tests.kit.layoutgen import REF, write_layout
    from tests.kit.supplykit import OCI_INDEX

    layout = root.parent / f"{root.name}.layout"
    facts = write_layout(layout)
    export_images([f"oci:{layout}:{REF}"], str(root), compression="gzip", platforms=["linux/arm64"])
    key = _new_kit_key(root.parent)
    doc = json.loads((root / "bundle.json").read_text())
    image = doc["images"][0]
    repo = image["refs"][0].rsplit(":", 1)[0]
    index = _add_blob(root, doc, facts["index_bytes"], OCI_INDEX)
    image["artifacts"] = [{"kind": "index", "subject": index["digest"], "manifest": index, "blobs": [],
                           "repository": repo}]
    attach_signature(root, doc, image, index["digest"], repo, key)
    image["cuda"] = dict(CUDA_RECORD)
    _finish(root, doc)
    return root
