"""pack_bundle(): a bundle folder as one uncompressed tar, or as parts of it no larger than SIZE.

Members: bundle.json, SHA256SUMS, bundle-import.pyz FIRST (the importer checks every later
member against bundle.json as it streams past), then the signature, oci-layout, index.json,
the manifests and configs, then the layers. Every file is hashed as it is packed and must match
bundle.json. With ``split`` the same byte stream is cut into ``FILE.tar.part000``... (each
written to a temp name, fsynced, renamed) and ``FILE.tar.parts.json`` is written last
(schemas/parts/parts-v1.schema.json). ``bundle-import.pyz`` is also written beside the archive,
so the far side can run the importer without unpacking anything."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, List, Optional

from importer import __version__
from importer.errors import (
    PLACE_ERRNOS,
    BundleError,
    DigestMismatch,
    ManifestError,
    SizeMismatch,
    UsageError,
    name_write_error,
    write_error,
)
from importer.format.digest import CHUNK, Digest
from importer.format.limits import read_limited
from importer.format.manifest import (
    BUNDLE_JSON,
    IMPORTER_PYZ,
    SIGNATURE_FILE,
    SUMS_FILE,
    BundleManifest,
    FileRecord,
)
from importer.input.archive import (
    PARTS_SUFFIX,
    PartRecord,
    PartsIndex,
    index_name,
    part_name,
)
from importer.input.opened import open_bundle
from importer.pipeline.preflight import InsufficientSpace, SpaceNeed, check_space, free_bytes
from importer.streams.fatfs import split_for
from importer.streams.fsutil import atomic_write_bytes, fsync_dir, open_regular
from importer.streams.hashlane import HashLane
from importer.streams.progress import close_progress
from importer.streams.readers import HashingReader
from importer.streams.tarout import begin_member, end_member, member_info, writing_tar

ProgressFn = Callable[[int], None]
MIN_PART = 64 * 1024
_DAMAGED = "the bundle folder is damaged; verify it (bundle-import DIR --verify-only) or re-export"


@dataclass
class PackResult:
    archive: str  # the tar, or the parts index
    parts: List[PartRecord]
    size: int
    digest: Digest
    importer: Optional[str]
    seconds: float
    members: int = 0
    importer_digest: Optional[Digest] = None  # the pyz beside the archive: its pinned digest
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "archive": self.archive,
            "size": self.size,
            "digest": str(self.digest),
            "parts": [p.to_dict() for p in self.parts],
            "importer": self.importer,
            "importerDigest": str(self.importer_digest) if self.importer_digest is not None else None,
            "members": self.members,
            "seconds": round(self.seconds, 3),
        }


class PartWriter:
    """A write-only stream cut into files of at most ``part_size`` bytes (one file when None),
    each hashed, fsynced and renamed into place when full; the whole stream is hashed too. The
    hashing runs on a thread of its own (importer/streams/hashlane.py; one file's digest is the
    whole's: no second hash), beside the reads, the writes and the member hashes; :attr:`parts` and
    :attr:`digest` are there once :meth:`finish` returned."""

    def __init__(self, archive: str, part_size: Optional[int]) -> None:
        self.directory = os.path.dirname(archive)
        self.name = os.path.basename(archive)
        self.part_size = part_size
        self.parts: List[PartRecord] = []
        self.written: List[str] = []
        self.total = 0
        self._hashes = HashLane("archive sha256", segments=bool(part_size))
        self._sizes: List[int] = []
        self._digest: Optional[Digest] = None
        self._f: Optional[BinaryIO] = None
        self._tmp = ""
        self._n = 0

    def _open(self) -> None:
        fd, self._tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        self._f = os.fdopen(fd, "wb")
        self._n = 0

    @property
    def current(self) -> str:
        """The file being written, under the name it gets when whole."""
        name = part_name(self.name, len(self.written)) if self.part_size else self.name
        return os.path.join(self.directory, name)

    def _close_part(self) -> None:
        assert self._f is not None
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self._f = None
        os.chmod(self._tmp, 0o644)
        final = part_name(self.name, len(self.written)) if self.part_size else self.name
        os.replace(self._tmp, os.path.join(self.directory, final))
        self.written.append(final)
        self._sizes.append(self._n)
        self._hashes.cut()

    def write(self, data: Any) -> int:
        try:
            return self._write(data)
        except OSError as e:  # write() names no file: the part (or tar) being written
            name_write_error(e, self.current, any_errno=True)
            raise

    def _write(self, data: Any) -> int:
        view = memoryview(data)
        size = len(view)
        while len(view):
            if self._f is None:
                self._open()
            assert self._f is not None
            room = (self.part_size - self._n) if self.part_size else len(view)
            chunk = view[:room]
            self._f.write(chunk)
            self._hashes.update(chunk)
            self._n += len(chunk)
            self.total += len(chunk)
            view = view[len(chunk):]
            if self.part_size and self._n >= self.part_size:
                self._close_part()
        return size

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def finish(self) -> None:
        try:
            if self._f is not None or not self.written:
                if self._f is None:
                    self._open()
                self._close_part()
        except OSError as e:
            name_write_error(e, self.current, any_errno=True)
            raise
        whole, digests = self._hashes.close()
        self._digest = Digest("sha256", whole)
        digests = digests if self.part_size else [whole]
        self.parts = [PartRecord(name, n, Digest("sha256", hexdigest))
                      for name, n, hexdigest in zip(self.written, self._sizes, digests)]
        fsync_dir(self.directory)

    def abort(self) -> None:
        self._hashes.stop()
        if self._f is not None:
            self._f.close()
            self._f = None
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
        for name in self.written:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, name))

    @property
    def digest(self) -> Digest:
        """The whole stream's sha256 (once :meth:`finish` returned)."""
        assert self._digest is not None, "PartWriter.digest before finish()"
        return self._digest


def member_order(manifest: BundleManifest, src: str) -> List[str]:
    """bundle.json, SHA256SUMS, the importer first; then the small documents; then the layers."""
    first = [BUNDLE_JSON, SUMS_FILE]
    if manifest.importer is not None:
        first.append(manifest.importer.path)
    if os.path.lexists(os.path.join(src, SIGNATURE_FILE)):  # a link or special file: refused when opened
        first.append(SIGNATURE_FILE)
    small = ["oci-layout", "index.json"]
    for image in manifest.images:
        small += [image.manifest.digest.blob_path, image.config.digest.blob_path]
    pinned = {f.path for f in manifest.files}  # sets: a folder of thousands of files was O(n^2) here
    order: List[str] = []
    seen = set()
    for path in first + small + sorted(pinned):
        if path not in seen and (path in first or path in pinned):
            seen.add(path)
            order.append(path)
    return order


def _open_member(src: str, rel: str) -> BinaryIO:
    """A file of the bundle folder, opened only when it is a regular file reached through no link
    (lstat first, O_NOFOLLOW|O_NONBLOCK, fstat after: importer/streams/fsutil.py open_regular)."""
    return open_regular(os.path.join(src, rel), f"packing {rel}", root=src)


def _regular_size(src: str, rel: str) -> int:
    with _open_member(src, rel) as f:
        return os.fstat(f.fileno()).st_size


def _read_member(src: str, rel: str, limit: int) -> bytes:
    with _open_member(src, rel) as f:
        return read_limited(f, limit, rel)


def _stale_outputs(archive: str) -> List[str]:
    directory, name = os.path.dirname(archive), os.path.basename(archive)
    pattern = re.compile(re.escape(name) + r"\.part[0-9]{3,}$")
    found = [os.path.join(directory, n) for n in os.listdir(directory) if pattern.match(n)]
    for extra in (archive, archive + PARTS_SUFFIX):
        if os.path.lexists(extra):
            found.append(extra)
    return sorted(found)


def check_archive_target(archive: str, *, split: Optional[int] = None, force: bool = False) -> List[str]:
    """What ``pack_bundle`` would refuse about ``archive``, said before any work (``bundle export
    --archive`` checks it before the first byte is exported): a folder there, parts too small, an
    earlier archive or parts without ``--force``. Returns the earlier outputs ``--force`` replaces."""
    archive = os.path.abspath(archive)
    if split is not None and split < MIN_PART:
        raise UsageError(f"splitting: expected parts of at least {MIN_PART} bytes, found {split}",
                         hint="give a size with a unit, e.g. --split 3900M for FAT32")
    if os.path.isdir(archive):
        raise UsageError(f"packing into {archive}: expected a file name (FILE.tar), found a folder")
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    stale = _stale_outputs(archive)
    if stale and not force:
        raise UsageError(f"packing into {archive}: expected no earlier archive or parts there, found "
                         f"{len(stale)} ({os.path.basename(stale[0])}...)",
                         hint="choose another name, or pass --force to replace them (stale parts are removed)")
    return stale


def pack_bundle(src: str, archive: str, *, split: Optional[int] = None, force: bool = False,
                consume: bool = False, progress: Optional[Callable[[str, int], ProgressFn]] = None) -> PackResult:
    """Pack the bundle folder ``src`` into ``archive`` (or its parts). ``consume``: delete each
    packed blob from ``src`` right after it is in the archive (export --archive without -o)."""
    started = time.monotonic()
    src = os.path.abspath(src)
    archive = os.path.abspath(archive)
    split, fat_note = split_for(archive, split)  # FAT32: no file of 4 GiB or more, so parts
    stale = check_archive_target(archive, split=split, force=force)
    if not os.path.lexists(os.path.join(src, BUNDLE_JSON)):
        raise ManifestError(f"packing {src}: expected a bundle folder holding {BUNDLE_JSON}, found none",
                            hint="pass the folder `bundle export -o DIR` wrote")
    # the shared opener (a link, FIFO or device is refused, never opened or followed): bundle.json read and
    # parsed once; its signature is packed as one more file
    opened = open_bundle(src, carrying="packing")
    raw_bj = opened.raw_bundle_json
    manifest = opened.manifest()
    pins: Dict[str, FileRecord] = {f.path: f for f in manifest.files}
    order = member_order(manifest, src)
    total = sum(_regular_size(src, p) for p in order)
    # export --archive (consume): each blob leaves the staging folder once packed, so its peak counts
    check_pack_space(archive, consumed_peak(src, archive, order, total) if consume else total, len(order),
                     manifest, stale, consuming=consume)
    for path in stale:
        os.unlink(path)
    on_bytes = progress("pack", total) if progress is not None else None
    writer = PartWriter(archive, split)
    try:
        res = _pack(src, archive, split, consume, order, pins, raw_bj, manifest, writer, on_bytes, started)
        res.notes += [fat_note] if fat_note else []
        return res
    except OSError as e:
        failed = pack_write_error(e, archive)
        if failed is None:
            raise
        raise failed from e


def _pack(src: str, archive: str, split: Optional[int], consume: bool, order: List[str],
          pins: Dict[str, FileRecord], raw_bj: bytes, manifest: BundleManifest, writer: PartWriter,
          on_bytes: Optional[ProgressFn], started: float) -> PackResult:
    """Write the tar or parts, the importer beside them and the parts index; on any failure what
    this run wrote is removed (nothing under the archive's name, no temp file)."""
    beside: Optional[str] = None
    try:
        # the tar written straight into the parts (importer/streams/tarout.py): tarfile's stream mode
        # copied every byte through a buffer of its own three times (the pack was CPU-bound at ~5x cp)
        with writing_tar(writer) as tar:  # type: ignore[arg-type]
            for rel in order:
                full = os.path.join(src, rel)
                f = _open_member(src, rel)
                size = os.fstat(f.fileno()).st_size
                info = member_info(rel, size)
                info.mode = 0o755 if rel == IMPORTER_PYZ else 0o644
                with f:
                    hashing = HashingReader(f, on_bytes)
                    begin_member(tar, rel, size, info=info)
                    _copy_member(rel, hashing, tar, size)
                    end_member(tar, size)
                _check_pin(rel, pins.get(rel), hashing, raw_bj if rel == BUNDLE_JSON else None)
                if consume and rel.startswith("blobs/"):
                    os.unlink(full)
        writer.finish()
        close_progress(on_bytes)
        importer_rec = manifest.importer
        if importer_rec is not None:
            pyz = _read_member(src, importer_rec.path, 256 * 1024 * 1024) \
                if os.path.lexists(os.path.join(src, importer_rec.path)) else None
            if pyz is not None and Digest.of_bytes(pyz) == importer_rec.digest:
                beside = os.path.join(os.path.dirname(archive), IMPORTER_PYZ)
                atomic_write_bytes(beside, pyz, mode=0o755)
        result_path = archive
        if split:
            index = PartsIndex(
                schema_version="1.0", archive_name=os.path.basename(archive), size=writer.total, digest=writer.digest,
                part_size=split, parts=tuple(writer.parts),
                created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                tool_version=__version__, bundle_digest=Digest.of_bytes(raw_bj),
                importer=(FileRecord(IMPORTER_PYZ, importer_rec.digest, importer_rec.size)
                          if beside and importer_rec else None),
            )
            result_path = os.path.join(os.path.dirname(archive), index_name(os.path.basename(archive)))
            atomic_write_bytes(result_path, (json.dumps(index.to_dict(), indent=2) + "\n").encode("utf-8"))
        fsync_dir(os.path.dirname(archive))
    except BaseException:
        writer.abort()
        if beside is not None:  # written by this run for an archive that is not there
            with contextlib.suppress(OSError):
                os.unlink(beside)
        raise
    return PackResult(result_path, list(writer.parts) if split else [], writer.total, writer.digest, beside,
                      time.monotonic() - started, members=len(order),
                      importer_digest=importer_rec.digest if beside and importer_rec else None)


def consumed_peak(src: str, archive: str, order: List[str], total: int) -> int:
    """The most that packing ``src`` into ``archive`` while deleting each packed blob (export --archive)
    adds on the archive's file system: the documents and the importer, then every blob once more
    until it is packed and deleted: the largest. On another file system (FAT: staged in TMPDIR)
    nothing is freed there: all of ``total``."""
    try:
        if os.stat(src).st_dev != os.stat(os.path.dirname(archive)).st_dev:
            return total
    except OSError:
        return total
    blobs = [_regular_size(src, p) for p in order if p.startswith("blobs/")]
    return total - sum(blobs) + max(blobs, default=0)


def check_pack_space(archive: str, total: int, members: int, manifest: BundleManifest, stale: List[str], *,
                     consuming: bool = False) -> None:
    """Free space for the tar (or parts) before the first byte: the members, their tar headers and the
    importer beside it, less what the earlier outputs ``--force`` replaces hold (removed first), as
    the import preflight measures it (importer/pipeline/preflight.py). ``consuming`` (export
    --archive): ``total`` is :func:`consumed_peak`, and the staging folder is removed on a refusal."""
    directory = os.path.dirname(archive)
    dev, _ = free_bytes(directory)
    freed = 0
    for path in stale:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            freed += st.st_size if st.st_dev == dev else 0
    pyz = manifest.importer.size if manifest.importer is not None else 0
    need = total + members * 3 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE + pyz + 64 * 1024
    check = check_space([SpaceNeed(directory, f"the archive {os.path.basename(archive)}: {members} file(s), "
                                   f"the importer beside it", max(0, need - freed))])[0]
    if not check.ok:
        raise InsufficientSpace(
            f"packing into {archive}: expected enough free space for the archive, found too little on {check.text()}"
            + (f" (the {len(stale)} earlier output(s) --force replaces counted as free)" if stale else ""),
            hint="nothing was written; free space there or pack onto a larger disk" if not consuming else
            "the exported bundle was removed, no archive written: packing it beside its staging folder needs its "
            "largest blob's size once more; free space there, or export -o to a larger disk and `bundle pack "
            "--split` onto this one")


def pack_write_error(err: OSError, archive: str) -> Optional[BundleError]:
    """A write of the archive, a part, the importer beside it or the parts index that failed,
    naming the file, the folder and the space left there; None for other errors."""
    directory = os.path.dirname(archive)
    path = err.filename if isinstance(err.filename, str) else None
    if err.errno not in PLACE_ERRNOS or path is None or os.path.dirname(os.path.abspath(path)) != directory:
        return None
    return write_error(err, f"packing into {archive}", path, directory,
                       note=f"what this run wrote was removed: nothing is left under {os.path.basename(archive)}")


def _copy_member(rel: str, hashing: HashingReader, tar: tarfile.TarFile, size: int) -> None:
    """The member's ``size`` bytes, as read (hashed on the way), into the tar; a file that ends
    early (changed while packed) is refused, and the tar with it."""
    out = tar.fileobj
    assert out is not None
    left = size
    while left:
        data = hashing.read(min(CHUNK, left))
        if not data:
            raise SizeMismatch(f"packing {rel}: expected {size} bytes, found {size - left}: it changed while it "
                               "was being packed", hint=_DAMAGED)
        out.write(data)
        left -= len(data)


def _check_pin(rel: str, pin: Optional[FileRecord], hashing: HashingReader, raw_bj: Optional[bytes]) -> None:
    got = hashing.digest()
    if raw_bj is not None and got != Digest.of_bytes(raw_bj):
        raise DigestMismatch(f"packing {BUNDLE_JSON}: it changed while it was being packed")
    if pin is None:
        return
    if hashing.count != pin.size:
        raise SizeMismatch(f"packing {rel}: expected {pin.size} bytes, found {hashing.count}", hint=_DAMAGED)
    if got != pin.digest:
        raise DigestMismatch(f"packing {rel}: expected {pin.digest}, found {got}", hint=_DAMAGED)
