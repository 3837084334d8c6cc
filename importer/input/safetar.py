"""A tar reader for archives that crossed the air gap: nothing in them is trusted.

Use it for every tar the importer itself reads member by member or extracts (bundle tars and
parts, ``docker save`` re-exports, layer tars). It parses the headers itself (ustar, pax, GNU
long names), so every size is checked *before* anything is read into memory, and it refuses,
before yielding the member:

* absolute paths and ``..`` components (``archive-path-escape``),
* members whose path goes through a symlink of the same archive, symlinks whose target leaves
  the archive root, hardlinks to anything but an earlier regular file (``archive-link-escape``),
* device nodes and fifos unless the policy allows them (``archive-special-file``),
* a path seen twice, except a directory repeated (``archive-duplicate-member``),
* pax/GNU long-name headers above the bound, names above the bound, more members, bigger
  members or more bytes than the policy allows (``limit-exceeded``),
* bad checksums, truncated data, sparse and unknown member types (``archive-malformed``).

API (stream-friendly: ``fileobj`` only needs ``read``)::

    reader = SafeTarReader(fileobj, BUNDLE_POLICY, what="bundle.tar")
    for member in reader:            # TarMember, already checked
        data = reader.read(CHUNK)    # the current member's bytes (regular files)
    extract(fileobj, dest, BUNDLE_POLICY, what="bundle.tar")  # into an empty folder

Policies: :data:`BUNDLE_POLICY` (regular files and folders only: what a bundle holds),
:data:`LAYER_POLICY` (an image layer read for checking, never extracted onto the host: links
resolved inside the image root, device nodes allowed, directories repeated)."""

from __future__ import annotations

import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Set

from importer.errors import IntegrityError, LimitExceeded
from importer.format.digest import CHUNK

BLOCK = 512


class UnsafeArchive(IntegrityError):
    """A tar member the importer refuses to read or extract."""

    reference = "unsafe-archive"


class ArchiveMalformed(UnsafeArchive):
    reference = "archive-malformed"


class ArchivePathEscape(UnsafeArchive):
    reference = "archive-path-escape"


class ArchiveLinkEscape(UnsafeArchive):
    reference = "archive-link-escape"


class ArchiveSpecialFile(UnsafeArchive):
    reference = "archive-special-file"


class ArchiveDuplicate(UnsafeArchive):
    reference = "archive-duplicate-member"


_HINT = "do not use this archive: it was damaged or crafted; get a fresh copy from the source"

FILE, DIR, SYMLINK, HARDLINK, CHAR, BLOCKDEV, FIFO = "file", "dir", "symlink", "hardlink", "char", "block", "fifo"
_TYPES = {b"0": FILE, b"\0": FILE, b"7": FILE, b"1": HARDLINK, b"2": SYMLINK, b"3": CHAR, b"4": BLOCKDEV,
          b"5": DIR, b"6": FIFO}


@dataclass(frozen=True)
class TarPolicy:
    max_members: int = 1_000_000
    max_name: int = 4096  # bytes of a path or link target
    max_pax: int = 1024 * 1024  # bytes of one pax header (extended attributes live there)
    max_member_size: Optional[int] = None
    max_total: Optional[int] = None  # bytes of member data in the whole archive
    links: str = "inside"  # "refuse", "inside" (targets stay under the root) or "rootfs"
    allow_special: bool = False  # device nodes and fifos
    allow_duplicates: bool = False  # a path twice (a directory repeated is always fine)


#: A bundle as tar or parts: regular files and folders only.
BUNDLE_POLICY = TarPolicy(links="refuse")
#: A ``docker save`` stream read back (podman links layer.tar files): links must stay inside.
ARCHIVE_POLICY = TarPolicy(links="inside")
#: An image layer read for checking: absolute symlinks point into the image, devices exist.
#: Never extract with it onto the host.
LAYER_POLICY = TarPolicy(links="rootfs", allow_special=True, allow_duplicates=True, max_pax=8 * 1024 * 1024)


