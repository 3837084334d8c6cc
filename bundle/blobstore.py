"""The bundle's content-addressed blob store (``blobs/sha256/<hex>``).

:meth:`BlobStore.write_layer` reads an uncompressed layer once and, in that one pass, computes
its diff_id and size, compresses it (zstd on all cores, or gzip) and hashes the compressed
bytes; the blob lands under its digest by temp-file-then-rename."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional

import zstandard

from importer.format.digest import CHUNK, Digest
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD
from importer.input.cudascan import CudaScan
from importer.streams.readers import HashingWriter

ProgressFn = Callable[[int], None]

MEDIA_TYPES = {"zstd": OCI_LAYER_ZSTD, "gzip": OCI_LAYER_GZIP, "none": OCI_LAYER_TAR}
DEFAULT_LEVELS = {"zstd": 3, "gzip": 6, "none": 0}


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
        self.written: dict[str, WrittenBlob] = {}
        # --compression zstd|gzip asked explicitly: a layer the source keeps compressed otherwise is
        # recompressed to it (its digest, so the image's manifest, changes); None (auto): as stored
        self.recompress_to: str | None = None
        self.recompressed: list[str] = []  # what was recompressed, for the notice
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
        try:
            with os.fdopen(fd, "wb") as f:
                yield f, tmp
                f.flush()
                os.fchmod(f.fileno(), 0o644)
                if self.fsync:
                    os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
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

    def write_layer(
        self,
        src: Any,
        *,
        compression: str = "zstd",
        level: Optional[int] = None,
        threads: int = -1,
        on_bytes: Optional[ProgressFn] = None,
    ) -> LayerRecord:
        """Read the uncompressed layer ``src`` to its end once; store it compressed."""
        level = DEFAULT_LEVELS[compression] if level is None else level
        raw_hash = hashlib.sha256()
        scan = CudaScan()
        usize = 0
        with self.temp() as (f, tmp):
            out = HashingWriter(f)
            sink: Any
            if compression == "zstd":
                cctx = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)
                sink = cctx.stream_writer(out, closefd=False, write_size=CHUNK)  # type: ignore[arg-type]
            elif compression == "gzip":
                sink = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=level, mtime=0)
            else:
                sink = contextlib.nullcontext(out)
            with sink as w:
                while True:
                    chunk = src.read(CHUNK)
                    if not chunk:
                        break
                    raw_hash.update(chunk)
                    scan.feed(chunk)
                    usize += len(chunk)
                    w.write(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
            digest = Digest("sha256", out.hasher.hexdigest())
            size = out.count
        blob = self.commit(tmp, digest, size)
        diff_id = Digest("sha256", raw_hash.hexdigest())
        self.noted(diff_id, scan)
        return LayerRecord(
            media_type=MEDIA_TYPES[compression],
            digest=blob.digest,
            size=blob.size,
            diff_id=diff_id,
            uncompressed_size=usize,
        )
