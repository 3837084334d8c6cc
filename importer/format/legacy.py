"""Schema 1 and 2 bundles: what they are. One docker-archive instead of a blob store.

- Schema 1: ``images.tar`` (a plain ``docker save``), ``bundle.json``, ``SHA256SUMS``. Loadable
  on the far side with nothing but ``docker load -i images.tar``.
- Schema 2: ``images.tar.zst`` (the same archive, zstd-compressed), ``bundle.json``,
  ``SHA256SUMS`` and ``bundle-import.pyz``.

Their bundle.json model and checks, and their strict SHA256SUMS parser. Their images are presented
to the rest of the importer as schema-3 ``ImageRecord`` values (config digest and diff_ids; the
archive stands in for the blobs), so post-load verification is the same code."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from importer.errors import (
    ManifestError,
)
from importer.format.digest import Digest
from importer.format.limits import parse_json
from importer.format.manifest import (
    BUNDLE_JSON,
    BlobRef,
    FileRecord,
    ImageRecord,
    LayerRecord,
    _Checker,
    valid_ref,
)
from importer.format.mediatypes import DOCKER_CONFIG, OCI_LAYER_TAR

MEDIA_TYPES = {1: "application/vnd.sneakernet.bundle.v1+json", 2: "application/vnd.sneakernet.bundle.v2+json"}
ARCHIVES = {1: "images.tar", 2: "images.tar.zst"}


@dataclass(frozen=True)
class LegacyManifest:
    schema_version: str
    major: int
    created: str
    tool_version: str
    source: Dict[str, Any]
    images: Tuple[ImageRecord, ...]
    archive: FileRecord
    uncompressed_digest: Digest
    uncompressed_size: int
    files: Tuple[FileRecord, ...]

    def compressed_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def uncompressed_bytes(self) -> int:
        return self.uncompressed_size


def as_image_record(refs: List[str], config: Digest, diff_ids: List[Digest]) -> ImageRecord:
    """A schema-3 view of a legacy image: what post-load verification compares."""
    layers = tuple(LayerRecord(OCI_LAYER_TAR, d, 0, d, 0) for d in diff_ids)
    ref = BlobRef(DOCKER_CONFIG, config, 0)
    return ImageRecord(tuple(refs), ref, ref, layers, {})


def check_legacy(doc: Any, major: int) -> Tuple[Optional[LegacyManifest], List[str]]:
    c = _Checker()
    top = c.obj(doc, "bundle.json")
    if top.get("mediaType") != MEDIA_TYPES[major]:
        c.fail("mediaType", f"expected {MEDIA_TYPES[major]!r}, found {top.get('mediaType')!r}"[:200])
    version = c.string(top.get("schemaVersion"), "schemaVersion")
    created = c.string(top.get("created"), "created")
    tool = c.obj(top.get("tool"), "tool")
    tool_version = c.string(tool.get("version"), "tool.version")
    source = c.obj(top.get("source", {}), "source")
    images: List[ImageRecord] = []
    raw_images = c.lst(top.get("images"), "images")
    if not raw_images:
        c.fail("images", "expected at least one image, found none")
    for i, raw in enumerate(raw_images):
        where = f"images[{i}]"
        img = c.obj(raw, where)
        refs: List[str] = []
        for j, ref in enumerate(c.lst(img.get("refs"), f"{where}.refs")):
            if valid_ref(ref):
                refs.append(ref)
            else:
                c.fail(f"{where}.refs[{j}]", f"expected an image reference, found {ref!r}"[:200])
        config = c.digest(img.get("configDigest"), f"{where}.configDigest")
        raw_ids = c.lst(img.get("diffIds"), f"{where}.diffIds")
        diff_ids = [c.digest(d, f"{where}.diffIds[{k}]") for k, d in enumerate(raw_ids)]
        if config is not None and all(d is not None for d in diff_ids):
            images.append(as_image_record(refs, config, [d for d in diff_ids if d is not None]))
    archive = c.filerecord(top.get("archive"), "archive")
    if archive is not None and archive.path != ARCHIVES[major]:
        c.fail("archive.path", f"expected {ARCHIVES[major]!r}, found {archive.path!r}")
    udigest = c.digest(top.get("uncompressedDigest"), "uncompressedDigest")
    usize = c.size(top.get("uncompressedSize"), "uncompressedSize")
    files: List[FileRecord] = []
    for i, raw in enumerate(c.lst(top.get("files"), "files")):
        rec = c.filerecord(raw, f"files[{i}]")
        if rec is not None:
            files.append(rec)
    if archive is not None and archive not in files:
        c.fail("files", f"expected the archive {archive.path!r} listed with the same digest and size")
    if c.issues or archive is None or udigest is None:
        return None, c.issues or ["bundle.json: incomplete"]
    return LegacyManifest(version, major, created, tool_version, dict(source), tuple(images), archive,
                          udigest, usize, tuple(files)), []


def load_legacy_manifest(raw: bytes, major: int) -> LegacyManifest:
    return legacy_manifest_of(parse_json(raw, BUNDLE_JSON), major)


def legacy_manifest_of(doc: Any, major: int) -> LegacyManifest:
    """A schema 1/2 bundle.json's parsed JSON document into its model (importer/input/opened.py
    ``OpenedBundle.legacy_manifest`` parses the bytes once per run)."""
    model, issues = check_legacy(doc, major)
    if model is None:
        raise ManifestError(
            f"reading {BUNDLE_JSON}: expected a valid schema-{major} bundle manifest, found {len(issues)} problem(s)",
            context="\n".join(issues[:50]),
            hint="the bundle was modified or damaged; re-copy it or re-export it",
        )
    return model


_SUMS_LINE = re.compile(rb"([0-9a-f]{64})  ([!-~]+)")


def parse_legacy_sums(raw: bytes) -> Tuple[Dict[str, Digest], List[str]]:
    """SHA256SUMS of a schema 1/2 bundle, strictly: lines split on ``\n`` only, each exactly
    ``<64 lowercase hex>  <name>``, the last one ended by ``\n``, no name twice."""
    entries: Dict[str, Digest] = {}
    problems: List[str] = []
    lines = raw.split(b"\n")
    if lines[-1] != b"":
        problems.append(f"SHA256SUMS: expected every line ended by a newline, found {lines[-1][:120]!r} at the end")
    for number, line in enumerate(lines[:-1], 1):
        m = _SUMS_LINE.fullmatch(line)
        if m is None:
            problems.append(f"SHA256SUMS line {number}: expected '<64 lowercase hex>  <file name>', "
                            f"found {line[:120]!r}")
            continue
        name = m.group(2).decode("ascii")
        if name in entries:
            problems.append(f"SHA256SUMS line {number}: {name!r} is listed twice")
            continue
        entries[name] = Digest.from_hex(m.group(1).decode("ascii"))
    return entries, problems
