"""A bundle kept as one uncompressed tar, or as parts of one, read in place (never unpacked).

``FILE.tar`` holds bundle.json first, then SHA256SUMS and bundle-import.pyz, then the rest of the
bundle folder. ``--split`` cuts that same byte stream into ``FILE.tar.part000``, ``.part001``...
and writes ``FILE.tar.parts.json`` (schemas/parts/parts-v1.schema.json) pinning each part's size
and sha256 and the whole stream's sha256.

:class:`ArchiveReader` reads either form in place, never joining the parts: a
:class:`ConcatFile` lays the parts end to end, tar headers are read from it in order and
:meth:`ArchiveReader.open` reads one member by its offset. :meth:`ArchiveReader.part_issues`
(missing, truncated, extra parts: from the listing) and :meth:`ArchiveReader.hash_issues`
(damaged or reordered parts: each part hashed against the index) name the part at fault."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from importer.errors import (
    BundleError,
    BundleNotFound,
    InvalidPartsIndex,
    ManifestError,
    SizeMismatch,
    VerificationFailed,
)
from importer.format.digest import Digest, hash_file, is_digest
from importer.format.limits import parse_json, read_file_limited
from importer.format.manifest import FileRecord, safe_relpath
from importer.format.problems import Problem
from importer.input.safetar import BUNDLE_POLICY, ArchiveMalformed, SafeTarReader

PARTS_MEDIA_TYPE = "application/vnd.sneakernet.parts.v1+json"
PARTS_SCHEMA_MAJOR = 1
PARTS_SUFFIX = ".parts.json"
MAX_PARTS_INDEX = 16 * 1024 * 1024
_PART_RE = re.compile(r"^(.+)\.part([0-9]{3,})$")
_VERSION_RE = re.compile(r"(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})")


def part_name(archive_name: str, number: int) -> str:
    """``FILE.tar.part000``: at least three digits, more when there are over 1000 parts."""
    return f"{archive_name}.part{number:03d}"


def index_name(archive_name: str) -> str:
    return archive_name + PARTS_SUFFIX


@dataclass(frozen=True)
class PartRecord:
    name: str
    size: int
    digest: Digest

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "size": self.size, "digest": str(self.digest)}


@dataclass(frozen=True)
class PartsIndex:
    """``FILE.tar.parts.json``: the parts of one archive, in stream order."""

    schema_version: str
    archive_name: str
    size: int
    digest: Digest
    part_size: int
    parts: Tuple[PartRecord, ...]
    created: str = ""
    tool_version: str = ""
    bundle_digest: Optional[Digest] = None
    importer: Optional[FileRecord] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {
            "schemaVersion": self.schema_version,
            "mediaType": PARTS_MEDIA_TYPE,
            "created": self.created,
            "tool": {"name": "sneakernet", "version": self.tool_version},
            "archive": {"name": self.archive_name, "size": self.size, "digest": str(self.digest)},
            "partSize": self.part_size,
            "parts": [p.to_dict() for p in self.parts],
        }
        if self.bundle_digest is not None:
            doc["bundle"] = {"digest": str(self.bundle_digest)}
        if self.importer is not None:
            doc["importer"] = self.importer.to_dict()
        for key, value in self.extra.items():
            doc.setdefault(key, value)
        return doc


def _plain_name(value: Any) -> bool:
    return safe_relpath(value) and "/" not in value


class _IndexIssues:
    """The issues found in a parts index, and checkers of its fields that note one when a value
    is wrong."""

    def __init__(self) -> None:
        self.issues: List[str] = []

    def add(self, text: str) -> None:
        self.issues.append(text[:200])

    def size(self, value: Any, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.add(f"{what}: expected a non-negative integer, found {value!r}")
            return 0
        return value

    def digest(self, value: Any, what: str) -> Optional[Digest]:
        if not is_digest(value):
            self.add(f"{what}: expected 'sha256:' + 64 lowercase hex, found {value!r}")
            return None
        return Digest.parse(value)


def parse_parts_index(raw: bytes, where: str) -> PartsIndex:
    """Parse and check a parts index; every structural issue is listed in the error."""
    doc = parse_json(raw, where)
    c = _IndexIssues()
    if not isinstance(doc, dict):
        raise InvalidPartsIndex(f"reading {where}: expected a JSON object, found {type(doc).__name__}")
    version = doc.get("schemaVersion")
    m = _VERSION_RE.fullmatch(version) if isinstance(version, str) else None
    if m is None:
        c.add(f"schemaVersion: expected 'MAJOR.MINOR', found {version!r}")
    elif int(m.group(1)) != PARTS_SCHEMA_MAJOR:
        raise InvalidPartsIndex(
            f"reading {where}: expected parts index version {PARTS_SCHEMA_MAJOR}.x, found {version}",
            hint="use the bundle-import.pyz written beside the parts",
        )
    if doc.get("mediaType") != PARTS_MEDIA_TYPE:
        c.add(f"mediaType: expected {PARTS_MEDIA_TYPE!r}, found {doc.get('mediaType')!r}")
    archive: Dict[str, Any] = doc["archive"] if isinstance(doc.get("archive"), dict) else {}
    if not archive:
        c.issues.append("archive: expected an object with name, size and digest")
    name = archive.get("name")
    if not _plain_name(name):
        c.add(f"archive.name: expected a plain file name, found {name!r}")
    total = c.size(archive.get("size"), "archive.size")
    whole = c.digest(archive.get("digest"), "archive.digest")
    part_size = c.size(doc.get("partSize"), "partSize")
    parts = _parse_parts(c, doc.get("parts"), part_size)
    if parts and sum(p.size for p in parts) != total:
        c.issues.append(f"archive.size: {total} differs from the sum of the parts ({sum(p.size for p in parts)})")
    bundle_digest = None
    bundle_doc: Dict[str, Any] = doc["bundle"] if isinstance(doc.get("bundle"), dict) else {}
    if bundle_doc:
        bundle_digest = c.digest(bundle_doc.get("digest"), "bundle.digest")
    importer = _parse_importer(c, doc.get("importer"))
    if c.issues or whole is None:
        raise InvalidPartsIndex(
            f"reading {where}: expected a valid parts index, found {len(c.issues)} problem(s)",
            context="\n".join(c.issues[:50]),
            hint="the parts index was modified or damaged; copy it again from the source medium",
        )
    tool: Dict[str, Any] = doc["tool"] if isinstance(doc.get("tool"), dict) else {}
    known = {"schemaVersion", "mediaType", "created", "tool", "archive", "partSize", "parts", "bundle", "importer"}
    return PartsIndex(
        schema_version=str(version), archive_name=str(name), size=total, digest=whole, part_size=part_size,
        parts=tuple(parts), created=str(doc.get("created", "")), tool_version=str(tool.get("version", "")),
        bundle_digest=bundle_digest, importer=importer, extra={k: v for k, v in doc.items() if k not in known},
    )


def _parse_parts(c: _IndexIssues, raw_parts: Any, part_size: int) -> List[PartRecord]:
    """``parts``: a non-empty array of plain, distinct names, each at most ``partSize`` bytes."""
    parts: List[PartRecord] = []
    if not isinstance(raw_parts, list) or not raw_parts:
        c.issues.append("parts: expected a non-empty array")
        return parts
    seen = set()
    for i, raw_part in enumerate(raw_parts):
        if not isinstance(raw_part, dict):
            c.issues.append(f"parts[{i}]: expected an object")
            continue
        pname = raw_part.get("name")
        if not _plain_name(pname):
            c.add(f"parts[{i}].name: expected a plain file name, found {pname!r}")
            continue
        if pname in seen:
            c.issues.append(f"parts[{i}].name: {pname!r} is listed twice")
        seen.add(pname)
        psize = c.size(raw_part.get("size"), f"parts[{i}].size")
        pdigest = c.digest(raw_part.get("digest"), f"parts[{i}].digest")
        if part_size and psize > part_size:
            c.issues.append(f"parts[{i}].size: {psize} is over partSize {part_size}")
        if pdigest is not None:
            parts.append(PartRecord(str(pname), psize, pdigest))
    return parts


def _parse_importer(c: _IndexIssues, value: Any) -> Optional[FileRecord]:
    """The optional ``importer`` record: the pyz written beside the parts."""
    imp: Dict[str, Any] = value if isinstance(value, dict) else {}
    if not imp:
        return None
    idigest = c.digest(imp.get("digest"), "importer.digest")
    if _plain_name(imp.get("path")) and idigest is not None:
        return FileRecord(imp["path"], idigest, c.size(imp.get("size"), "importer.size"))
    c.add(f"importer.path: expected a plain file name, found {imp.get('path')!r}")
    return None


class Location(NamedTuple):
    """What a BUNDLE argument names: ``kind`` is "folder", "tar" or "parts"; ``path`` is the
    folder, the tar file or the parts index."""

    kind: str
    path: str


def locate(path: str) -> Location:
    """Resolve a BUNDLE argument: a folder, a tar, a parts index, one of the parts, a tar
    name whose parts index sits beside it, or a folder's ``bundle.json`` (read as the folder).
    Nothing there: :class:`BundleNotFound` (a usage error)."""
    if os.path.basename(path) == "bundle.json" and os.path.isfile(path) and not os.path.islink(path):
        return Location("folder", os.path.dirname(os.path.abspath(path)))
    if os.path.isdir(path):
        return Location("folder", path)
    if path.endswith(PARTS_SUFFIX) and os.path.isfile(path):
        return Location("parts", path)
    m = _PART_RE.match(path)
    if m is not None and os.path.isfile(m.group(1) + PARTS_SUFFIX):
        return Location("parts", m.group(1) + PARTS_SUFFIX)
    if os.path.isfile(path):
        return Location("tar", path)
    if os.path.isfile(path + PARTS_SUFFIX):
        return Location("parts", path + PARTS_SUFFIX)
    raise BundleNotFound(
        f"opening the bundle {path}: expected a bundle folder, a .tar or a {PARTS_SUFFIX} parts index, found nothing",
        hint="check the path (a typo?); pass the folder holding bundle.json, FILE.tar, or FILE.tar.parts.json",
    )


#: A defect of one part: the same shape as every other verification problem.
PartIssue = Problem


class ConcatFile(io.RawIOBase):
    """A read-only, seekable view of files laid end to end (the parts of one tar).

    With ``expect`` (the index's parts), bytes read in order from the start are hashed part by
    part, and each part is checked against the index the moment its last byte is read:
    :attr:`part_issues` names a damaged or misplaced part, :attr:`parts_checked` counts them."""

    def __init__(self, files: List[Tuple[str, int]], expect: Optional[Sequence[PartRecord]] = None) -> None:
        super().__init__()
        self._files = files
        self._starts: List[int] = []
        total = 0
        for _, size in files:
            self._starts.append(total)
            total += size
        self.size = total
        self._pos = 0
        self._open_index = -1
        self._fh: Optional[io.BufferedReader] = None
        self._expect = list(expect) if expect is not None else None
        self._by_digest = {p.digest: p.name for p in self._expect} if self._expect else {}
        self._hashed = 0  # bytes hashed, in order from the start
        self._hasher: Any = hashlib.sha256()
        self._hash_part = 0
        self.part_issues: List[PartIssue] = []
        self.parts_checked = 0
        self._check_part_ends()

    def _check_part_ends(self) -> None:
        """Close the parts whose last byte has been hashed (empty ones too)."""
        while self._expect is not None and self._hash_part < len(self._expect) and \
                self._hashed >= self._starts[self._hash_part] + self._files[self._hash_part][1]:
            rec = self._expect[self._hash_part]
            got = Digest("sha256", self._hasher.hexdigest())
            if got != rec.digest:
                other = self._by_digest.get(got)
                self.part_issues.append(
                    PartIssue("reordered-part", rec.name, f"holds the bytes the index lists for {other} "
                              "(parts renamed or out of order?)") if other is not None else
                    PartIssue("part-digest-mismatch", rec.name, f"expected {rec.digest}, found {got} "
                              "(damaged in transit)"))
            self.parts_checked += 1
            self._hash_part += 1
            self._hasher = hashlib.sha256()

    def _hash(self, start: int, data: Any) -> None:
        """Hash ``data`` read at ``start`` if it continues what was hashed (reads in order)."""
        if self._expect is None or start != self._hashed:
            return
        view = memoryview(data)
        while len(view) and self._hash_part < len(self._expect):
            end = self._starts[self._hash_part] + self._files[self._hash_part][1]
            take = view[: end - self._hashed]  # not empty: finished parts were closed already
            self._hasher.update(take)
            self._hashed += len(take)
            view = view[len(take):]
            self._check_part_ends()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence == io.SEEK_END:
            offset += self.size
        if offset < 0:
            raise ValueError("negative seek position")
        self._pos = offset
        return offset

    def _part_at(self, pos: int) -> int:
        lo, hi = 0, len(self._starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def read(self, size: Optional[int] = -1) -> bytes:
        """Up to ``size`` bytes, never across a part boundary (one copy, straight from the file)."""
        if size is None or size < 0:
            size = self.size - self._pos
        fh, want = self._at(size)
        if fh is None or want <= 0:
            return b""
        data = fh.read(want)
        if not data:
            raise SizeMismatch(f"reading {self._files[self._open_index][0]}: expected more bytes, found the end",
                               hint="the part was truncated after it was checked; copy it again")
        self._hash(self._pos, data)
        self._pos += len(data)
        return bytes(data)

    def _at(self, size: int) -> Tuple[Optional[io.BufferedReader], int]:
        """The open part at the current position, and how much may be read from it."""
        if self._pos >= self.size or not self._files:
            return None, 0
        i = self._part_at(self._pos)
        while i < len(self._files) - 1 and self._starts[i] + self._files[i][1] <= self._pos:
            i += 1  # skip empty parts
        path, part_size = self._files[i]
        within = self._pos - self._starts[i]
        if i != self._open_index:
            self._close_part()
            self._fh = open(path, "rb")  # noqa: SIM115 - kept open across reads, closed in close()
            self._open_index = i
        assert self._fh is not None
        if self._fh.tell() != within:
            self._fh.seek(within)
        return self._fh, min(size, part_size - within)

    def readinto(self, b: Any) -> int:
        fh, want = self._at(len(b))
        if fh is None or want <= 0:
            return 0
        n = fh.readinto(memoryview(b)[:want])
        if not n:
            raise SizeMismatch(f"reading {self._files[self._open_index][0]}: expected more bytes, found the end",
                               hint="the part was truncated after it was checked; copy it again")
        self._hash(self._pos, memoryview(b)[:n])
        self._pos += n
        return int(n)

    def _close_part(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._open_index = -1

    def close(self) -> None:
        self._close_part()
        super().close()


class MemberReader:
    """The bytes of one tar member, read by offset from the parts; :meth:`seek` moves within it.
    ``cf``: share an open ConcatFile (left open by :meth:`close`)."""

    def __init__(self, files: List[Tuple[str, int]], offset: int, size: int, name: str, *,
                 cf: Optional[ConcatFile] = None, on_bytes: Optional[Callable[[int], None]] = None) -> None:
        self._own = cf is None
        self._cf = cf if cf is not None else ConcatFile(files)
        self._offset = offset
        self.size = size
        self.name = name
        self._pos = 0
        self._on = on_bytes

    def read(self, n: int = -1) -> bytes:
        left = self.size - self._pos
        if n is None or n < 0 or n > left:
            n = left
        if n <= 0:
            return b""
        self._cf.seek(self._offset + self._pos)
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:  # fill the request (parts may end inside it): a short read means EOF
            k = self._cf.readinto(view[got:])
            if not k:
                break
            got += k
        self._pos += got
        if self._on is not None and got:
            self._on(got)
        return bytes(buf) if got == n else bytes(view[:got])

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        memoryview(b)[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence == io.SEEK_END:
            offset += self.size
        self._pos = max(0, min(offset, self.size))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a tar member has no file descriptor")

    def close(self) -> None:
        if self._own:
            self._cf.close()

    def __enter__(self) -> MemberReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Member:
    name: str
    offset: int
    size: int
    regular: bool


class ArchiveReader:
    """A bundle tar or a set of parts, read in place."""

    def __init__(self, path: str) -> None:
        loc = locate(path)
        if loc.kind == "folder":
            raise ManifestError(f"opening {path}: expected a tar or a parts index, found a folder")
        self.kind = loc.kind
        self.path = os.path.abspath(loc.path)
        self.directory = os.path.dirname(self.path)
        self.index: Optional[PartsIndex] = None
        self.raw_index: Optional[bytes] = None  # the parts index exactly as read
        if loc.kind == "parts":
            raw = read_file_limited(self.path, MAX_PARTS_INDEX, os.path.basename(self.path))
            self.raw_index = raw
            self.index = parse_parts_index(raw, os.path.basename(self.path))
            self.files = [(os.path.join(self.directory, p.name), p.size) for p in self.index.parts]
        else:
            self.files = [(self.path, os.path.getsize(self.path))]
        self._members: Optional[Dict[str, Member]] = None

    def __str__(self) -> str:
        return self.path

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)

    def part_issues(self) -> List[PartIssue]:
        """Missing, truncated, oversized and extra parts, from the folder listing alone."""
        if self.index is None:
            return []
        issues: List[PartIssue] = []
        for rec in self.index.parts:
            full = os.path.join(self.directory, rec.name)
            if not os.path.isfile(full):
                issues.append(PartIssue("missing-part", rec.name, f"expected a part of {rec.size} bytes, found none"))
                continue
            found = os.path.getsize(full)
            if found < rec.size:
                issues.append(PartIssue("truncated-part", rec.name,
                                        f"expected {rec.size} bytes, found {found} (the copy was cut short)"))
            elif found > rec.size:
                issues.append(PartIssue("part-size-mismatch", rec.name, f"expected {rec.size} bytes, found {found}"))
        listed = {p.name for p in self.index.parts}
        prefix = self.index.archive_name + ".part"
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(self.directory)):
                m = _PART_RE.match(name)
                if m is not None and name.startswith(prefix) and name not in listed:
                    issues.append(PartIssue(
                        "extra-part", name,
                        f"not listed in {os.path.basename(self.path)} (a stale part from another split?); "
                        "remove it or copy the matching parts index"))
        return issues

    def hash_issues(self, skip: Tuple[str, ...] = ()) -> List[PartIssue]:
        """Every present part hashed and compared with the index: damaged or out-of-order parts."""
        if self.index is None:
            return []
        by_digest = {p.digest: p.name for p in self.index.parts}
        issues: List[PartIssue] = []
        for rec in self.index.parts:
            full = os.path.join(self.directory, rec.name)
            if rec.name in skip or not os.path.isfile(full):
                continue
            got, _ = hash_file(full)
            if got == rec.digest:
                continue
            other = by_digest.get(got)
            if other is not None:
                issues.append(PartIssue("reordered-part", rec.name, f"holds the bytes the index lists for {other} "
                                        "(parts renamed or out of order?)"))
            else:
                issues.append(PartIssue("part-digest-mismatch", rec.name,
                                        f"expected {rec.digest}, found {got} (damaged in transit)"))
        return issues

    def damaged(self, cause: BaseException) -> BundleError:
        """The error for a tar that cannot be read: the damaged parts when some are, else ``cause``."""
        issues = self.part_issues()
        issues += self.hash_issues(tuple(i.path for i in issues))
        if issues:
            return VerificationFailed(
                f"reading {self.path}: expected every part intact and in order, found {len(issues)} problem(s)",
                issues, context="\n".join(str(i) for i in issues[:50]),
                hint="copy the named parts again from the source medium; nothing was loaded",
            )
        if isinstance(cause, BundleError):
            return cause
        return ManifestError(
            f"reading the tar headers of {self.path}: expected a tar archive, found damaged data ({cause})",
            hint="verify it: bundle-import BUNDLE --verify-only lists every problem",
        )

    def members(self) -> Dict[str, Member]:
        """Member name -> offset and size, found by seeking from header to header with the one
        tar reader for untrusted archives (importer/input/safetar.py): the same parser, limits and
        refusals as verification, so both see the same members (docs/security.md)."""
        if self._members is None:
            found: Dict[str, Member] = {}
            label = os.path.basename(self.path)
            try:
                with ConcatFile(self.files) as cf:
                    for m in SafeTarReader(cf, BUNDLE_POLICY, what=label, seek_over_data=True):
                        if m.offset + m.size > cf.size:
                            raise ArchiveMalformed(
                                f"reading {label} member {m.name[:200]!r}: expected its {m.size} bytes within the "
                                f"archive, found only {max(0, cf.size - m.offset)}",
                                hint="the archive is truncated; re-copy it")
                        found[m.name] = Member(m.name, m.offset, m.size, m.isfile())
            except (BundleError, OSError) as e:
                raise self.damaged(e) from e
            self._members = found
        return self._members

    def open(self, rel: str) -> MemberReader:
        member = self.members().get(rel)
        if member is None or not member.regular:
            raise FileNotFoundError(f"{rel}: not a file in {self.path}")
        return MemberReader(self.files, member.offset, member.size, rel)
