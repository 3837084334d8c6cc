"""Verifying schema 1 and 2 bundles (one docker-archive instead of a blob store; their format:
importer/format/legacy.py, the pass through the archive: importer/verify/legacyarchive.py).

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
import json
import os
import stat
import time
from typing import Any, BinaryIO, Dict, Optional, Tuple

from importer.errors import (
    IntegrityError,
    MissingBlob,
    NotRegularFile,
    VerificationFailed,
)
from importer.format.digest import CHUNK, Digest
from importer.format.legacy import LegacyManifest, parse_legacy_sums
from importer.format.limits import MAX_LEGACY_SUMS, read_limited
from importer.format.manifest import (
    BUNDLE_JSON,
    SUMS_FILE,
    BlobRef,
    ImageRecord,
    LayerRecord,
)
from importer.format.problems import Problem
from importer.input.tarscan import ArchiveScan
from importer.streams.fsutil import open_regular
from importer.verify.bundle import VerifyReport, _walk_files
from importer.verify.legacyarchive import (
    MANIFEST_JSON,
    Pinned,
    archive_pass,
    archive_reader,
    compare_archive_manifest,
)


def _hash_pinned(f: BinaryIO, size: int) -> Digest:
    f.seek(0)
    reader = Pinned(f, size)
    h = hashlib.sha256()
    while True:
        data = reader.read(CHUNK)
        if not data:
            return Digest("sha256", h.hexdigest())
        h.update(data)


def _read_sums(root: str, add: Any) -> Optional[Dict[str, Digest]]:
    """SHA256SUMS parsed strictly, or None when it cannot be read (the problem is added). Over
    MAX_LEGACY_SUMS bytes raises LimitExceeded: it is refused, never truncated."""
    try:
        with open_regular(os.path.join(root, SUMS_FILE), f"reading {SUMS_FILE}", root=root) as f:
            raw = read_limited(f, MAX_LEGACY_SUMS, SUMS_FILE)
    except MissingBlob:
        add(Problem("missing-file", SUMS_FILE, "expected the checksum list, found no file"))
        return None
    except NotRegularFile as e:
        add(Problem("not-a-regular-file", SUMS_FILE, e.message))
        return None
    except OSError as e:
        add(Problem("unreadable-file", SUMS_FILE, f"expected a readable file, found {e}"))
        return None
    sums, problems = parse_legacy_sums(raw)
    for text in problems:
        add(Problem("sums-invalid", SUMS_FILE, text))
    return sums


def verify_legacy(root: str, manifest: LegacyManifest, raw_bundle_json: bytes) -> VerifyReport:
    """SHA256SUMS lists exactly the files bundle.json lists (and bundle.json) with the same
    digests; every file is a regular file of its pinned size and digest; the archive
    decompresses to the recorded digest and size (schema 2) and its ``manifest.json`` names the
    configs, tags and layers bundle.json names. Raises LimitExceeded for an oversized SHA256SUMS."""
    started = time.monotonic()
    report = VerifyReport(root=root)
    add = report.problems.append
    listed = {f.path for f in manifest.files} | {BUNDLE_JSON}
    on_disk = _walk_files(root)
    irregular = set()
    for path, st in sorted(on_disk.items()):
        if path in listed or path == SUMS_FILE:
            if not stat.S_ISREG(st.st_mode):
                irregular.add(path)
                add(Problem("not-a-regular-file", path, "expected a regular file, found a link or special file"))
        else:
            add(Problem("unlisted-file", path, "present in the bundle folder but not listed in bundle.json"))
    sums = None if SUMS_FILE in irregular else _read_sums(root, add)
    if sums is not None:
        for path in sorted(listed - set(sums)):
            add(Problem("sums-mismatch", path, "expected a line in SHA256SUMS, found none"))
        for path in sorted(set(sums) - listed):
            add(Problem("sums-mismatch", path, "SHA256SUMS lists it, bundle.json does not (edited SHA256SUMS?)"))
        if BUNDLE_JSON in sums and sums[BUNDLE_JSON] != Digest.of_bytes(raw_bundle_json):
            add(Problem("digest-mismatch", BUNDLE_JSON, "SHA256SUMS and the file disagree"))
    for rec in manifest.files:
        if sums is not None and rec.path in sums and sums[rec.path] != rec.digest:
            add(Problem("sums-mismatch", rec.path, f"bundle.json pins {rec.digest}, SHA256SUMS says {sums[rec.path]}"))
        if rec.path in irregular:
            continue
        try:
            f = open_regular(os.path.join(root, rec.path), f"reading {rec.path}", root=root)
        except MissingBlob:
            add(Problem("missing-file", rec.path, f"expected a file of {rec.size} bytes, found none"))
            continue
        except NotRegularFile as e:
            add(Problem("not-a-regular-file", rec.path, e.message))
            continue
        except OSError as e:
            add(Problem("unreadable-file", rec.path, f"expected a readable file, found {e}"))
            continue
        with f:
            found_size = os.fstat(f.fileno()).st_size
            if found_size != rec.size:
                add(Problem("size-mismatch", rec.path, f"expected {rec.size} bytes, found {found_size}"))
                continue
            if rec.path == manifest.archive.path:
                report.archive_images = _verify_archive(f, manifest, add)
            else:
                got = _hash_pinned(f, rec.size)
                if got != rec.digest:
                    add(Problem("digest-mismatch", rec.path, f"expected {rec.digest}, found {got}"))
        report.files_checked += 1
        report.bytes_checked += rec.size
    report.seconds = time.monotonic() - started
    return report


def _verify_archive(f: BinaryIO, manifest: LegacyManifest, add: Any) -> Tuple[ImageRecord, ...]:
    """One pass over the archive: its digests, every member through the safe tar reader, and
    its manifest.json against bundle.json."""
    path = manifest.archive.path
    try:
        with archive_reader(f, manifest) as reader:
            scan = archive_pass(reader, manifest)
    except IntegrityError as e:
        got = _hash_pinned(f, manifest.archive.size)  # name the root cause when the archive's own bytes changed
        if got != manifest.archive.digest:
            add(Problem("digest-mismatch", path, f"expected {manifest.archive.digest}, found {got}"))
        else:
            add(Problem(e.reference, path, e.message))
        return ()
    issues = compare_archive_manifest(scan, manifest)
    for text in issues:
        add(Problem("archive-manifest-mismatch", path, text))
    return () if issues else sized_images(scan, manifest)


def sized_images(scan: ArchiveScan, manifest: LegacyManifest) -> Tuple[ImageRecord, ...]:
    """bundle.json's images with the sizes the archive holds (after compare_archive_manifest
    found them the same): the config's bytes and each layer's uncompressed tar."""
    entries = json.loads((scan.docs.get(MANIFEST_JSON) or b"[]").decode("utf-8"))
    out = []
    for entry, image in zip(entries, manifest.images):
        config = scan.resolve(entry["Config"])
        layers = []
        for member, layer in zip(entry["Layers"], image.layers):
            facts = scan.resolve(member)
            size = facts.plain_size if facts is not None else 0
            layers.append(LayerRecord(layer.media_type, layer.digest, size, layer.diff_id, size))
        ref = BlobRef(image.config.media_type, image.config.digest, config.size if config is not None else 0)
        out.append(ImageRecord(image.refs, ref, ref, tuple(layers), image.platform))
    return tuple(out)


def raise_if_problems(root: str, report: VerifyReport) -> None:
    if not report.ok:
        raise VerificationFailed(
            f"verifying {root}: expected every file to match bundle.json, found {len(report.problems)} problem(s)",
            report.problems,
            context="\n".join(str(p) for p in report.problems[:50]),
            hint="nothing was loaded; re-copy the bundle from the source medium (or re-export it) and retry",
        )
