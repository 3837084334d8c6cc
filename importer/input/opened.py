"""A bundle opened once: what BUNDLE names (a folder, a tar, a parts index) is decided here, and
every step of a run (signature, schema, verification, inspection, loading, pushing, serving,
packing, signing, copying) reads the bundle through the one :class:`Bundle` this returns: a
:class:`FolderBundle` or an :class:`ArchiveBundle` (a tar or parts read in place over their
:class:`~importer.input.archive.ArchiveReader`). No module outside input/ asks which of the two it
holds (tests/test_architecture.py): what differs is behind the protocol's members.

bundle.json (and ``bundle.json.sig``) are read exactly once, when the bundle is opened: the
signature is checked over :attr:`Bundle.raw_bundle_json`, the schema and verification use
those same bytes, and :attr:`Bundle.digest` is carried to the receipt. Those bytes are parsed
once, here, into one typed object (:meth:`Bundle.manifest` for schema 3,
:meth:`Bundle.legacy_manifest` for schema 1/2) that every step of the run reads; no step of
an import parses bundle.json again (tests/test_import_plan.py counts the parses of a real run). A tar or parts are
indexed with the one tar reader for untrusted archives (``importer/input/safetar.py``); the folder's
files are opened without following links (docs/security.md)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, List, Optional, Protocol, Type, TypeVar, Union

from importer.errors import (
    BadSignature,
    BundleError,
    ManifestError,
    MissingBlob,
    NotRegularFile,
    UsageError,
    VerificationFailed,
)
from importer.format.digest import Digest
from importer.format.legacy import LegacyManifest, legacy_manifest_of
from importer.format.limits import MAX_BUNDLE_JSON, MAX_SIGNATURE, parse_json, read_limited
from importer.format.manifest import (
    BUNDLE_JSON,
    IMPORTER_PYZ,
    SIGNATURE_FILE,
    SUMS_FILE,
    BundleManifest,
    bundle_manifest_of,
    parse_schema_version,
)
from importer.input.archive import ArchiveReader, locate
from importer.streams.fsutil import open_regular

_UNPARSED = object()  # a bundle's document() not parsed yet (JSON null is a document too)
T = TypeVar("T")


class Bundle(Protocol):
    """One bundle, opened once: what every step of a run reads it through. Which kind it is (a
    folder, or a tar / parts read in place) is decided by :func:`open_bundle` and known only here in
    input/: the members below answer the same for both (tests/test_architecture.py fails on a module
    outside input/ asking which it is)."""

    #: "folder", "tar" or "parts": for messages and --json documents only, never compared
    kind: str
    #: the folder, the tar or the parts index (absolute)
    path: str
    #: bundle.json's exact bytes (every step uses these), their digest, and bundle.json.sig's bytes
    raw_bundle_json: bytes
    raw_signature: Optional[bytes]
    digest: Digest

    def document(self) -> Any: ...
    def manifest(self) -> BundleManifest: ...
    def legacy_manifest(self, major: int) -> LegacyManifest: ...
    def schema_major(self) -> int: ...

    def describe(self) -> str:
        """The bundle's name for a message (the folder's or archive's base name)."""

    def open(self, rel: str) -> BinaryIO:
        """Open the bundle file ``rel`` (relative POSIX path, e.g. a blob's ``digest.blob_path``);
        the caller closes it. A missing one raises MissingBlob, a link or special file NotRegularFile
        (folder), a typed archive error (tar / parts)."""

    def read(self, rel: str, limit: int, what: str) -> bytes:
        """A whole (small) bundle file, refusing more than ``limit`` bytes."""

    def open_blob(self, digest: Digest) -> BinaryIO:
        """Open the blob ``digest``; the caller closes it."""

    def read_blob(self, digest: Digest, limit: int, what: str) -> bytes:
        """A whole (small) blob, refusing more than ``limit`` bytes."""

    def exists(self, rel: str) -> bool:
        """Whether the bundle holds a regular file ``rel``."""

    def size(self, rel: str) -> int:
        """The size of the bundle file ``rel`` (raises as :meth:`open` does for a missing one)."""

    def files(self) -> List[str]:
        """Every regular file the bundle holds (relative POSIX paths, sorted)."""

    def backing_files(self, rel: str) -> List[str]:
        """The files on disk whose bytes hold ``rel``: the folder's file, or the tar / every part
        (what serve stats to see whether a blob it checked may have changed)."""

    @property
    def checked_whole(self) -> bool:
        """Whether verification reads this bundle whole in one sequential pass (a tar, parts),
        rather than file by file, so that no file's check can be left to a later reader."""

    @property
    def stored_size(self) -> int:
        """Bytes on the medium that a whole read covers: the tar or the parts; a folder's files."""

    def refuse_odd_files(self, paths: List[str], doing: str) -> None:
        """Raise NotRegularFile for the first of ``paths`` the bundle holds as a link, FIFO or device
        (lstat only: nothing opened or followed); absent ones pass (verification's business). A tar
        or parts: its safe reader already refused such members' reads."""

    def require_folder(self, refusal: str, hint: str) -> str:
        """The bundle folder, for a command that works on a folder only (sign, a schema 1/2 bundle,
        an engine that loads from folders); a tar or parts is refused with UsageError(``refusal``,
        ``hint``) before anything is done."""

    def importers_beside(self) -> List[str]:
        """The importer files beside a tar or parts that a user may run (absolute paths; none for a
        folder, whose ``bundle-import.pyz`` is a bundle file checked like every other)."""

    def extract_command(self, member: str) -> str:
        """The shell command that takes ``member`` out of a tar or parts (for a hint); a folder's
        member needs none: its path."""

    def medium_files(self) -> List[MediumFile]:
        """The files that make up the bundle on its medium, in copy order, the one that names the
        bundle last (a folder: every file bundle.json lists, the signature, SHA256SUMS, then
        bundle.json; a tar: the tar; parts: the parts, then the index)."""

    def medium_name(self) -> str:
        """What names the bundle in the folder it is carried in: "" for a bundle folder (the folder
        itself), the tar's or the parts index's file name."""

    def either(self, folder: Callable[[str], T], archive: Callable[[ArchiveReader], T]) -> T:
        """``folder(path)`` or ``archive(reader)``: for work that is done differently on the two
        (verification: a folder file by file in parallel, a tar or parts in one sequential read).
        The one place a caller hands both ways and input/ picks."""


