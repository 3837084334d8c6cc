"""The bundle's content-addressed blob store (``blobs/sha256/<hex>``).

:meth:`BlobStore.write_layer` reads an uncompressed layer once and, in that one pass, computes
its diff_id and size, compresses it (zstd on all cores, or gzip) and hashes the compressed
bytes; the blob lands under its digest by temp-file-then-rename.

With ``adaptive`` (``--compression auto``, the default) a layer whose first bytes do not compress
(random weights, already-compressed archives: zstd level 1 saves under 10% of a sample of up to
:data:`SAMPLE` bytes) is stored uncompressed (``application/vnd.oci.image.layer.v1.tar``, which
every bundle reader accepts): no compression work, and one hash, since its digest is its diff_id.

The head alone does not decide it: while such a layer is stored, a slice of every chunk
(:data:`PROBE` of each CHUNK, about 1/8 of the bytes) is compressed at zstd level 1 and the
layer's compressed size estimated from them. Once the bytes stored exceed :data:`SWITCH_ABOVE`
times that estimate (a layer whose tar starts with a few MiB of random bytes and goes on with
ordinary libraries), the store switches to compressing: the part already stored is read back from
its temp file through the compressor, the rest of the stream follows, and the layer lands
compressed. So the default bundle stays within about 1.1x of ``--compression zstd`` on every
layer, and a truly incompressible layer costs the probes only."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import zstandard

from importer.errors import name_write_error
from importer.format.digest import CHUNK, Digest
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD
from importer.input.cudascan import CudaScan
from importer.streams.fatfs import check_fits, is_fat
from importer.streams.readers import HashingWriter

ProgressFn = Callable[[int], None]

MEDIA_TYPES = {"zstd": OCI_LAYER_ZSTD, "gzip": OCI_LAYER_GZIP, "none": OCI_LAYER_TAR}
DEFAULT_LEVELS = {"zstd": 3, "gzip": 6, "none": 0}
#: how much of a layer's start ``adaptive`` judges (held in memory while judged)
SAMPLE = 4 * CHUNK
#: a layer is stored uncompressed when zstd level 1 leaves more than this share of the sample
STORE_ABOVE = 0.90
#: past the sample, the slice of each chunk of a stored layer that is compressed to judge it
PROBE = 128 * 1024
#: a stored layer switches to compression once its bytes exceed this many times the estimate of
#: their compressed size (level-1 probes overestimate what level 3 writes: margin under 1.15)
SWITCH_ABOVE = 1.08


def compresses(sample: bytes) -> bool:
    """Whether zstd level 1 saves at least 10% of ``sample`` (an empty sample: yes, it costs nothing)."""
    if not sample:
        return True
    return len(zstandard.ZstdCompressor(level=1).compress(sample)) <= STORE_ABOVE * len(sample)


def _reader(src: Any) -> Callable[[int], bytes]:
    """``src.read1`` where it has one (hands on what its source read: no join, no copy), else ``read``."""
    return getattr(src, "read1", None) or src.read  # type: ignore[no-any-return]


def _sample(src: Any) -> list[bytes]:
    """Up to :data:`SAMPLE` bytes read from ``src``, as read (reads of up to CHUNK)."""
    read = _reader(src)
    chunks: list[bytes] = []
    got = 0
    while got < SAMPLE:
        chunk = read(min(CHUNK, SAMPLE - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks


@dataclass(frozen=True)
class WrittenBlob:
    digest: Digest
    size: int


class BlobStore:
    def __init__(self, root: str, *, fsync: bool = True) -> None:
        self.root = root
        self.dir = os.path.join(root, "blobs", "sha256")
        os.makedirs(self.dir, exist_ok=True)
        self.fsync = fsync
        self.fat = is_fat(root)  # FAT32: a blob of 4 GiB or more is refused (importer/streams/fatfs.py)
        self.written: dict[str, WrittenBlob] = {}
        # --compression zstd|gzip asked explicitly: a layer the source keeps compressed otherwise is
        # recompressed to it (its digest, so the image's manifest, changes); None (auto): as stored
        self.recompress_to: str | None = None
        self.recompressed: list[str] = []  # what was recompressed, for the notice
        #: --compression auto: a layer that does not compress is stored uncompressed (write_layer)
        self.adaptive = False
        self.stored: list[str] = []  # diff_ids of the layers stored uncompressed by ``adaptive``
        #: diff_id -> (compat library versions, torch's CUDA) each layer showed in its one pass
        #: (importer/input/cudascan.py; the image's CUDA needs, docs/gpu-fit.md)
        self.layer_cuda: dict[str, tuple[tuple[str, ...], Optional[str]]] = {}

    def noted(self, diff_id: Digest, scan: CudaScan) -> None:
        """Remember what a layer showed of CUDA (nothing when it showed nothing)."""
        libs, torch = scan.result()
        if libs or torch:
            self.layer_cuda[str(diff_id)] = (libs, torch)

    def path_of(self, digest: Digest) -> str:
        return os.path.join(self.root, digest.blob_path)

    def commit(self, tmp: str, digest: Digest, size: int) -> WrittenBlob:
        final = self.path_of(digest)
        if self.fat:
            try:
                check_fits(self.root, digest.blob_path, size, "exporting")
            except BaseException:
                os.unlink(tmp)
                raise
        if os.path.exists(final):
            os.unlink(tmp)
        else:
            os.replace(tmp, final)
        blob = WrittenBlob(digest, size)
        self.written[digest.blob_path] = blob
        return blob

    @contextlib.contextmanager
    def temp(self) -> Any:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
        done = False
        try:
            with os.fdopen(fd, "wb") as f:
                yield f, tmp
                done = True
                f.flush()
                os.fchmod(f.fileno(), 0o644)
                if self.fsync:
                    os.fsync(f.fileno())
        except BaseException as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if isinstance(e, OSError):  # write() names no file: an out-of-space error names the blob's
                name_write_error(e, tmp, any_errno=done)
            raise

    def discard(self, digest: Digest) -> None:
        """Forget a blob written by this store (a layer the delta leaves out)."""
        if self.written.pop(digest.blob_path, None) is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path_of(digest))

    def write_bytes(self, data: bytes) -> WrittenBlob:
        """Store a small blob (manifest, config) byte-for-byte."""
        digest = Digest.of_bytes(data)
        with self.temp() as (f, tmp):
            f.write(data)
        return self.commit(tmp, digest, len(data))

    def write_raw(self, src: Any, *, on_bytes: Optional[ProgressFn] = None) -> WrittenBlob:
        """Store the bytes of the open file ``src`` as they are (a file carried as a raw layer,
        schema 3.6): read once, hashed while copied, landed under its digest (temp, then rename)."""
        hasher = hashlib.sha256()
        size = 0
        with self.temp() as (f, tmp):
            for chunk in iter(lambda: src.read(CHUNK), b""):
                hasher.update(chunk)
                f.write(chunk)
                size += len(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        return self.commit(tmp, Digest("sha256", hasher.hexdigest()), size)

    def write_layer(
        self,
        src: Any,
        *,
        compression: str = "zstd",
        level: Optional[int] = None,
        threads: int = -1,
        on_bytes: Optional[ProgressFn] = None,
    ) -> LayerRecord:
        """Read the uncompressed layer ``src`` to its end once; store it compressed (or, with
        :attr:`adaptive`, uncompressed while it does not compress: :class:`_Probe`)."""
        head: list[bytes] = []
        probe: Optional[_Probe] = None
        if self.adaptive and compression != "none":
            head = _sample(src)
            sample = b"".join(head)
            if not compresses(sample):
                probe = _Probe(sample)
            del sample
        level = DEFAULT_LEVELS[compression] if level is None else level
        raw_hash = hashlib.sha256()
        scan = CudaScan()
        seen = _Seen()
        counted = _counting(_chained(head, src), raw_hash, scan, seen, on_bytes)
        switched = False
        stored = ""  # the temp file of a layer stored while it does not compress
        tmp = ""
        stores = probe is not None or compression == "none"  # digest == diff_id: one hash, no compression work
        try:
            if stores:
                with self.temp() as (f, stored):
                    for chunk in counted:
                        f.write(chunk)
                        if probe is not None and probe.worth_compressing(chunk):
                            switched = True
                            break
                tmp, digest, size, media_type = stored, Digest("sha256", raw_hash.hexdigest()), seen.n, OCI_LAYER_TAR
            if switched or not stores:
                with self.temp() as (out_file, tmp):
                    out = HashingWriter(out_file)
                    with _compressor(compression, level, threads, out) as w:
                        if switched:  # what was stored so far, read back through the compressor
                            with open(stored, "rb") as again:
                                for chunk in iter(lambda: again.read(CHUNK), b""):
                                    w.write(chunk)
                        for chunk in counted:
                            w.write(chunk)
                digest, size, media_type = Digest("sha256", out.hasher.hexdigest()), out.count, MEDIA_TYPES[compression]
        finally:
            if switched:  # compressed from it, or failed while doing so: never left behind
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stored)
        blob = self.commit(tmp, digest, size)
        diff_id = Digest("sha256", raw_hash.hexdigest())
        self.noted(diff_id, scan)
        if probe is not None and not switched:
            self.stored.append(str(diff_id))
        return LayerRecord(
            media_type=media_type,
            digest=blob.digest,
            size=blob.size,
            diff_id=diff_id,
            uncompressed_size=seen.n,
        )


class _Probe:
    """``--compression auto`` on a layer whose sample did not compress: the estimate of its
    compressed size, from the sample and a :data:`PROBE` slice of every later chunk."""

    def __init__(self, sample: bytes) -> None:
        self.cctx = zstandard.ZstdCompressor(level=1)
        self.raw = len(sample)
        self.estimate = float(len(self.cctx.compress(sample))) if sample else 0.0
        self.skip = len(sample)  # the sample's chunks come through first: judged already

    def worth_compressing(self, chunk: bytes) -> bool:
        """Count ``chunk``; True once the bytes seen exceed SWITCH_ABOVE times the estimate of
        their compressed size."""
        if self.skip > 0:
            self.skip -= len(chunk)
            return False
        part = chunk[:PROBE]
        ratio = len(self.cctx.compress(part)) / len(part) if part else 1.0
        self.raw += len(chunk)
        self.estimate += ratio * len(chunk)
        return self.raw > SWITCH_ABOVE * self.estimate


def _compressor(compression: str, level: int, threads: int, out: HashingWriter) -> Any:
    """A writer that compresses into ``out`` (zstd on ``threads``, or gzip with no name, mtime 0)."""
    if compression == "zstd":
        cctx = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)
        return cctx.stream_writer(out, closefd=False, write_size=CHUNK)  # type: ignore[arg-type]
    return gzip.GzipFile(fileobj=out, mode="wb", compresslevel=level, mtime=0)


class _Seen:
    """How many uncompressed bytes went by."""

    n = 0


def _counting(chunks: Iterator[bytes], raw_hash: Any, scan: CudaScan, seen: _Seen,
              on_bytes: Optional[ProgressFn]) -> Iterator[bytes]:
    """``chunks`` as they are, each hashed (the diff_id), scanned (CUDA), counted and reported once,
    whichever way the layer is stored."""
    for chunk in chunks:
        raw_hash.update(chunk)
        scan.feed(chunk)
        seen.n += len(chunk)
        if on_bytes is not None:
            on_bytes(len(chunk))
        yield chunk


def _chained(head: list[bytes], src: Any) -> Iterator[bytes]:
    """The sampled chunks, then the rest of ``src`` in CHUNK reads."""
    yield from head
    head.clear()  # the sample is not held while the rest streams
    read = _reader(src)
    while True:
        chunk = read(CHUNK)
        if not chunk:
            return
        yield chunk
