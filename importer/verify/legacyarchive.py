"""Inside a schema 1/2 bundle's docker-archive: one pass through the safe tar reader that hashes
the archive (compressed and plain), records every member, checks each layer's diff_id, and can
pass the archive on to an engine with manifest.json rewritten to the staging tags
(importer/pipeline/legacy.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import tarfile
from typing import Any, BinaryIO, Callable, Iterator, List, Optional, Sequence

from importer.errors import (
    ArchiveManifestMismatch,
    DiffIDMismatch,
    DigestMismatch,
    LimitExceeded,
    SizeMismatch,
)
from importer.format.digest import CHUNK, Digest
from importer.format.legacy import LegacyManifest
from importer.format.limits import MAX_DOCKER_SAVE_JSON, parse_json, read_limited
from importer.input.safetar import ARCHIVE_POLICY, BLOCK, FILE, HARDLINK, SYMLINK, SafeTarReader
from importer.input.tarscan import ArchiveScan, hash_member
from importer.streams import testhooks
from importer.streams.compression import open_decompressed
from importer.streams.fsutil import open_regular


class Pinned:
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
def archive_reader(f: BinaryIO, manifest: LegacyManifest) -> Iterator[_ArchiveReader]:
    """An ``_ArchiveReader`` over the open archive ``f``: at most its pinned size is read, and
    at most the pinned uncompressed size comes out."""
    from importer.streams.readers import HashingReader

    f.seek(0)
    raw = HashingReader(Pinned(f, manifest.archive.size))
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
        with archive_reader(f, manifest) as reader:
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