#: The name most modules know an opened bundle by.
OpenedBundle = Bundle

#: What the bundle's readers take: an opened bundle, or a bundle folder's path (the exporter's
#: own staging folder, a sink that loads from folders).
BundleRoot = Union[str, Bundle]


@dataclass(frozen=True)
class MediumFile:
    """One file of a bundle on its medium: its absolute ``path``, its name ``rel`` below ``root``,
    its size and (when bundle.json or the parts index pins it) digest; ``size`` None: not known
    before it is read (a tar)."""

    path: str
    rel: str
    size: Optional[int]
    digest: Optional[Digest]
    root: str


class _Opened:
    """What both kinds share: bundle.json's bytes, parsed once."""

    kind: str
    path: str

    def __init__(self, kind: str, path: str, raw_bundle_json: bytes, raw_signature: Optional[bytes]) -> None:
        self.kind = kind
        self.path = path
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

    def schema_major(self) -> int:
        major, _ = parse_schema_version(self.document())
        return major

    def __str__(self) -> str:
        return self.path

    def describe(self) -> str:
        return os.path.basename(self.path)

    def open(self, rel: str) -> BinaryIO:
        raise NotImplementedError

    def read(self, rel: str, limit: int, what: str) -> bytes:
        with self.open(rel) as f:
            return read_limited(f, limit, what)

    def open_blob(self, digest: Digest) -> BinaryIO:
        return self.open(digest.blob_path)

    def read_blob(self, digest: Digest, limit: int, what: str) -> bytes:
        return self.read(digest.blob_path, limit, what)


