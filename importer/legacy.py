"""Schema 1 and 2 bundles: one docker-archive instead of a blob store.

- Schema 1: ``images.tar`` (a plain ``docker save``), ``bundle.json``, ``SHA256SUMS``. Loadable
  on the far side with nothing but ``docker load -i images.tar``.
- Schema 2: ``images.tar.zst`` (the same archive, zstd-compressed), ``bundle.json``,
  ``SHA256SUMS`` and ``bundle-import.pyz``.

Neither supports deltas, parts or signatures (schema 3 does). Their images are presented to
the rest of the importer as schema-3 ``ImageRecord`` values (config digest and diff_ids; the
archive stands in for the blobs), so post-load verification is the same code.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from importer.compression import open_decompressed
from importer.digest import CHUNK, Digest, hash_file
from importer.errors import (
    DiffIDMismatch,
    DigestMismatch,
    IntegrityError,
    ManifestError,
    SizeMismatch,
    VerificationFailed,
)
from importer.limits import parse_json
from importer.manifest import (
    BUNDLE_JSON,
    SUMS_FILE,
    BlobRef,
    FileRecord,
    ImageRecord,
    LayerRecord,
    _Checker,
    valid_ref,
)
from importer.mediatypes import DOCKER_CONFIG, OCI_LAYER_TAR
from importer.problems import Problem
from importer.sums import parse_sums
from importer.verify import VerifyReport, _walk_files

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
    model, issues = check_legacy(parse_json(raw, BUNDLE_JSON), major)
    if model is None:
        raise ManifestError(
            f"reading {BUNDLE_JSON}: expected a valid schema-{major} bundle manifest, found {len(issues)} problem(s)",
            context="\n".join(issues[:50]),
            hint="the bundle was modified or damaged; re-copy it or re-export it",
        )
    return model


def verify_legacy(root: str, manifest: LegacyManifest, raw_bundle_json: bytes) -> VerifyReport:
    """SHA256SUMS and bundle.json agree; every file's digest; the archive decompresses to the
    recorded digest and size (schema 2)."""
    started = time.monotonic()
    report = VerifyReport(root=root)
    add = report.problems.append
    sums_path = os.path.join(root, SUMS_FILE)
    sums: Dict[str, Digest] = {}
    if os.path.isfile(sums_path):
        with open(sums_path, "rb") as f:
            sums, sum_problems = parse_sums(f.read(64 << 20))
        for text in sum_problems:
            add(Problem("sums-invalid", SUMS_FILE, text))
    else:
        add(Problem("missing-file", SUMS_FILE, "expected the checksum list, found no file"))
    if BUNDLE_JSON in sums and sums[BUNDLE_JSON] != Digest.of_bytes(raw_bundle_json):
        add(Problem("digest-mismatch", BUNDLE_JSON, "SHA256SUMS and the file disagree"))
    listed = {f.path for f in manifest.files} | {BUNDLE_JSON}
    for path in sorted(_walk_files(root)):
        if path not in listed and path != SUMS_FILE:
            add(Problem("unlisted-file", path, "present in the bundle folder but not listed in bundle.json"))
    for rec in manifest.files:
        full = os.path.join(root, rec.path)
        if rec.path in sums and sums[rec.path] != rec.digest:
            add(Problem("sums-mismatch", rec.path, f"bundle.json pins {rec.digest}, SHA256SUMS says {sums[rec.path]}"))
        if not os.path.isfile(full):
            add(Problem("missing-file", rec.path, f"expected a file of {rec.size} bytes, found none"))
            continue
        if os.path.getsize(full) != rec.size:
            add(Problem("size-mismatch", rec.path, f"expected {rec.size} bytes, found {os.path.getsize(full)}"))
            continue
        if rec.path == manifest.archive.path:
            try:
                _check_archive(root, manifest)
            except IntegrityError as e:
                got, _ = hash_file(full)  # name the root cause when the archive's own bytes changed
                if got != rec.digest:
                    add(Problem("digest-mismatch", rec.path, f"expected {rec.digest}, found {got}"))
                else:
                    add(Problem(e.reference, rec.path, e.message))
        else:
            got, _ = hash_file(full)
            if got != rec.digest:
                add(Problem("digest-mismatch", rec.path, f"expected {rec.digest}, found {got}"))
        report.files_checked += 1
        report.bytes_checked += rec.size
    report.seconds = time.monotonic() - started
    return report


class _ArchiveReader:
    """The archive's uncompressed bytes, hashed as they pass; ``finish`` checks both digests."""

    def __init__(self, raw: Any, plain: Any, manifest: LegacyManifest) -> None:
        self.raw = raw
        self.plain = plain
        self.manifest = manifest
        self.h = hashlib.sha256()
        self.n = 0

    def read(self, n: int = -1) -> bytes:
        from importer.errors import BundleError, DecompressFailed
        from importer.layers import _DECOMPRESS_ERRORS

        try:
            data: bytes = self.plain.read(CHUNK if n is None or n < 0 else n)
        except BundleError:
            raise
        except _DECOMPRESS_ERRORS as e:
            raise DecompressFailed(
                f"decompressing {self.manifest.archive.path}: expected a valid zstd stream, found damaged data ({e})",
                hint="the archive was modified or damaged in transit; re-copy the bundle",
            ) from e
        self.h.update(data)
        self.n += len(data)
        return data

    def finish(self) -> None:
        while self.read(CHUNK):
            pass
        while self.raw.read(CHUNK):
            pass
        m = self.manifest
        got = self.raw.digest()
        if got != m.archive.digest:
            raise DigestMismatch(f"checking {m.archive.path}: expected {m.archive.digest}, found {got}",
                                 hint="re-copy the bundle")
        if self.n != m.uncompressed_size:
            raise SizeMismatch(f"decompressing {m.archive.path}: expected {m.uncompressed_size} bytes, found {self.n}")
        if Digest("sha256", self.h.hexdigest()) != m.uncompressed_digest:
            raise DiffIDMismatch(f"decompressing {m.archive.path}: the archive's content differs from bundle.json")


