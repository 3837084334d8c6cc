"""Assemble a schema-3 bundle folder around the blob store: OCI image manifests, index.json,
oci-layout, the importer zipapp, bundle.json (pinning every file) and SHA256SUMS."""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Dict, List, Sequence

from bundle.blobstore import BlobStore, WrittenBlob
from bundle.cudaneeds import cuda_record
from bundle.embed import build_pyz
from bundle.sources import SourceImage
from importer import SCHEMA_MAJOR, __version__
from importer.errors import UsageError
from importer.format.artifacts import layout_entry
from importer.format.digest import Digest
from importer.format.fileartifacts import FileArtifact
from importer.format.manifest import (
    BUNDLE_JSON,
    IMPORTER_PYZ,
    SUMS_FILE,
    BlobRef,
    BundleManifest,
    FileRecord,
    ImageRecord,
)
from importer.format.mediatypes import OCI_CONFIG, OCI_INDEX, OCI_MANIFEST, REF_NAME_ANNOTATION
from importer.format.sums import format_sums
from importer.streams.fsutil import atomic_write_bytes, fsync_dir


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def oci_manifest(config: WrittenBlob, image: SourceImage) -> bytes:
    return _json_bytes({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": str(config.digest), "size": config.size},
        "layers": [
            {"mediaType": layer.media_type, "digest": str(layer.digest), "size": layer.size}
            for layer in image.layers
        ],
    })


