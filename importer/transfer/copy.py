"""copy_bundle(): copy a bundle (folder, tar or parts) to a destination folder, resumably.

Stdlib only: it runs as ``bundle copy`` on the online side and as ``bundle-import copy`` (the
zipapp) on the offline side, e.g. from a USB stick to local disk.

Files already at the destination with the right digest are skipped; a file cut short by an
interruption (``NAME.partial``) is resumed from its length, and its digest is checked over the
whole file (prefix included) before it is renamed into place; everything is fsynced. The copy
ends with a full verification of the destination. Interrupting it at any point (even SIGKILL)
and re-running finishes the job.

Nothing below SRC is trusted: every source file is opened with ``fsutil.open_regular`` (a
regular file of the recorded size, no link followed on the way, no FIFO or device) and read no
further than its recorded size + 1 byte; all of them are checked before anything is written.
At DST no link is followed either (a link or FIFO under a name the copy writes is replaced).

- folder SRC: DST becomes the bundle folder (blobs first, bundle.json and SHA256SUMS last).
- tar SRC: DST/FILE.tar (+ DST/bundle-import.pyz when SRC has one beside it).
- parts SRC: DST/FILE.tar.partNNN, DST/bundle-import.pyz, then DST/FILE.tar.parts.json last."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple

from importer.errors import (
    BundleError,
    DestinationInUse,
    DigestMismatch,
    UnwritableDestination,
    UsageError,
    VerificationFailed,
    name_write_error,
    write_error,
)
from importer.format.digest import CHUNK, Digest
from importer.format.manifest import BUNDLE_JSON, IMPORTER_PYZ
from importer.input.archive import PARTS_SUFFIX, ArchiveReader
from importer.input.opened import Bundle, open_bundle
from importer.streams.fatfs import check_fits
from importer.streams.fsutil import describe_mode, fsync_dir, open_regular, read_exactly
from importer.streams.progress import close_progress
from importer.verify.bundle import VerifyReport
from importer.verify.importercopies import importer_copy_problems, pinned_importer
from importer.verify.opened import verify_opened

ProgressFn = Callable[[int], None]
PARTIAL = ".partial"
_METADATA_MAX = 16 * 1024 * 1024  # bundle.json, index.json, SHA256SUMS, a parts index: compared before copying


@dataclass
class CopyItem:
    src: str
    rel: str  # path under DST
    size: int
    digest: Optional[Digest]  # pinned; None: compare with the source's own digest when needed
    root: str = ""  # src is read below this folder without following a link ("": its own folder)

    def open(self) -> BinaryIO:
        """The source, only if it is still a regular file of ``size`` bytes reached without a link."""
        return open_regular(self.src, f"copying {self.rel}", self.size, root=self.root or os.path.dirname(self.src))


@dataclass
class CopyResult:
    src: str
    dst: str
    kind: str
    copied: List[str] = field(default_factory=list)
    resumed: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    bytes_copied: int = 0
    seconds: float = 0.0
    verification: Optional[VerifyReport] = None
    target: str = ""  # what to import on the far side (DST, DST/FILE.tar or the parts index)
    replaced: List[str] = field(default_factory=list)  # --replace: the other bundle's files removed from DST

    def to_dict(self) -> Dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "kind": self.kind,
            "bundle": self.target,
            "copied": self.copied,
            "resumed": self.resumed,
            "skipped": self.skipped,
            "bytesCopied": self.bytes_copied,
            "seconds": round(self.seconds, 3),
            "verification": self.verification.to_dict() if self.verification else None,
            "replaced": self.replaced,
        }


class _Throttle:
    """At most ``rate`` bytes per second (``--bwlimit``), averaged since the start."""

    def __init__(self, rate: Optional[int]) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.done = 0

    def __call__(self, n: int) -> None:
        if not self.rate:
            return
        self.done += n
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


def _probe(path: str, root: str, what: str, size: Optional[int] = None) -> int:
    """Check that ``path`` is a regular file (of ``size`` bytes) below ``root``; its size."""
    with open_regular(path, what, size, root=root) as f:
        return os.fstat(f.fileno()).st_size


def _optional(root: str, name: str, size: Optional[int] = None) -> Optional[CopyItem]:
    """A CopyItem for root/name if anything is there (a link or special file is refused), else None."""
    full = os.path.join(root, name)
    if not os.path.lexists(full):
        return None
    return CopyItem(full, name, _probe(full, root, f"copying {name}", size), None, root)


def _checked_importer(opened: Bundle) -> Optional[CopyItem]:
    """The ``bundle-import.pyz`` beside a tar or parts, to be copied pinned to the digest the
    archive's (signed) bundle.json gives it; any importer copy there that is not that file is
    refused before anything is written (importer/verify/importercopies.py). None for a folder."""
    beside_paths = opened.importers_beside()
    if not beside_paths:
        return None
    manifest = opened.manifest()
    pinned = pinned_importer(manifest.files)
    bad = importer_copy_problems(opened, pinned)
    if bad:
        raise VerificationFailed(
            f"copying {opened.path}: expected the importer beside it to be the one its bundle.json pins, found "
            f"{len(bad)} that differ(s)", bad, context="\n".join(str(p) for p in bad),
            hint=f"nothing was copied; delete the {IMPORTER_PYZ} beside the archive (do not run it), then copy again")
    beside = _optional(os.path.dirname(beside_paths[0]), IMPORTER_PYZ)
    if beside is not None and pinned is not None:
        beside.digest = pinned.digest  # copy_file refuses bytes that change on the way
    return beside


def plan_copy(src: str) -> Tuple[str, List[CopyItem], str]:
    """(kind, files in copy order, what to import at DST relative to it).

    SRC itself may be reached through a link (the user named it); nothing below it is: the bundle
    is opened with the shared opener (importer/input/opened.py, ``carrying``: a tar's or parts'
    files checked before a byte is read), and every file to copy is checked here, before anything
    is written, to be a regular file of the recorded size reached without following a link
    (importer.streams.fsutil.open_regular)."""
    opened = open_bundle(os.path.realpath(src), carrying="copying")
    files = opened.medium_files()  # the one that names the bundle last
    items = [CopyItem(m.path, m.rel, _probe(m.path, m.root, f"copying {m.rel}", m.size), m.digest, m.root)
             for m in files]
    beside = _checked_importer(opened)
    if beside is not None:
        items.insert(len(items) - 1, beside)
    return opened.kind, items, opened.medium_name()


def copy_bundle(src: str, dst: str, *, progress: Optional[Callable[[str, int], ProgressFn]] = None,
                bwlimit: Optional[int] = None, replace: bool = False) -> CopyResult:
    """Copy, resume, verify. Raises VerificationFailed if the copy does not verify, and only
    BundleError subclasses otherwise (an OSError at DST is UnwritableDestination). ``replace``
    (``--replace``): DST may hold another bundle (and nothing else), removed before the copy."""
    started = time.monotonic()
    kind, items, target = plan_copy(src)
    dst = os.path.abspath(dst)
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise UsageError(f"copying to {dst}: expected a folder, found a file")
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    if real_src == real_dst or os.path.dirname(real_src) == real_dst:
        raise UsageError(f"copying {src} to {dst}: expected another place, found the source itself")
    if items:  # FAT32 holds no file of 4 GiB or more: refused before the first byte is copied
        biggest = max(items, key=lambda i: i.size)
        check_fits(dst, biggest.rel, biggest.size, f"copying {src} to {dst}")
    replaced: List[str] = []
    try:
        check_destination(dst, items)
    except DestinationInUse:
        if not replace:
            raise
        replaced = replace_other_bundle(dst, items)
    result = CopyResult(src=os.path.abspath(src), dst=dst, kind=kind,
                        target=os.path.join(dst, target) if target else dst, replaced=replaced)
    on_bytes = progress("copy", sum(i.size for i in items)) if progress is not None else None
    throttle = _Throttle(bwlimit)
    try:
        os.makedirs(dst, exist_ok=True)
        for item in items:
            outcome, n = copy_file(item, dst, on_bytes=on_bytes, throttle=throttle)
            result.bytes_copied += n
            {"copied": result.copied, "resumed": result.resumed, "skipped": result.skipped}[outcome].append(item.rel)
    except OSError as e:  # the source side raises typed errors (open_regular): this is DST
        said = write_error(e, f"copying to {dst}", folder=None if e.filename else dst)
        raise UnwritableDestination(said.message, hint=f"{said.hint}; then run the copy again: it resumes") from None
    close_progress(on_bytes)
    report = verify_opened(open_bundle(result.target))
    result.verification = report
    result.seconds = time.monotonic() - started
    if not report.ok:
        raise VerificationFailed(
            f"verifying the copy {result.target}: expected every file to match, found {len(report.problems)} "
            "problem(s)", report.problems, context="\n".join(str(p) for p in report.problems[:50]),
            hint="the source itself may be damaged: verify it with bundle-import SRC --verify-only",
        )
    return result


def check_destination(dst: str, items: List[CopyItem]) -> None:
    """DST must be new, empty, or a copy of this same bundle, whole or partial: nothing in it but
    the files this copy writes (or their ``.partial`` files) and their folders, and its metadata
    files (bundle.json, index.json, oci-layout, SHA256SUMS, the parts index: all but blobs and
    parts), where present under their final name, the same bytes as the source's. Anything else
    (an unrelated folder, another bundle, an OCI layout) is refused before a byte is written."""
    if not os.path.isdir(dst):
        return
    files = {i.rel for i in items} | {i.rel + PARTIAL for i in items}
    folders = {"/".join(i.rel.split("/")[:n]) for i in items for n in range(1, i.rel.count("/") + 1)}
    foreign: List[str] = []
    for here, dirnames, filenames in os.walk(dst):  # links are listed, never followed
        prefix = os.path.relpath(here, dst).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        keep = []
        for name in sorted(dirnames):
            rel = prefix + name
            if rel not in folders:
                foreign.append(rel + "/")
            elif not os.path.islink(os.path.join(here, name)):  # a link there: refused by copy_file, unfollowed
                keep.append(name)
        dirnames[:] = keep
        foreign.extend(prefix + name for name in sorted(filenames) if prefix + name not in files)
        if len(foreign) > 3:
            break
    found = ""
    if foreign:
        found = f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, which this bundle does not hold"
    else:  # the metadata under its final name (an interrupted copy writes NAME.partial first) must be ours
        for item in items:
            at = os.path.join(dst, *item.rel.split("/"))
            small = item.size <= _METADATA_MAX and not item.rel.startswith("blobs/")
            if small and os.path.lexists(at) and not _same_or_not_a_file(at, item):
                found = f"another bundle or layout ({item.rel} differs from the source's)"
                break
    if found:
        dated = os.path.join(dst, time.strftime("%Y-%m-%d"))
        raise DestinationInUse(
            f"copying to {dst}: expected a new or empty folder, or a copy of this same bundle to resume, found {found}",
            hint=f"copy into a new folder, e.g. a dated one ({dated}); or, if {dst} holds only an earlier bundle "
            "you no longer need, pass --replace to remove it first; a copy never merges into other files")


def _bundle_files(dst: str) -> Optional[List[str]]:
    """The files of the one bundle DST holds (a bundle folder: everything in it; else each tar, parts
    index and its parts, the importer beside them and their ``.partial`` files), or None when DST
    holds anything else (a folder, another file): never removed by ``--replace``."""
    if os.path.isfile(os.path.join(dst, BUNDLE_JSON)) and not os.path.islink(os.path.join(dst, BUNDLE_JSON)):
        return [os.path.relpath(os.path.join(here, n), dst) for here, dirs, names in os.walk(dst)
                for n in [*names, *(d for d in dirs if os.path.islink(os.path.join(here, d)))]]
    names = sorted(os.listdir(dst))
    ours = set()
    for name in names:
        full = os.path.join(dst, name)
        if not name.endswith(PARTS_SUFFIX) or not stat.S_ISREG(os.lstat(full).st_mode):
            continue
        try:
            index = ArchiveReader(full).index
        except BundleError:
            return None
        if index is None:
            return None
        ours |= {name, index.archive_name, *(p.name for p in index.parts)}
    ours |= {n for n in names if n.endswith(".tar") and _bundle_tar(os.path.join(dst, n))} | {IMPORTER_PYZ}
    ours |= {n + PARTIAL for n in ours}
    for name in names:
        if name not in ours or not stat.S_ISREG(os.lstat(os.path.join(dst, name)).st_mode):
            return None
    return names


def _bundle_tar(path: str) -> bool:
    """Whether ``path`` is a bundle's tar: a regular file whose first member is bundle.json."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with tarfile.open(path, "r|") as tar:
            first = tar.next()
    except (OSError, tarfile.TarError):
        return False
    return first is not None and first.name == BUNDLE_JSON