def open_archive(root: str, manifest: LegacyManifest) -> Any:
    """A context manager yielding an ``_ArchiveReader`` over the (decompressed) archive."""
    import contextlib

    from importer.layers import HashingReader

    @contextlib.contextmanager
    def cm() -> Any:
        with open(os.path.join(root, manifest.archive.path), "rb") as f:
            raw = HashingReader(f)
            compression = "zstd" if manifest.major == 2 else "none"
            with open_decompressed(raw, compression, bound=manifest.uncompressed_size,  # type: ignore[arg-type]
                                   what=manifest.archive.path) as plain:
                yield _ArchiveReader(raw, plain, manifest)

    return cm()


def _check_archive(root: str, manifest: LegacyManifest) -> None:
    with open_archive(root, manifest) as reader:
        reader.finish()


def raise_if_problems(root: str, report: VerifyReport) -> None:
    if not report.ok:
        raise VerificationFailed(
            f"verifying {root}: expected every file to match bundle.json, found {len(report.problems)} problem(s)",
            report.problems,
            context="\n".join(str(p) for p in report.problems[:50]),
            hint="nothing was loaded; re-copy the bundle from the source medium (or re-export it) and retry",
        )


def bundle_major(root: str) -> Tuple[int, bytes]:
    """The schema major of the bundle at ``root`` and its bundle.json bytes (bounded read)."""
    from importer.limits import MAX_BUNDLE_JSON, read_file_limited
    from importer.manifest import parse_schema_version

    path = os.path.join(root, BUNDLE_JSON)
    if not os.path.isfile(path):
        raise ManifestError(
            f"reading {path}: expected a sneakernet bundle manifest, found no file",
            hint="point the importer at the bundle folder (the one holding bundle.json)",
        )
    raw = read_file_limited(path, MAX_BUNDLE_JSON, BUNDLE_JSON)
    major, _ = parse_schema_version(parse_json(raw, BUNDLE_JSON))
    return major, raw
