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

import contextlib
import hashlib
import json
import os
import posixpath
import re
import stat
import tarfile
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from importer.errors import (
    ArchiveManifestMismatch,
    DiffIDMismatch,
    DigestMismatch,
    IntegrityError,
    LimitExceeded,
    ManifestError,
    MissingBlob,
    NotRegularFile,
    SizeMismatch,
    VerificationFailed,
)
from importer.format.digest import CHUNK, Digest
from importer.format.limits import MAX_DOCKER_SAVE_JSON, MAX_LEGACY_SUMS, parse_json, read_limited
from importer.format.manifest import (
    BUNDLE_JSON,
    SUMS_FILE,
    BlobRef,
    FileRecord,
    ImageRecord,
    LayerRecord,
    _Checker,
    valid_ref,
)
from importer.format.mediatypes import DOCKER_CONFIG, OCI_LAYER_TAR
from importer.format.problems import Problem
from importer.input.safetar import ARCHIVE_POLICY, BLOCK, FILE, HARDLINK, SYMLINK, SafeTarReader
from importer.input.tarscan import ArchiveScan, hash_member
from importer.streams import testhooks
from importer.streams.compression import open_decompressed
from importer.streams.fsutil import open_regular
from importer.verify.bundle import VerifyReport, _walk_files

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