@dataclass(frozen=True)
class TarMember:
    name: str  # normalized: no leading "./" or "/", no "." or empty components; "." is the root
    type: str  # FILE, DIR, SYMLINK, HARDLINK, CHAR, BLOCKDEV, FIFO
    size: int  # data bytes (0 for everything but FILE)
    mode: int
    linkname: str = ""  # normalized target for hardlinks; as stored for symlinks
    uid: int = 0
    gid: int = 0
    mtime: float = 0
    offset: int = 0  # where its data starts in the stream
    pax: Dict[str, str] = field(default_factory=dict)

    def isfile(self) -> bool:
        return self.type == FILE


# ============================================================================ header fields


def _num(field_: bytes, what: str, *, base256: bool = True, limit: int = 2**63 - 1) -> int:
    """A numeric header field: octal digits (space/NUL padded) or, where GNU tar allows it (sizes,
    ids, times; never the mode), base-256. Anything else is malformed, as GNU tar says too."""
    if field_ and field_[0] & 0x80:  # GNU base-256
        if not base256:
            raise ArchiveMalformed(f"reading {what}: expected an octal number, found a base-256 one", hint=_HINT)
        if field_[0] == 0xFF:
            raise ArchiveMalformed(f"reading {what}: expected a non-negative number, found a negative one",
                                   hint=_HINT)
        value = field_[0] & 0x7F
        for b in field_[1:]:
            value = (value << 8) | b
        if value > limit:
            raise ArchiveMalformed(f"reading {what}: expected a number up to {limit}, found {value}", hint=_HINT)
        return value
    text = field_.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not _OCTAL.fullmatch(text):
        raise ArchiveMalformed(f"reading {what}: expected an octal number, found {text[:20]!r}", hint=_HINT)
    return int(text, 8)


_OCTAL = re.compile(rb"[0-7]+")


def _str(field_: bytes) -> str:
    return field_.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _checksum_ok(block: bytes) -> bool:
    stored = _num(block[148:156], "a header checksum", base256=False)
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    signed = sum((b - 256 if b > 127 else b) for b in block[:148]) + 8 * 32 + sum(
        (b - 256 if b > 127 else b) for b in block[156:])
    return stored in (unsigned, signed)