class FolderBundle(_Opened):
    """A bundle folder: each file opened without following a link (docs/security.md)."""

    def __init__(self, path: str, raw_bundle_json: bytes, raw_signature: Optional[bytes]) -> None:
        super().__init__("folder", path, raw_bundle_json, raw_signature)

    def open(self, rel: str) -> BinaryIO:
        return open_regular(os.path.join(self.path, rel), f"reading {rel}", root=self.path)

    def exists(self, rel: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(os.path.join(self.path, rel)).st_mode)
        except OSError:
            return False

    def size(self, rel: str) -> int:
        with self.open(rel) as f:
            return os.fstat(f.fileno()).st_size

    def files(self) -> List[str]:
        found: List[str] = []
        for here, dirnames, names in os.walk(self.path):  # links are listed, never followed
            prefix = os.path.relpath(here, self.path).replace(os.sep, "/")
            prefix = "" if prefix == "." else prefix + "/"
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(here, d))]
            found += [prefix + n for n in names if stat.S_ISREG(os.lstat(os.path.join(here, n)).st_mode)]
        return sorted(found)

    def backing_files(self, rel: str) -> List[str]:
        return [os.path.join(self.path, rel)]

    @property
    def checked_whole(self) -> bool:
        return False

    @property
    def stored_size(self) -> int:
        try:
            return sum(f.size for f in self.manifest().files)
        except BundleError:
            return 0

    def refuse_odd_files(self, paths: List[str], doing: str) -> None:
        for rel in paths:
            try:
                st = os.lstat(os.path.join(self.path, rel))
            except OSError:
                continue  # absent or unreadable: verification's business
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{doing}: expected {rel} to be a regular file, found a link or special file",
                                     hint="a bundle never holds links: re-copy it from the source medium")

    def require_folder(self, refusal: str, hint: str) -> str:
        return self.path

    def importers_beside(self) -> List[str]:
        return []

    def extract_command(self, member: str) -> str:
        return os.path.join(self.path, member)

    def medium_files(self) -> List[MediumFile]:
        root = self.path
        files = sorted(self.manifest().files, key=lambda f: (not f.path.startswith("blobs/"), -f.size, f.path))
        out = [MediumFile(os.path.join(root, *f.path.split("/")), f.path, f.size, f.digest, root) for f in files]
        for extra in (SIGNATURE_FILE, SUMS_FILE):
            if os.path.lexists(os.path.join(root, extra)):
                out.append(MediumFile(os.path.join(root, extra), extra, None, None, root))
        out.append(MediumFile(os.path.join(root, BUNDLE_JSON), BUNDLE_JSON, len(self.raw_bundle_json), self.digest,
                              root))
        return out

    def medium_name(self) -> str:
        return ""

    def either(self, folder: Callable[[str], T], archive: Callable[[ArchiveReader], T]) -> T:
        return folder(self.path)


class ArchiveBundle(_Opened):
    """A bundle tar or a set of parts, read in place through its one :class:`ArchiveReader`."""

    def __init__(self, archive: ArchiveReader, raw_bundle_json: bytes, raw_signature: Optional[bytes]) -> None:
        super().__init__(archive.kind, archive.path, raw_bundle_json, raw_signature)
        self.reader = archive

    def open(self, rel: str) -> BinaryIO:
        return self.reader.open(rel)  # type: ignore[return-value]

    def exists(self, rel: str) -> bool:
        entry = self.reader.members().get(rel)
        return entry is not None and entry.regular

    def size(self, rel: str) -> int:
        entry = self.reader.members().get(rel)
        if entry is None or not entry.regular:
            with self.open(rel):  # raises the archive's typed error for it
                pass
            raise MissingBlob(f"reading {rel}: expected a regular member of {self.describe()}, found none")
        return entry.size

    def files(self) -> List[str]:
        return sorted(name for name, m in self.reader.members().items() if m.regular)

    def backing_files(self, rel: str) -> List[str]:
        return [p for p, _ in self.reader.files]

    @property
    def checked_whole(self) -> bool:
        return True

    @property
    def stored_size(self) -> int:
        return self.reader.size

    def refuse_odd_files(self, paths: List[str], doing: str) -> None:
        return None

    def require_folder(self, refusal: str, hint: str) -> str:
        raise UsageError(refusal, hint=hint)

    def importers_beside(self) -> List[str]:
        directory = os.path.dirname(os.path.abspath(self.path))
        names = [IMPORTER_PYZ]
        index = self.reader.index
        if index is not None and index.importer is not None and index.importer.path not in names:
            names.append(index.importer.path)  # a plain file name: the parts index parser refuses others
        return [os.path.join(directory, n) for n in names]

    def extract_command(self, member: str) -> str:
        index = self.reader.index
        if index is not None:
            return f"cat {index.archive_name}.part[0-9]* | tar --occurrence=1 -xf - {member}"
        return f"tar --occurrence=1 -xf {self.describe()} {member}"

    def medium_files(self) -> List[MediumFile]:
        directory = self.reader.directory
        index = self.reader.index
        if index is None:
            return [MediumFile(self.path, self.describe(), None, None, directory)]
        raw = self.reader.raw_index
        assert raw is not None, "a parts index is read when it is opened"
        out = [MediumFile(os.path.join(directory, p.name), p.name, p.size, p.digest, directory) for p in index.parts]
        return [*out, MediumFile(self.path, self.describe(), len(raw), Digest.of_bytes(raw), directory)]

    def medium_name(self) -> str:
        return self.describe()

    def either(self, folder: Callable[[str], T], archive: Callable[[ArchiveReader], T]) -> T:
        return archive(self.reader)


