"""Engine-free OCI layouts for the multi-platform tests: an image index of tiny gzip layers and
configs written here, byte for byte the same each time (an ``oci:LAYOUT:REF`` source for ``bundle
export``; bundlegen.make_multiplatform_bundle and the ``pristine_multi`` fixture export one)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
REF = "multi/app:1"  # the index's name in every layout written here
ARCHES = ("amd64", "arm64", "ppc64le")  # write_layout's platforms (linux), amd64 first


def oci_blob(layout: Path, raw: bytes) -> dict[str, Any]:
    """Store ``raw`` in the layout's blobs; its digest and size."""
    digest = hashlib.sha256(raw).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(raw)
    return {"digest": f"sha256:{digest}", "size": len(raw)}


def gzip_layer(text: str) -> tuple[bytes, str]:
    """A gzip tar holding /platform.txt; (its bytes, its diff_id)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = text.encode()
        info = tarfile.TarInfo("platform.txt")
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
    plain = buf.getvalue()
    return gzip.compress(plain, mtime=0), "sha256:" + hashlib.sha256(plain).hexdigest()


def write_layout(layout: Path) -> dict[str, Any]:
    """An OCI layout whose ``multi/app:1`` is an index of three platforms (ARCHES); what was written
    (the same bytes every time: ``pristine_multi`` is exported from it)."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    entries, facts = [], {}
    for arch in ARCHES:
        layer, diff_id = gzip_layer(f"built for {arch}\n" * 200)
        layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **oci_blob(layout, layer)}
        config = json.dumps({"architecture": arch, "os": "linux", "config": {"Cmd": ["/arch.txt"]},
                             "rootfs": {"type": "layers", "diff_ids": [diff_id]}}, sort_keys=True).encode()
        config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json", **oci_blob(layout, config)}
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": config_desc, "layers": [layer_desc]}).encode()
        manifest_desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", **oci_blob(layout, manifest)}
        entries.append({**manifest_desc, "platform": {"architecture": arch, "os": "linux"}})
        facts[arch] = {"config": config_desc["digest"], "layer": layer_desc["digest"],
                       "manifest": manifest_desc["digest"]}
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": entries}, indent=1).encode()
    index_desc = {"mediaType": "application/vnd.oci.image.index.v1+json", **oci_blob(layout, index)}
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{**index_desc, "annotations": {"org.opencontainers.image.ref.name": REF}}]}))
    return {"index": index_desc["digest"], "index_bytes": index, "arch": facts}


def two_platform_layout(layout: Path) -> dict[str, Any]:
    """An OCI layout whose index.json names one image index (``multi/app:1``) for linux/amd64 and
    linux/arm64/v8. Returns the digests of each part."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    out: dict[str, Any] = {"platforms": {}}
    entries = []
    for arch, variant in (("amd64", ""), ("arm64", "v8")):
        gz, diff_id = gzip_layer(f"built for {arch}\n")
        layer = {"mediaType": OCI_LAYER, **oci_blob(layout, gz)}
        plat = {"os": "linux", "architecture": arch, **({"variant": variant} if variant else {})}
        config = {**plat, "config": {"Cmd": ["/bin/true"]}, "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                  "history": [{"created_by": f"test {arch}"}]}
        cfg = {"mediaType": OCI_CONFIG, **oci_blob(layout, json.dumps(config, sort_keys=True).encode())}
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg, "layers": [layer]}
        man = {"mediaType": OCI_MANIFEST, **oci_blob(layout, json.dumps(manifest, indent=2).encode())}
        entries.append({**man, "platform": plat})
        out["platforms"][arch] = {"manifest": man["digest"], "config": cfg["digest"], "layer": layer["digest"]}
    index_raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, indent=3).encode()
    index = {"mediaType": OCI_INDEX, **oci_blob(layout, index_raw)}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {**index, "annotations": {"org.opencontainers.image.ref.name": REF}}]}))
    out["index"], out["index_raw"] = index["digest"], index_raw
    return out


def named_indexes_layout(layout: Path, refs: list[str], arches: tuple[str, ...] = ARCHES) -> None:
    """An OCI layout holding one image index per ref of ``refs`` (linux/``arches``, each image's
    bytes its own), each named by its ref (the pull check's bundles: bundle export
    ``oci:LAYOUT:REF`` for each)."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    top = []
    for ref in refs:
        entries = []
        for arch in arches:
            layer, diff_id = gzip_layer(f"{ref} built for {arch}\n")
            layer_desc = {"mediaType": OCI_LAYER, **oci_blob(layout, layer)}
            config = json.dumps({"architecture": arch, "os": "linux", "config": {"Cmd": ["/platform.txt"]},
                                 "rootfs": {"type": "layers", "diff_ids": [diff_id]}}, sort_keys=True).encode()
            manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                   "config": {"mediaType": OCI_CONFIG, **oci_blob(layout, config)},
                                   "layers": [layer_desc]}).encode()
            entries.append({"mediaType": OCI_MANIFEST, **oci_blob(layout, manifest),
                            "platform": {"architecture": arch, "os": "linux"}})
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        top.append({"mediaType": OCI_INDEX, **oci_blob(layout, index),
                    "annotations": {"org.opencontainers.image.ref.name": ref}})
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": top}))
