"""inspect_bundle(): what a bundle holds, from bundle.json alone (reads no blob)."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from importer.format.digest import Digest
from importer.format.legacy import LegacyManifest
from importer.format.manifest import SUMS_FILE
from importer.input.opened import open_bundle


def inspect_bundle(root: str) -> Dict[str, Any]:
    """``root`` is a bundle folder, a bundle tar or its parts index (bundle.json read in place)."""
    bundle = open_bundle(root)
    raw = bundle.raw_bundle_json
    signed = bundle.raw_signature is not None
    major = bundle.schema_major()
    if major in (1, 2):
        return _inspect_legacy(root, bundle.legacy_manifest(major), raw)
    manifest = bundle.manifest()
    # inspection reads bundle.json alone, but a link, FIFO or device among its files is refused here as everywhere
    bundle.refuse_odd_files([*(f.path for f in manifest.files), SUMS_FILE], f"inspecting {bundle.path}")
    users: Dict[Digest, List[str]] = {}
    for image in manifest.images:
        for layer in image.layers:
            names = users.setdefault(layer.digest, [])
            if image.name not in names:
                names.append(image.name)
    images: List[Dict[str, Any]] = []
    for image in manifest.images:
        images.append({
            "refs": list(image.refs),
            "platform": image.platform,
            "manifestDigest": str(image.manifest.digest),
            "configDigest": str(image.config.digest),
            "compressedSize": sum(x.size for x in image.layers),
            "uncompressedSize": sum(x.uncompressed_size for x in image.layers),
            "layers": [
                {**layer.to_dict(), "sharedWith": [n for n in users[layer.digest] if n != image.name]}
                for layer in image.layers
            ],
            # schema 3.2: every platform carried (the primary first) and the source's index digest
            "platforms": [dict(v.platform) for v in image.variants],
            "indexDigest": str(image.index.digest) if image.index is not None else None,
            "cuda": image.cuda,  # schema 3.4: the image's CUDA needs (docs/gpu-fit.md)
            # schema 3.5: what the source registry attached to it (signatures, SBOMs, referrers)
            "artifacts": [{"kind": a.kind, "subject": str(a.subject), "manifestDigest": str(a.manifest.digest),
                           "tag": a.tag or None, "artifactType": a.artifact_type or None,
                           "size": sum(b.size for b in a.every_blob())} for a in image.artifacts],
        })
    shared = [
        {"digest": str(d), "images": names} for d, names in users.items() if len(names) > 1
    ]
    return {
        "bundle": bundle.path,
        "bundleDigest": str(bundle.digest),
        "schemaVersion": manifest.schema_version,
        "created": manifest.created,
        "toolVersion": manifest.tool_version,
        "source": manifest.source,
        "signed": signed,
        "images": images,
        "sharedLayers": shared,
        # schema 3.6: the files carried as OCI artifacts, each under its ref
        "artifacts": [{"ref": a.ref, "artifactType": a.artifact_type, "manifestDigest": str(a.manifest.digest),
                       "files": [f.to_dict() for f in a.files],
                       "size": sum(b.size for b in a.every_blob())} for a in manifest.file_artifacts],
        "delta": None if not manifest.is_delta else {
            "requires": [
                {"diffId": str(x.diff_id), "uncompressedSize": x.uncompressed_size,
                 "usedBy": [i.name for i in manifest.images if x in i.layers]}
                for x in manifest.external_layers()
            ],
        },
        "totals": {
            "files": len(manifest.files),
            "bytes": manifest.compressed_bytes(),
            "uniqueLayers": len(manifest.unique_layers()),
            "uncompressedBytes": manifest.uncompressed_bytes(),
        },
    }


def _inspect_legacy(root: str, m: LegacyManifest, raw: bytes) -> Dict[str, Any]:
    return {
        "bundle": os.path.abspath(root),
        "bundleDigest": str(Digest.of_bytes(raw)),
        "schemaVersion": m.schema_version,
        "created": m.created,
        "toolVersion": m.tool_version,
        "source": m.source,
        "signed": False,
        "archive": m.archive.to_dict(),
        "images": [
            {"refs": list(i.refs), "configDigest": str(i.config.digest), "compressedSize": 0,
             "uncompressedSize": 0, "layers": [{"diffId": str(x.diff_id), "sharedWith": []} for x in i.layers]}
            for i in m.images
        ],
        "sharedLayers": [],
        "totals": {"files": len(m.files), "bytes": m.compressed_bytes(), "uniqueLayers": None,
                   "uncompressedBytes": m.uncompressed_size},
    }
