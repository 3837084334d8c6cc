"""A bundle opened once: what BUNDLE names (a folder, a tar, a parts index) is decided here, and
every step of a run (signature, schema, verification, inspection, loading, pushing, copying)
reads the bundle through the one :class:`OpenedBundle` this returns.

bundle.json (and ``bundle.json.sig``) are read exactly once, when the bundle is opened: the
signature is checked over :attr:`OpenedBundle.raw_bundle_json`, the schema and verification use
those same bytes, and :attr:`OpenedBundle.digest` is carried to the receipt. Those bytes are parsed
once, here, into one typed object (:meth:`OpenedBundle.manifest` for schema 3,
:meth:`OpenedBundle.legacy_manifest` for schema 1/2) that every step of the run reads; no step of
an import parses bundle.json again (tests/test_import_plan.py counts the parses of a real run). A tar or parts are
indexed with the one tar reader for untrusted archives (``importer/input/safetar.py``); the folder's
files are opened without following links (docs/security.md)."""

from __future__ import annotations

import os
from typing import Any, BinaryIO, Optional, Type, Union

from importer.errors import BadSignature, BundleError, ManifestError, MissingBlob, NotRegularFile
from importer.format.digest import Digest
from importer.format.legacy import LegacyManifest, legacy_manifest_of
from importer.format.limits import MAX_BUNDLE_JSON, MAX_SIGNATURE, parse_json, read_limited
from importer.format.manifest import (
    BUNDLE_JSON,
    SIGNATURE_FILE,
    BundleManifest,
    bundle_manifest_of,
    parse_schema_version,
)
from importer.input.archive import ArchiveReader, locate
from importer.streams.fsutil import open_regular

_UNPARSED = object()  # OpenedBundle.document() not parsed yet (JSON null is a document too)

#: What the readers of blobs take: a folder path, or the opened tar / parts.
BundleRoot = Union[str, ArchiveReader]


class OpenedBundle:
    """One bundle, opened once. ``kind`` is "folder", "tar" or "parts"; ``path`` the folder, the
    tar or the parts index (absolute); ``archive`` the reader of a tar or parts (None for a
    folder); ``raw_bundle_json`` / ``raw_signature`` the exact bytes every step uses."""

    def __init__(self, kind: str, path: str, archive: Optional[ArchiveReader], raw_bundle_json: bytes,
                 raw_signature: Optional[bytes]) -> None:
        self.kind = kind
        self.path = path
        self.archive = archive
        self.raw_bundle_json = raw_bundle_json
        self.raw_signature = raw_signature
        self.digest = Digest.of_bytes(raw_bundle_json)
        self._document: Any = _UNPARSED  # raw_bundle_json's JSON, parsed on first use and only then
        self.parsed: Optional[BundleManifest] = None  # bundle.json (schema 3) as one typed object, once built
        self.parsed_legacy: Optional[LegacyManifest] = None  # the same for a schema 1/2 bundle

    def document(self) -> Any:
        """bundle.json's JSON, parsed once from :attr:`raw_bundle_json` (the bytes the signature step
        judged). Raises ManifestError for bytes that are not JSON; the typed views below read this."""
        if self._document is _UNPARSED:
            self._document = parse_json(self.raw_bundle_json, BUNDLE_JSON)
        return self._document

    def manifest(self) -> BundleManifest:
        """bundle.json (schema 3) as one typed object, built once; every step of the run shares it.
        Raises ManifestError and subclasses for a bundle.json that cannot be used."""
        if self.parsed is None:
            self.parsed = bundle_manifest_of(self.document())
        return self.parsed

    def legacy_manifest(self, major: int) -> LegacyManifest:
        """bundle.json of a schema 1/2 bundle (``major``, from :meth:`schema_major`) as one typed
        object, built once. Raises ManifestError for one that breaks its schema's rules."""
        if self.parsed_legacy is None:
            self.parsed_legacy = legacy_manifest_of(self.document(), major)
        return self.parsed_legacy

    def __str__(self) -> str:
        return self.path

    @property
    def is_archive(self) -> bool:
        return self.archive is not None

    @property
    def root(self) -> BundleRoot:
        """What blob readers take (``open_bundle_file``): the folder, or this bundle's one archive reader."""
        return self.archive if self.archive is not None else self.path

    def schema_major(self) -> int:
        major, _ = parse_schema_version(self.document())
        return major

    def open(self, rel: str) -> BinaryIO:
        """Open the bundle file ``rel`` (relative POSIX path); the caller closes it."""
        return open_bundle_file(self.root, rel)

    def read(self, rel: str, limit: int, what: str) -> bytes:
        return read_bundle_file(self.root, rel, limit, what)