class _Pinned:
    """At most ``size`` bytes of ``f`` (the size bundle.json pins): a file that grew after it was
    measured is read no further."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f = f
        self.left = size

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.f.read(min(CHUNK if n is None or n < 0 else n, self.left))
        self.left -= len(data)
        return data


def _hash_pinned(f: BinaryIO, size: int) -> Digest:
    f.seek(0)
    reader = _Pinned(f, size)
    h = hashlib.sha256()
    while True:
        data = reader.read(CHUNK)
        if not data:
            return Digest("sha256", h.hexdigest())
        h.update(data)


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
        with _archive_reader(f, manifest) as reader:
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
        from importer.input.layers import _DECOMPRESS_ERRORS

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


@contextlib.contextmanager
def _archive_reader(f: BinaryIO, manifest: LegacyManifest) -> Iterator[_ArchiveReader]:
    """An ``_ArchiveReader`` over the open archive ``f``: at most its pinned size is read, and
    at most the pinned uncompressed size comes out."""
    from importer.streams.readers import HashingReader

    f.seek(0)
    raw = HashingReader(_Pinned(f, manifest.archive.size))
    compression = "zstd" if manifest.major == 2 else "none"
    with open_decompressed(raw, compression, bound=manifest.uncompressed_size,
                           what=manifest.archive.path) as plain:
        yield _ArchiveReader(raw, plain, manifest)


@contextlib.contextmanager
def open_archive(root: str, manifest: LegacyManifest) -> Iterator[_ArchiveReader]:
    """An ``_ArchiveReader`` over the bundle's archive: a regular file (never a link) of exactly
    the size bundle.json pins."""
    path = manifest.archive.path
    with open_regular(os.path.join(root, path), f"opening {path}", root=root) as f:
        found = os.fstat(f.fileno()).st_size
        if found != manifest.archive.size:
            raise SizeMismatch(f"opening {path}: expected {manifest.archive.size} bytes, found {found}",
                               hint="re-copy the bundle")
        with _archive_reader(f, manifest) as reader:
            yield reader


# ============================================================================ inside the archive

MANIFEST_JSON = "manifest.json"
#: Members never passed to an engine: the names they carry (an OCI ``index.json``'s ref-name
#: annotations, which an engine reads instead of manifest.json when ``oci-layout`` is present;
#: the pre-1.10 ``repositories`` file) would bypass the staging tags. manifest.json is rewritten.
DROPPED = frozenset({"index.json", "oci-layout", "repositories"})
_MAX_HELD = 8 * 1024 * 1024  # header bytes (pax, long names) of one member, held until it is known


class _Recorder:
    """The bytes a SafeTarReader consumes: held until taken (a member's headers, until its name
    is known), or passed straight on (its data)."""

    def __init__(self, raw: Any, what: str) -> None:
        self.raw = raw
        self.what = what
        self.held = bytearray()
        self.through: Optional[Callable[[bytes], Any]] = None

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.raw.read(n)
        if self.through is not None:
            self.through(data)
        else:
            self.held += data
            if len(self.held) > _MAX_HELD:
                raise LimitExceeded(f"reading {self.what}: expected at most {_MAX_HELD} bytes of tar headers "
                                    "before a member's data, found more",
                                    hint="do not use this archive: it was damaged or crafted")
        return data

    def take(self) -> bytes:
        data = bytes(self.held)
        self.held.clear()
        return data


def _discard(_: bytes) -> None:
    return None


def _decompress_bound(manifest: LegacyManifest) -> int:
    """How far a compressed member is decompressed to find its diff_id: gzip cannot expand more
    than 1032 times, and no member is larger than the archive."""
    return 1032 * manifest.uncompressed_size + (64 << 20)


def archive_pass(reader: _ArchiveReader, manifest: LegacyManifest, *, out: Optional[BinaryIO] = None,
                 staged: Optional[Sequence[Optional[List[str]]]] = None) -> ArchiveScan:
    """Read the archive once, member by member, through the safe tar reader (never tarfile).

    Without ``out`` (verifying): hash every regular member (decompressed too when it is gzip or
    zstd: a layer's diff_id) and keep ``manifest.json``; returns what was found, for
    :func:`compare_archive_manifest`.

    With ``out`` (loading): copy every member's bytes unchanged to ``out`` except
    ``manifest.json`` and :data:`DROPPED`; after the archive's digests were checked (the end of
    the input), write ``manifest.json`` with each entry's ``RepoTags`` replaced by ``staged[i]``
    (None: untagged), then the end of the tar. An archive that differs from bundle.json raises
    before the engine has seen a manifest.json, so it can name no image."""
    what = manifest.archive.path
    rec = _Recorder(reader, what)
    tar = SafeTarReader(rec, ARCHIVE_POLICY, what=what)
    scan = ArchiveScan(what)
    emit: Callable[[bytes], Any] = out.write if out is not None else _discard
    bound = _decompress_bound(manifest)
    keep = True
    sent = False
    while True:
        tar.skip_rest()  # the previous member's padding (its data was read)
        tail = rec.take()
        if keep:
            emit(tail)
        try:
            member = next(tar)
        except StopIteration:
            rec.take()  # the end-of-archive block: written again after the digests are checked
            break
        keep = member.name not in DROPPED and member.name != MANIFEST_JSON
        head = rec.take()
        if keep:
            emit(head)
        if member.type == SYMLINK:
            scan.links[member.name] = posixpath.normpath(posixpath.join(posixpath.dirname(member.name),
                                                                        member.linkname))
        elif member.type == HARDLINK:
            scan.links[member.name] = member.linkname
        if member.type != FILE:
            continue
        if member.name == MANIFEST_JSON:
            if member.size > MAX_DOCKER_SAVE_JSON:
                raise LimitExceeded(f"reading {MANIFEST_JSON} in {what}: expected at most {MAX_DOCKER_SAVE_JSON} "
                                    f"bytes, found {member.size}", hint="do not import this bundle")
            rec.through = _discard
            scan.docs[MANIFEST_JSON] = read_limited(tar, MAX_DOCKER_SAVE_JSON,
                                                    f"{MANIFEST_JSON} in {what}")
            rec.through = None
            continue
        rec.through = emit if keep else _discard
        if out is None:
            facts, _ = hash_member(tar, member.name, bound=bound, keep_json=False)
            scan.members[member.name] = facts
        else:
            while tar.read(CHUNK):
                if not sent:
                    sent = True
                    testhooks.reached("load")
        rec.through = None
    reader.finish()  # raises on a digest or size mismatch: the engine has seen no manifest.json yet
    if out is not None:
        out.write(_restaged(scan.docs.get(MANIFEST_JSON), manifest, staged or []))
        out.write(b"\0" * (2 * BLOCK))
    return scan


def _restaged(raw: Optional[bytes], manifest: LegacyManifest, staged: Sequence[Optional[List[str]]]) -> bytes:
    """The tar member manifest.json (header, data, padding) with the staging tags as RepoTags."""
    where = f"{MANIFEST_JSON} in {manifest.archive.path}"
    if raw is None:
        raise ArchiveManifestMismatch(f"loading {manifest.archive.path}: expected {MANIFEST_JSON} in the archive, "
                                      "found none", hint="nothing was loaded; re-export the bundle")
    doc = parse_json(raw, where)
    tags = [list(image.refs) for image in manifest.images]
    if not isinstance(doc, list) or len(doc) != len(staged) or any(
            not isinstance(e, dict) or list(e.get("RepoTags") or []) != t for e, t in zip(doc, tags)):
        raise ArchiveManifestMismatch(f"loading {manifest.archive.path}: expected {where} to list the images and "
                                      "tags of bundle.json, found others", hint="nothing was loaded; re-export")
    for entry, names in zip(doc, staged):
        entry["RepoTags"] = list(names) if names else None
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    info = tarfile.TarInfo(MANIFEST_JSON)
    info.size = len(data)
    info.mode = 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % BLOCK)


def compare_archive_manifest(scan: ArchiveScan, manifest: LegacyManifest) -> List[str]:
    """What differs between the archive's manifest.json (each entry's Config, RepoTags and
    Layers, resolved to the members' digests) and bundle.json's images; empty when nothing."""
    raw = scan.docs.get(MANIFEST_JSON)
    if raw is None:
        how = " (a link, not a file)" if MANIFEST_JSON in scan.links else ""
        return [f"expected {MANIFEST_JSON} in the archive, found none{how}"]
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return [f"{MANIFEST_JSON}: expected JSON, found invalid data ({e})"[:300]]
    if not isinstance(doc, list) or len(doc) != len(manifest.images):
        found = f"{len(doc)} entries" if isinstance(doc, list) else "no list"
        return [f"{MANIFEST_JSON}: expected {len(manifest.images)} image(s) as in bundle.json, found {found}"]
    issues: List[str] = []
    for i, (entry, image) in enumerate(zip(doc, manifest.images)):
        where = f"{MANIFEST_JSON} entry {i + 1} ({image.name})"
        if not isinstance(entry, dict):
            issues.append(f"{where}: expected an object, found {type(entry).__name__}")
            continue
        tags = entry.get("RepoTags") or []
        if not isinstance(tags, list) or tags != list(image.refs):
            issues.append(f"{where}: expected RepoTags {list(image.refs)} as in bundle.json, found {tags!r}"[:300])
        config = entry.get("Config")
        facts = scan.resolve(config) if isinstance(config, str) else None
        if facts is None:
            issues.append(f"{where}: expected its Config in the archive, found {config!r}"[:300])
        elif facts.digest != image.config.digest:
            issues.append(f"{where}: expected the config {image.config.digest}, found {config} hashing to "
                          f"{facts.digest}")
        layers = entry.get("Layers")
        if not isinstance(layers, list) or len(layers) != len(image.layers):
            found = f"{len(layers)}" if isinstance(layers, list) else "no list"
            issues.append(f"{where}: expected {len(image.layers)} layer(s) as in bundle.json, found {found}")
            continue
        for k, (path, layer) in enumerate(zip(layers, image.layers), 1):
            facts = scan.resolve(path) if isinstance(path, str) else None
            if facts is None:
                issues.append(f"{where} layer {k}: expected {path!r} in the archive, found none"[:300])
            elif facts.plain_digest != layer.diff_id:
                found = str(facts.plain_digest) if facts.plain_digest is not None else facts.note
                issues.append(f"{where} layer {k}: expected diff_id {layer.diff_id}, found {found}")
    return issues


def raise_if_problems(root: str, report: VerifyReport) -> None:
    if not report.ok:
        raise VerificationFailed(
            f"verifying {root}: expected every file to match bundle.json, found {len(report.problems)} problem(s)",
            report.problems,
            context="\n".join(str(p) for p in report.problems[:50]),
            hint="nothing was loaded; re-copy the bundle from the source medium (or re-export it) and retry",
        )