def open_bundle(path: str, *, carrying: Optional[str] = None) -> Bundle:
    """Open what BUNDLE names. Raises ManifestError (no bundle.json), a typed archive error (a
    tar the safe reader refuses), or VerificationFailed (parts missing or damaged).

    ``carrying`` (what is being done, e.g. "copying"): the bundle is opened to be carried as files
    (``bundle copy``, ``bundle pack``): a folder's bundle.json.sig is not read (it is carried as one
    more file, refused there as not-a-regular-file if it is a link), and the tar or parts index and
    every part there are checked to be regular files reached without a link, and the parts to be
    those the index lists, before a byte of them is read (a FIFO never blocks the read)."""
    loc = locate(path)
    if loc.kind == "folder":
        root = os.path.abspath(loc.path)
        raw = _read_folder_file(root, BUNDLE_JSON, MAX_BUNDLE_JSON, ManifestError)
        assert raw is not None
        sig = _read_folder_file(root, SIGNATURE_FILE, MAX_SIGNATURE, BadSignature) if carrying is None else None
        return FolderBundle(root, raw, sig)
    if carrying is not None:
        _probe(loc.path, f"{carrying} {os.path.basename(loc.path)}")
    reader = ArchiveReader(loc.path)
    if carrying is not None:
        _check_parts(reader, carrying)
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
    return ArchiveBundle(reader, raw, raw_sig)


def _probe(path: str, doing: str) -> None:
    """``path`` is a regular file reached without a link below its folder (NotRegularFile)."""
    with open_regular(path, doing, root=os.path.dirname(os.path.abspath(path))):
        pass


def _check_parts(reader: ArchiveReader, doing: str) -> None:
    """Every part the index lists there, of its size (a link or special file refused first)."""
    index = reader.index
    if index is None:
        return
    for rec in index.parts:  # a link or special file is refused before part_issues() looks at it
        full = os.path.join(reader.directory, rec.name)
        if os.path.lexists(full):
            _probe(full, f"{doing} {rec.name}")
    bad = reader.part_issues()
    if bad:
        raise VerificationFailed(
            f"{doing} {reader.path}: expected every part the index lists, found {len(bad)} problem(s)",
            bad, context="\n".join(f"[{i.id}] {i.path}: {i.message}" for i in bad),
            hint="copy the missing or short parts from the source medium first",
        )


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


def bundle_folder(root: BundleRoot, doing: str) -> str:
    """The folder a sink without ``reads_archives`` loads from: a bundle folder's path as given, or
    the opened bundle's folder; a tar or parts is refused (UsageError; the pipeline refuses it before
    anything changes: importer/pipeline/importing.py ``load_root``)."""
    if isinstance(root, str):
        return root
    return root.require_folder(
        f"{doing}: expected a bundle folder, found a tar/parts",
        hint="unpack it first (mkdir B && tar -xf FILE.tar -C B; for parts: cat FILE.tar.part[0-9]* | tar -x -C B) "
             "and import B")


def open_bundle_file(root: BundleRoot, rel: str) -> BinaryIO:
    """Open the bundle file ``rel`` (a relative POSIX path) of an opened bundle or a bundle folder's
    path; the caller closes it."""
    if isinstance(root, str):
        return open_regular(os.path.join(root, rel), f"reading {rel}", root=root)
    return root.open(rel)


def read_bundle_file(root: BundleRoot, rel: str, limit: int, what: str) -> bytes:
    """Read a whole (small) bundle file, refusing more than ``limit`` bytes."""
    with open_bundle_file(root, rel) as f:
        return read_limited(f, limit, what)