def open_bundle(path: str) -> OpenedBundle:
    """Open what BUNDLE names. Raises ManifestError (no bundle.json), a typed archive error (a
    tar the safe reader refuses), or VerificationFailed (parts missing or damaged)."""
    loc = locate(path)
    if loc.kind == "folder":
        root = os.path.abspath(loc.path)
        raw = _read_folder_file(root, BUNDLE_JSON, MAX_BUNDLE_JSON, ManifestError)
        assert raw is not None
        sig = _read_folder_file(root, SIGNATURE_FILE, MAX_SIGNATURE, BadSignature)
        return OpenedBundle("folder", root, None, raw, sig)
    reader = ArchiveReader(loc.path)
    members = reader.members()
    label = os.path.basename(reader.path)
    first = next(iter(members), None)
    entry = members.get(BUNDLE_JSON)
    if entry is None or not entry.regular or first != BUNDLE_JSON:
        raise ManifestError(
            f"opening {label}: expected {BUNDLE_JSON} as the first member, "
            f"found {'it later in the archive' if entry is not None else 'no such member'}",
            hint="write the archive with `bundle pack DIR FILE.tar` (bundle.json must come first), "
            "or unpack it and import the folder",
        )
    raw = reader_read(reader, BUNDLE_JSON, MAX_BUNDLE_JSON)
    sig_entry = members.get(SIGNATURE_FILE)
    raw_sig: Optional[bytes] = None
    if sig_entry is not None:
        if not sig_entry.regular:
            raise BadSignature(f"opening {label}: expected {SIGNATURE_FILE} as a regular member, found "
                                "a folder", hint="get a fresh copy of the bundle from the publisher")
        raw_sig = reader_read(reader, SIGNATURE_FILE, MAX_SIGNATURE)
    return OpenedBundle(loc.kind, reader.path, reader, raw, raw_sig)


def reader_read(reader: ArchiveReader, rel: str, limit: int) -> bytes:
    with reader.open(rel) as f:
        return read_limited(f, limit, rel)


def _read_folder_file(root: str, rel: str, limit: int, refused: Type[BundleError]) -> Optional[bytes]:
    """A small file directly in the bundle folder: a regular file (no link followed), bounded.
    bundle.json (``refused`` is ManifestError) must exist; the signature (BadSignature) may not."""
    try:
        f = open_regular(os.path.join(root, rel), f"reading {rel}", root=root)
    except MissingBlob:
        if refused is not ManifestError:
            return None
        raise ManifestError(
            f"opening {root}: expected {rel} in the folder, found none",
            hint="pass the folder `bundle export -o` wrote (the one holding bundle.json), or its .tar / "
            ".tar.parts.json",
        ) from None
    except NotRegularFile as e:
        if refused is ManifestError:
            raise
        raise refused(e.message, hint="copy the bundle again without links or special files") from None
    with f:
        return read_limited(f, limit, rel)


def open_bundle_file(root: BundleRoot, rel: str) -> BinaryIO:
    """Open the bundle file ``rel`` (a relative POSIX path) for reading; the caller closes it."""
    if isinstance(root, str):
        return open_regular(os.path.join(root, rel), f"reading {rel}", root=root)
    return root.open(rel)  # type: ignore[return-value]


def read_bundle_file(root: BundleRoot, rel: str, limit: int, what: str) -> bytes:
    """Read a whole (small) bundle file, refusing more than ``limit`` bytes."""
    with open_bundle_file(root, rel) as f:
        return read_limited(f, limit, what)
