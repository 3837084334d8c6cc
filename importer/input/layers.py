"""Reading layer blobs: one pass that checks the compressed digest, decompresses within the
recorded bound and checks the diff_id."""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
import zlib
from typing import Any, BinaryIO, Callable, Iterator, List, Optional, Tuple, Type

from importer.errors import (
    BundleError,
    DecompressFailed,
    DiffIDMismatch,
    DigestMismatch,
    SizeMismatch,
)
from importer.format.digest import CHUNK, Digest
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import compression_of
from importer.input.opened import BundleRoot, open_bundle_file
from importer.streams.compression import _zstd_module, open_decompressed
from importer.streams.readers import HashingReader, Readable


def decompress_errors() -> Tuple[Type[BaseException], ...]:
    """Exception types that decompressors raise on damaged input."""
    errors: List[Type[BaseException]] = [OSError, EOFError, zlib.error, ValueError]
    mod = _zstd_module()
    err = getattr(mod, "ZstdError", None) if mod is not None else None
    if isinstance(err, type) and issubclass(err, BaseException):
        errors.append(err)
    return tuple(errors)


_DECOMPRESS_ERRORS = decompress_errors()


class LayerReader:
    """Decompressed bytes of one layer blob. Call :meth:`finish` after the last read: it
    drains the rest, then raises if the blob's digest/size or the diff_id/size differ."""

    def __init__(self, raw: HashingReader, plain: Any, layer: LayerRecord, what: str) -> None:
        self._raw = raw
        self._plain = plain
        self._h = hashlib.sha256()
        self._n = 0
        self.layer = layer
        self.what = what
        # a layer stored uncompressed: its bytes are the blob's, hashed once (by ``raw``) for both
        # the digest and the diff_id; not where ``raw`` only counts (layercheck hashes elsewhere)
        self._same_bytes = compression_of(layer.media_type) == "none" and raw.hashes

    def read(self, n: int = -1) -> bytes:
        try:
            data: bytes = self._plain.read(n if n and n > 0 else CHUNK)
        except BundleError:
            raise
        except _DECOMPRESS_ERRORS as e:
            layer = self.layer
            raise DecompressFailed(
                f"decompressing {self.what} ({layer.digest}): expected a valid "
                f"{compression_of(layer.media_type)} stream, found damaged data ({e})",
                hint="the blob was modified or damaged in transit; re-copy the bundle",
            ) from e
        if data:
            if not self._same_bytes:
                self._h.update(data)
            self._n += len(data)
        return data

    def finish(self) -> None:
        while self.read(CHUNK):
            pass
        while self._raw.read(CHUNK):
            pass
        layer = self.layer
        if self._raw.count != layer.size:
            raise SizeMismatch(
                f"checking {self.what} ({layer.digest}): expected {layer.size} bytes, found {self._raw.count}",
                hint="the blob was truncated or extended in transit; re-copy the bundle",
            )
        got = self._raw.digest()
        if got != layer.digest:
            raise DigestMismatch(
                f"checking {self.what}: expected digest {layer.digest}, found {got}",
                hint="the blob was modified or damaged in transit; re-copy the bundle",
            )
        if self._n != layer.uncompressed_size:
            raise SizeMismatch(
                f"decompressing {self.what} ({layer.digest}): expected {layer.uncompressed_size} "
                f"uncompressed bytes, found {self._n}",
                hint="bundle.json and the layer disagree; re-export the bundle",
            )
        diff_id = got if self._same_bytes else Digest("sha256", self._h.hexdigest())
        if diff_id != layer.diff_id:
            raise DiffIDMismatch(
                f"decompressing {self.what} ({layer.digest}): expected diff_id {layer.diff_id}, found {diff_id}",
                hint="bundle.json and the layer disagree; re-export the bundle",
            )