def replace_other_bundle(dst: str, items: List[CopyItem]) -> List[str]:
    """``--replace``: remove the other bundle DST holds (:func:`_bundle_files`), then check DST again;
    the files removed. Anything else there is refused, nothing removed."""
    files = _bundle_files(dst)
    if not files:
        raise DestinationInUse(
            f"copying to {dst} with --replace: expected another bundle there (a bundle folder, or a tar or parts "
            "with their index and importer) and nothing else, found other files",
            hint="copy into a new folder (e.g. a dated one); --replace never removes what is not a bundle")
    if os.path.isfile(os.path.join(dst, BUNDLE_JSON)):
        for name in os.listdir(dst):
            full = os.path.join(dst, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
    else:
        for name in files:
            os.unlink(os.path.join(dst, name))
    fsync_dir(dst)
    check_destination(dst, items)
    return sorted(f.replace(os.sep, "/") for f in files)


def _same_or_not_a_file(path: str, item: CopyItem) -> bool:
    """Whether ``path`` holds ``item``'s bytes; a link or special file there counts as the same
    (copy_file replaces it without following it)."""
    if not stat.S_ISREG(os.lstat(path).st_mode):
        return True
    return _same(path, item)


def _digest_of(f: BinaryIO, size: int, path: str, what: str) -> Digest:
    h = hashlib.sha256()
    for data in read_exactly(f, size, path, what, chunk=CHUNK):
        h.update(data)
    return Digest("sha256", h.hexdigest())


def _source_digest(item: CopyItem) -> Digest:
    with item.open() as f:
        return _digest_of(f, item.size, item.src, f"copying {item.rel}")


def _same(path: str, item: CopyItem) -> bool:
    """Whether DST already holds the file: a regular file (not a link) of the right size and digest."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size != item.size:
        return False
    with open_regular(path, f"checking the copy of {item.rel}", item.size) as f:
        got = _digest_of(f, item.size, path, f"checking the copy of {item.rel}")
    return got == (item.digest if item.digest is not None else _source_digest(item))


def _dst_folders(dst_dir: str, rel: str) -> str:
    """Create the folders of DST/rel without following a link: a link or file in their place is refused."""
    here = dst_dir
    for name in rel.split("/")[:-1]:
        here = os.path.join(here, name)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            os.mkdir(here)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UnwritableDestination(f"copying {rel} to {dst_dir}: expected a folder at {here}, found "
                                        f"{describe_mode(st.st_mode)}", hint="remove it, or copy to an empty DST")
    return os.path.join(here, rel.split("/")[-1])


def _clear(path: str, rel: str) -> int:
    """The size of the regular file at ``path`` (0 if none); a link or special file there is removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    if stat.S_ISDIR(st.st_mode):
        raise UnwritableDestination(f"copying {rel}: expected a file or nothing at {path}, found a folder",
                                    hint="remove it, or copy to an empty DST")
    os.unlink(path)  # a link or special file: removes the name only, never what it points at
    return 0


def _open_partial(path: str, append: bool) -> BinaryIO:
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if append else os.O_TRUNC
    return os.fdopen(os.open(path, flags | getattr(os, "O_BINARY", 0), 0o644), "ab" if append else "wb")


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """An OSError in the block names ``path`` when it names no file (the source's reads raise typed errors)."""
    try:
        yield
    except OSError as e:
        name_write_error(e, path, any_errno=True)
        raise


def copy_file(item: CopyItem, dst_dir: str, *, on_bytes: Optional[ProgressFn] = None,
              throttle: Optional[Callable[[int], None]] = None) -> Tuple[str, int]:
    """("skipped"|"copied"|"resumed", bytes written) for one file.

    The source is opened with open_regular (a regular file of item.size bytes, no link followed)
    and never read past item.size + 1 bytes; the file appears under its final name only once
    its digest matched."""
    final = _dst_folders(dst_dir, item.rel)
    if _clear(final, item.rel) and _same(final, item):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(final + PARTIAL)  # left by a run killed after the rename's fsync
        if on_bytes is not None:
            on_bytes(item.size)
        return "skipped", 0
    partial = final + PARTIAL
    what = f"copying {item.rel}"
    for attempt in (1, 2):
        start = _clear(partial, item.rel)
        if start > item.size:
            os.unlink(partial)
            start = 0
        h = hashlib.sha256()
        written = 0
        with item.open() as f, _open_partial(partial, append=bool(start)) as out, _naming(partial):
            if start:
                with open_regular(partial, f"resuming {item.rel}", start) as prefix:  # what an earlier run wrote
                    for data in read_exactly(prefix, start, partial, f"resuming {item.rel}", chunk=CHUNK):
                        h.update(data)
                if on_bytes is not None:
                    on_bytes(start)
            f.seek(start)
            for data in read_exactly(f, item.size - start, item.src, what, chunk=CHUNK):
                out.write(data)
                h.update(data)
                written += len(data)
                if on_bytes is not None:
                    on_bytes(len(data))
                if throttle is not None:
                    throttle(len(data))
            out.flush()
            os.fsync(out.fileno())
        got = Digest("sha256", h.hexdigest())
        want = item.digest if item.digest is not None else (_source_digest(item) if start else got)
        if got == want:
            os.replace(partial, final)
            fsync_dir(os.path.dirname(final))
            return ("resumed" if start else "copied"), written
        with contextlib.suppress(OSError):
            os.unlink(partial)
        if attempt == 2 or not start:
            raise DigestMismatch(
                f"copying {item.rel}: expected {want}, found {got}",
                hint="the source is damaged (or changed during the copy): "
                "verify it with bundle-import SRC --verify-only",
            )
    raise AssertionError("unreachable")  # pragma: no cover