def write_bundle(root: str, store: BlobStore, images: Sequence[SourceImage], source: Dict[str, Any],
                 *, created: str | None = None, file_artifacts: Sequence[FileArtifact] = ()) -> BundleManifest:
    """Write everything but the blobs already in ``store``; return the bundle manifest.
    ``file_artifacts`` (schema 3.6): files carried as OCI artifacts, their blobs in ``store``, named
    in index.json under their refs like images."""
    files: Dict[str, FileRecord] = {}

    def record(path: str, digest: Digest, size: int) -> None:
        files[path] = FileRecord(path, digest, size)

    records: List[ImageRecord] = []
    index_entries: List[Dict[str, Any]] = []
    for image in images:
        variants = [_record(store, v) for v in (image, *image.others)]
        index = None
        if image.raw_index is not None:
            blob = store.write_bytes(image.raw_index)
            index = BlobRef(image.index_media_type, blob.digest, blob.size)
        primary = variants[0]
        records.append(ImageRecord(refs=image.refs, manifest=primary.manifest, config=primary.config,
                                   layers=primary.layers, platform=primary.platform, index=index,
                                   others=tuple(variants[1:]), cuda=cuda_record(store, image),
                                   artifacts=image.artifacts))
        index_entries += _layout_entries(image.refs, variants, index)
    index_entries += _artifact_entries(records, index_entries)
    taken = {ref for r in records for ref in r.refs}
    for art in file_artifacts:
        if art.ref in taken:
            raise UsageError(f"exporting with --artifact-ref {art.ref}: expected a name no image of the bundle "
                             "carries, found an image of that name", hint="choose another --artifact-ref")
        index_entries.append({**art.manifest.to_dict(), "artifactType": art.artifact_type,
                              "annotations": {REF_NAME_ANNOTATION: art.ref}})
        for sig in art.signatures:  # 3.7: its cosign signatures under their cosign tags (as `cosign save`)
            desc, name = layout_entry(sig) or (sig.manifest.to_dict(), "")
            named = {e.get("annotations", {}).get(REF_NAME_ANNOTATION) for e in index_entries}
            index_entries.append({**desc, "annotations": {REF_NAME_ANNOTATION: name}} if name not in named else desc)
    for path, blob in store.written.items():
        record(path, blob.digest, blob.size)

    small = {
        "oci-layout": _json_bytes({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json_bytes({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": index_entries}),
        IMPORTER_PYZ: build_pyz(),
    }
    for path, data in small.items():
        atomic_write_bytes(os.path.join(root, path), data, mode=0o755 if path == IMPORTER_PYZ else 0o644)
        record(path, Digest.of_bytes(data), len(data))

    manifest_model = BundleManifest(
        schema_version=f"{SCHEMA_MAJOR}.{_files_minor(file_artifacts) or _minor(records)}",
        created=created or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        tool_version=__version__,
        source=source,
        importer=files[IMPORTER_PYZ],
        images=tuple(records),
        files=tuple(sorted(files.values(), key=lambda f: f.path)),
        file_artifacts=tuple(file_artifacts),
    )
    raw_bj = (json.dumps(manifest_model.to_dict(), indent=2) + "\n").encode("utf-8")
    atomic_write_bytes(os.path.join(root, BUNDLE_JSON), raw_bj)
    write_sums(root, manifest_model, raw_bj)
    fsync_dir(store.dir)
    fsync_dir(root)
    return manifest_model


def _files_minor(file_artifacts: Sequence[FileArtifact]) -> int:
    """The minor files make a bundle: 8 when one is left out (a file delta), 7 when one is signed,
    6 when carried, else 0."""
    if any(a.held_files() for a in file_artifacts):
        return 8
    if any(a.signatures for a in file_artifacts):
        return 7
    return 6 if file_artifacts else 0


def _layout_entries(refs: Sequence[str], variants: Sequence[ImageRecord],
                    index: BlobRef | None) -> List[Dict[str, Any]]:
    """index.json entries of one image. A carried image index is named by the refs (3.3: layout
    readers such as skopeo ``oci:DIR:REF`` see every platform), each platform's manifest listed
    unnamed after it; else the refs name the primary platform's manifest."""
    entries: List[Dict[str, Any]] = []
    if index is not None:
        entries += [{**index.to_dict(), "annotations": {REF_NAME_ANNOTATION: ref}} for ref in refs]
    for n, rec in enumerate(variants):
        base: Dict[str, Any] = rec.manifest.to_dict()
        if rec.platform.get("os") and rec.platform.get("architecture"):
            base["platform"] = dict(rec.platform)
        if index is None and refs and n == 0:  # the refs name the primary; the other platforms are unnamed
            entries += [{**base, "annotations": {REF_NAME_ANNOTATION: ref}} for ref in refs]
        else:
            entries.append(base)
    if index is not None and not refs:
        entries.insert(0, index.to_dict())
    return entries


def _artifact_entries(records: Sequence[ImageRecord], entries: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """index.json entries of the artifacts carried with the images (3.5), as the OCI layout target
    lists them (``layout_entry``): ``oci:BUNDLE:sha256-<hex>.sig`` reads a signature, a referrer is
    listed unnamed with its artifactType. Each once; a name taken already (two images of one
    manifest digest, each with its own signature) leaves the later one unnamed."""
    out: List[Dict[str, Any]] = []
    names = {e["annotations"][REF_NAME_ANNOTATION] for e in entries if "annotations" in e}
    listed = {e["digest"] for e in entries}
    for rec in records:
        for art in rec.artifacts:
            entry = layout_entry(art)
            if entry is None:
                continue
            desc, name = entry
            if name and name not in names:
                out.append({**desc, "annotations": {REF_NAME_ANNOTATION: name}})
                names.add(name)
            elif desc["digest"] not in listed:
                out.append(desc)
            listed.add(desc["digest"])
    return out


def _record(store: BlobStore, image: SourceImage) -> ImageRecord:
    """One platform of an image: its config and manifest written (the source's manifest byte for
    byte when it kept one: same digest, same image ID; else one of the bundle's own)."""
    config = store.write_bytes(image.raw_config)
    if image.raw_manifest is not None:
        raw_manifest = image.raw_manifest
        manifest_type, config_type = image.manifest_media_type, image.config_media_type
    else:
        raw_manifest = oci_manifest(config, image)
        manifest_type, config_type = OCI_MANIFEST, OCI_CONFIG
    manifest = store.write_bytes(raw_manifest)
    return ImageRecord(refs=(), manifest=BlobRef(manifest_type, manifest.digest, manifest.size),
                       config=BlobRef(config_type, config.digest, config.size), layers=image.layers,
                       platform=dict(image.platform))


def _minor(records: Sequence[ImageRecord]) -> int:
    """The lowest minor that says what the bundle holds, so older 3.x importers read the rest
    (3.6, files carried as artifacts, is chosen by write_bundle):
    3.5 attached artifacts (signatures, SBOMs, referrers), 3.4 an image's CUDA needs (``cuda``), 3.3 an
    image index named in index.json, 3.2 multi-platform images, 3.1 delta bundles (external layers), else 3.0."""
    if any(r.artifacts for r in records):
        return 5
    if any(r.cuda is not None for r in records):
        return 4
    if any(r.index is not None for r in records):
        return 3
    if any(r.others for r in records):
        return 2
    return 1 if any(x.external for r in records for v in r.variants for x in v.layers) else 0


def write_sums(root: str, manifest: BundleManifest, raw_bundle_json: bytes,
               extra: Dict[str, Digest] | None = None) -> None:
    """SHA256SUMS over every file but itself; plain `sha256sum -c SHA256SUMS` accepts it."""
    entries = [(f.path, f.digest) for f in manifest.files]
    entries.append((BUNDLE_JSON, Digest.of_bytes(raw_bundle_json)))
    entries += list((extra or {}).items())
    atomic_write_bytes(os.path.join(root, SUMS_FILE), format_sums(entries))