class ChunkCursor:
    """The place in the chunk a reader is handing out, chunk by chunk from a queue another thread
    fills: :class:`ReadAhead` here and ``layercheck``'s checking thread share it."""

    _item: bytes = b""
    _pos: int = 0
    _queue: queue.Queue[Optional[bytes]]
    _ended: bool = False
    _error: Optional[BaseException] = None

    def _read_queued(self, n: Optional[int]) -> bytes:
        """Up to ``n`` bytes: the next chunk taken from the queue (None: the filling thread ended;
        what it raised is raised here, in the reader's thread) when the current one is handed out."""
        if self._pos >= len(self._item) and not self._ended:
            item = self._queue.get()
            if item is None:
                self._ended = True
                self._item, self._pos = b"", 0
                if self._error is not None:
                    raise self._error
            else:
                self._item, self._pos = item, 0
        return self._take(n)

    def _take(self, n: Optional[int]) -> bytes:
        """Up to ``n`` bytes of the current chunk: the chunk itself when all of it is asked for."""
        item, pos = self._item, self._pos
        if pos == 0 and (n is None or n < 0 or n >= len(item)):
            self._pos = len(item)
            return item
        end = len(item) if n is None or n < 0 else min(len(item), pos + n)
        self._pos = end
        return item[pos:end]


class ReadAhead(HashingReader, ChunkCursor):
    """A :class:`HashingReader` whose reading and hashing run in a thread of its own, up to
    ``depth`` chunks ahead of the consumer (a bounded queue: flat memory), so the blob's sha256
    overlaps the decompression and hashing of what the consumer already has (hashlib and file
    reads release the GIL). :meth:`stop` ends the thread early (the consumer failed)."""

    def __init__(self, raw: Readable, depth: int = 4) -> None:
        super().__init__(raw)
        self._queue: queue.Queue[Optional[bytes]] = queue.Queue(maxsize=depth)
        self._item = b""
        self._pos = 0
        self._ended = False
        self._error: Optional[BaseException] = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="layer read-ahead", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            while not self._stopping.is_set():
                data = bytes(self._raw.read(CHUNK))
                if not data:
                    break
                self.hasher.update(data)
                self.count += len(data)
                self._queue.put(data)
        except BaseException as e:  # raised by the consumer's next read
            self._error = e
        finally:
            self._queue.put(None)

    def read(self, n: Optional[int] = -1) -> bytes:
        return self._read_queued(n)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def stop(self) -> None:
        """End the thread (taking what it queued, so it never blocks) and wait for it."""
        self._stopping.set()
        while not self._ended:
            if self._queue.get() is None:
                self._ended = True
        self._thread.join()


@contextlib.contextmanager
def open_layer(root: BundleRoot, layer: LayerRecord, what: str, *, read_ahead: bool = False) -> Iterator[LayerReader]:
    """Open a layer blob of the bundle at ``root`` (a folder, or a tar / parts read in place)
    for a verified, decompressing read. ``read_ahead``: the blob is read and hashed by a thread
    of its own (:class:`ReadAhead`), beside the decompression."""
    with open_bundle_file(root, layer.digest.blob_path) as f:
        with contextlib.suppress(AttributeError, OSError):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        raw = ReadAhead(f) if read_ahead else HashingReader(f)
        try:
            with open_decompressed(
                raw, compression_of(layer.media_type), bound=layer.uncompressed_size, what=what
            ) as plain:
                yield LayerReader(raw, plain, layer, what)
        finally:
            if isinstance(raw, ReadAhead):
                raw.stop()


def check_layer(root: BundleRoot, layer: LayerRecord, what: str) -> None:
    """Read a whole layer blob once; raise the first problem found."""
    with open_layer(root, layer, what) as reader:
        reader.finish()


def copy_stream(src: Any, dst: BinaryIO, size: int, *, before_last: Optional[Callable[[], None]] = None) -> None:
    """Copy exactly ``size`` bytes (tarfile.copyfileobj semantics, fixed-size chunks).
    ``before_last``: called (and let raise) once every byte was read, before the last chunk is
    written, so a consumer that commits a member when it is complete never completes one that
    failed its check (a layer's digest, diff_id and size: :meth:`LayerReader.finish`)."""
    left = size
    pending = b""
    while left > 0:
        data = src.read(min(CHUNK, left))
        if not data:
            raise SizeMismatch(f"copying: expected {size} bytes, found {size - left}")
        if pending:
            dst.write(pending)
        pending = data
        left -= len(data)
    if before_last is not None:
        before_last()
    if pending:
        dst.write(pending)