def _parse_pax(data: bytes, what: str) -> Dict[str, str]:
    records: Dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos:].strip(b"\0") == b"":
            break
        space = data.find(b" ", pos, pos + 24)
        try:
            length = int(data[pos:space]) if space > pos else -1
        except ValueError:
            length = -1
        end = pos + length
        if length <= 0 or end > len(data) or data[end - 1:end] != b"\n" or b"=" not in data[space + 1:end]:
            raise ArchiveMalformed(f"reading a pax header of {what}: expected 'LEN key=value\\n' records, "
                                   "found something else", hint=_HINT)
        key, _, value = data[space + 1:end - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return records


def normalize_name(name: str, what: str, *, field_name: str = "path") -> str:
    """A member path made relative and canonical; absolute paths and '..' are refused."""
    if "\0" in name:
        raise ArchiveMalformed(f"reading {what}: expected a {field_name} without NUL bytes, found one", hint=_HINT)
    if name.startswith("/"):
        raise ArchivePathEscape(f"reading {what}: expected a relative {field_name}, found the absolute {name[:200]!r}",
                                hint=_HINT)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchivePathEscape(f"reading {what}: expected a {field_name} inside the archive, found "
                                f"{name[:200]!r} (it climbs out with '..')", hint=_HINT)
    return "/".join(parts) or "."


# ============================================================================ the reader


class SafeTarReader:
    """Iterate the checked members of a tar stream; :meth:`read` the current one's data."""

    def __init__(self, fileobj: Any, policy: TarPolicy = BUNDLE_POLICY, *, what: str = "archive",
                 seek_over_data: bool = False) -> None:
        """``seek_over_data``: skip member data by seeking (an index of a file read in place; the
        caller checks that every member lies within the file)."""
        self._f = fileobj
        self.policy = policy
        self.what = what
        self.position = 0
        self._left = 0  # data bytes of the current member not read yet
        self._pad = 0
        self._count = 0
        self._total = 0
        self._seen: Dict[str, str] = {}
        self._symlinks: Set[str] = set()
        self._global: Dict[str, str] = {}
        self._done = False
        self._seekable = seek_over_data

    # --- raw reads
    def _read_exact(self, n: int, doing: str) -> bytes:
        chunks: List[bytes] = []
        got = 0
        while got < n:
            data = self._f.read(min(CHUNK, n - got))
            if not data:
                raise ArchiveMalformed(f"reading {self.what}: expected {n} more bytes ({doing}), found the end",
                                       hint="the archive is truncated; re-copy it")
            chunks.append(data)
            got += len(data)
        self.position += n
        return b"".join(chunks)

    def _skip(self, n: int) -> None:
        if n > 0 and self._seekable:  # an index of a file read in place: no need to read the data
            self._f.seek(n, os.SEEK_CUR)
            self.position += n
            return
        while n > 0:
            data = self._f.read(min(CHUNK, n))
            if not data:
                raise ArchiveMalformed(f"reading {self.what}: expected {n} more bytes, found the end",
                                       hint="the archive is truncated; re-copy it")
            n -= len(data)
            self.position += len(data)

    def read(self, n: int = -1) -> bytes:
        """Data of the current member (at most ``n`` bytes; b"" at its end)."""
        if self._left <= 0:
            return b""
        want = self._left if n is None or n < 0 else min(n, self._left)
        data = self._f.read(min(want, CHUNK) if n is None or n < 0 else want)
        if not data:
            raise ArchiveMalformed(f"reading {self.what}: expected {self._left} more bytes of a member, found the end",
                                   hint="the archive is truncated; re-copy it")
        self._left -= len(data)
        self.position += len(data)
        return bytes(data)

    def skip_rest(self) -> None:
        """Skip what is left of the current member (its data and padding): the stream then stands
        at the next header (a caller copying members byte for byte can cut there)."""
        self._finish_member()

    def _finish_member(self) -> None:
        self._skip(self._left + self._pad)
        self._left = self._pad = 0

    # --- iteration
    def __iter__(self) -> Iterator[TarMember]:
        return self

    def __next__(self) -> TarMember:
        if self._done:
            raise StopIteration
        self._finish_member()
        pax: Dict[str, str] = {}
        long_name: Optional[str] = None
        long_link: Optional[str] = None
        while True:
            block = self._read_block()
            if block is None or block == b"\0" * BLOCK:  # end of archive (one zero block suffices)
                self._done = True
                raise StopIteration
            if not _checksum_ok(block):
                raise ArchiveMalformed(f"reading {self.what} at byte {self.position - BLOCK}: expected a tar header "
                                       "with a valid checksum, found something else", hint=_HINT)
            typeflag = block[156:157]
            size = _num(block[124:136], f"the size field of {self.what}")
            padded = -size % BLOCK
            if typeflag in (b"x", b"g"):
                if size > self.policy.max_pax:
                    raise LimitExceeded(f"reading a pax header of {self.what}: expected at most "
                                        f"{self.policy.max_pax} bytes, found {size}", hint=_HINT)
                records = _parse_pax(self._read_exact(size, "a pax header"), self.what)
                self._skip(padded)
                (pax if typeflag == b"x" else self._global).update(records)
                continue
            if typeflag in (b"L", b"K"):
                if size > self.policy.max_name + 1:
                    raise LimitExceeded(f"reading a GNU long name of {self.what}: expected at most "
                                        f"{self.policy.max_name} bytes, found {size}", hint=_HINT)
                value = _str(self._read_exact(size, "a GNU long name"))
                self._skip(padded)
                if typeflag == b"L":
                    long_name = value
                else:
                    long_link = value
                continue
            break
        self._count += 1
        if self._count > self.policy.max_members:
            raise LimitExceeded(f"reading {self.what}: expected at most {self.policy.max_members} members, "
                                "found more", hint=_HINT)
        merged = {**self._global, **pax}
        if "size" in merged:
            try:
                size = int(merged["size"])
            except ValueError:
                raise ArchiveMalformed(f"reading {self.what}: expected a numeric pax size, found "
                                       f"{merged['size'][:20]!r}", hint=_HINT) from None
        member = self._member(block, merged, long_name, long_link, size)
        self._left = size if member.type == FILE else 0
        self._pad = -size % BLOCK
        if member.type != FILE:  # links and folders carry no data; skip any there is
            self._skip(size)
        return member

    def _read_block(self) -> Optional[bytes]:
        """The next 512-byte header block, or None at the very end of the stream."""
        block = b""
        while len(block) < BLOCK:
            data = self._f.read(BLOCK - len(block))
            if not data:
                if not block:
                    return None
                raise ArchiveMalformed(f"reading {self.what}: expected a 512-byte header, found the end after "
                                       f"{len(block)} bytes", hint="the archive is truncated; re-copy it")
            block += data
        self.position += BLOCK
        return block

    def _member(self, block: bytes, pax: Dict[str, str], long_name: Optional[str], long_link: Optional[str],
                size: int) -> TarMember:
        typeflag = block[156:157]
        kind = _TYPES.get(typeflag)
        if kind is None:
            raise ArchiveMalformed(f"reading {self.what}: expected a file, folder or link, found member type "
                                   f"{typeflag!r} (sparse and vendor types are not supported)", hint=_HINT)
        name = _str(block[0:100])
        magic = block[257:265]
        if magic[:6] == b"ustar\0" and block[345:500].strip(b"\0"):  # POSIX ustar: prefix field
            name = _str(block[345:500]) + "/" + name
        name = pax.get("path", long_name if long_name is not None else name)
        link = pax.get("linkpath", long_link if long_link is not None else _str(block[157:257]))
        if len(name.encode("utf-8", "surrogateescape")) > self.policy.max_name or \
                len(link.encode("utf-8", "surrogateescape")) > self.policy.max_name:
            raise LimitExceeded(f"reading {self.what}: expected names of at most {self.policy.max_name} bytes, "
                                "found a longer one", hint=_HINT)
        if size < 0:
            raise ArchiveMalformed(f"reading {self.what}: expected a non-negative size, found {size}", hint=_HINT)
        where = f"{self.what} member {name[:200]!r}"
        norm = normalize_name(name, where)
        if kind == FILE and name.endswith("/"):
            kind = DIR  # old tars mark folders by a trailing slash
        if kind == FILE:
            if self.policy.max_member_size is not None and size > self.policy.max_member_size:
                raise LimitExceeded(f"reading {where}: expected at most {self.policy.max_member_size} bytes, "
                                    f"found {size}", hint=_HINT)
            self._total += size
            if self.policy.max_total is not None and self._total > self.policy.max_total:
                raise LimitExceeded(f"reading {self.what}: expected at most {self.policy.max_total} bytes of "
                                    "members, found more", hint=_HINT)
        self._check_path(norm, kind, where)
        linkname = ""
        if kind == SYMLINK:
            linkname = self._check_symlink(norm, link, where)
        elif kind == HARDLINK:
            linkname = self._check_hardlink(link, where)
        elif kind in (CHAR, BLOCKDEV, FIFO) and not self.policy.allow_special:
            raise ArchiveSpecialFile(f"reading {where}: expected files, folders and links only, found a "
                                     f"{'device node' if kind != FIFO else 'fifo'} ({kind})", hint=_HINT)
        self._seen[norm] = kind
        if kind == SYMLINK:
            self._symlinks.add(norm)
        mtime = block[136:148]
        return TarMember(
            name=norm, type=kind, size=size if kind == FILE else 0,
            mode=_num(block[100:108], f"the mode of {where}", base256=False) & 0o7777, linkname=linkname,
            uid=_num(block[108:116], f"the uid of {where}", limit=2**32 - 1),
            gid=_num(block[116:124], f"the gid of {where}", limit=2**32 - 1),
            mtime=float(_num(mtime, f"the mtime of {where}")), offset=self.position, pax=pax,
        )

    def _check_path(self, norm: str, kind: str, where: str) -> None:
        parts = norm.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in self._symlinks:
                raise ArchiveLinkEscape(f"reading {where}: expected a path through folders, found one through "
                                        f"the symlink {parent!r} of the same archive", hint=_HINT)
        before = self._seen.get(norm)
        if before is not None and not (before == DIR and kind == DIR) and not self.policy.allow_duplicates:
            raise ArchiveDuplicate(f"reading {where}: expected each path once, found it again "
                                   f"(first as {before}, now as {kind})", hint=_HINT)

    def _check_symlink(self, norm: str, target: str, where: str) -> str:
        if self.policy.links == "refuse":
            raise ArchiveLinkEscape(f"reading {where}: expected files and folders only, found a symlink "
                                    f"to {target[:200]!r}", hint=_HINT)
        if not target or "\0" in target:
            raise ArchiveMalformed(f"reading {where}: expected a symlink target, found none", hint=_HINT)
        if self.policy.links == "rootfs":
            return target
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(norm), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise ArchiveLinkEscape(f"reading {where}: expected a symlink that stays inside the archive, "
                                    f"found one to {target[:200]!r}", hint=_HINT)
        return target

    def _check_hardlink(self, target: str, where: str) -> str:
        if self.policy.links == "refuse":
            raise ArchiveLinkEscape(f"reading {where}: expected files and folders only, found a hardlink "
                                    f"to {target[:200]!r}", hint=_HINT)
        if target.startswith("/") and self.policy.links == "rootfs":
            target = target.lstrip("/")
        try:
            norm = normalize_name(target, where, field_name="hardlink target")
        except ArchivePathEscape as e:
            raise ArchiveLinkEscape(e.message, hint=_HINT) from None
        if self._seen.get(norm) not in (FILE, HARDLINK):
            raise ArchiveLinkEscape(f"reading {where}: expected a hardlink to an earlier file of the archive, "
                                    f"found one to {target[:200]!r}", hint=_HINT)
        return norm  # an earlier file: its own path was checked when it was added


# ============================================================================ extraction


def extract(fileobj: Any, dest: str, policy: TarPolicy = BUNDLE_POLICY, *, what: str = "archive") -> List[TarMember]:
    """Extract every member into the existing empty folder ``dest``; returns the members.

    Never follows a link while writing (``O_NOFOLLOW``, no path through an archive symlink),
    never overwrites (``O_EXCL``), never creates device nodes, strips setuid/setgid bits.
    ``policy.links == "rootfs"`` is refused: a layer's links are not safe on the host."""
    if policy.links == "rootfs" or policy.allow_special:
        raise ValueError("extract() needs a policy whose links stay inside and without special files")
    if os.listdir(dest):
        raise ValueError(f"extract(): {dest} is not empty")
    dest = os.path.abspath(dest)
    members: List[TarMember] = []
    reader = SafeTarReader(fileobj, policy, what=what)
    for m in reader:
        path = dest if m.name == "." else os.path.join(dest, *m.name.split("/"))
        _make_parents(dest, path)
        if m.type == DIR:
            if not os.path.lexists(path):
                os.mkdir(path, 0o755)
            elif not stat.S_ISDIR(os.lstat(path).st_mode):
                raise ArchiveDuplicate(f"extracting {what} member {m.name!r}: expected a folder, found a file there",
                                       hint=_HINT)
        elif m.type == FILE:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         (m.mode & 0o777) | 0o600)
            with os.fdopen(fd, "wb") as out:
                while True:
                    data = reader.read(CHUNK)
                    if not data:
                        break
                    out.write(data)
        elif m.type == SYMLINK:
            os.symlink(m.linkname, path)
        elif m.type == HARDLINK:
            os.link(os.path.join(dest, *m.linkname.split("/")), path, follow_symlinks=False)
        members.append(m)
    for m in members:  # folders last-known modes (no setuid/setgid/sticky)
        if m.type == DIR and m.name != ".":
            os.chmod(os.path.join(dest, *m.name.split("/")), (m.mode & 0o777) | 0o700)
    return members


def _make_parents(dest: str, path: str) -> None:
    parent = os.path.dirname(path)
    rel = os.path.relpath(parent, dest)
    if rel == ".":
        return
    current = dest
    for part in rel.split(os.sep):
        current = os.path.join(current, part)
        if not os.path.lexists(current):
            os.mkdir(current, 0o755)
        elif not stat.S_ISDIR(os.lstat(current).st_mode):
            raise ArchiveLinkEscape(f"extracting into {dest}: expected {current} to be a folder, found a link or "
                                    "file", hint=_HINT)
