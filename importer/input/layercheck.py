"""Checking a layer's diff_id beside a stream that carries it compressed.

A load that hands the engine a layer as carried (the bundle's gzip/zstd blob, byte for byte: an
OCI archive into Docker's containerd store, where an image loads untagged or a delta's left-out
blobs are copied in; a load whose images all have staging names checks the diff_ids while the
engine unpacks instead, importer/input/unpackcheck.py) reads each blob once; :class:`LayerCheck` takes the
same chunks and, in a thread of its own, decompresses them within the recorded uncompressed size
and hashes the result (zlib, zstandard and hashlib release the GIL, so on two cores this runs
beside the send instead of in a pass of its own before it). :meth:`LayerCheck.finish` raises the
first problem (the blob's size, damaged compression, too many bytes, the diff_id or its size;
the feeder hashes the compressed chunks as they pass and checks the blob's digest): the caller
then aborts the stream before the member that names an image, so the engine names nothing.
Memory is bounded: at most ``depth`` chunks wait between the two threads.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Iterator, Optional

from importer.format.digest import Digest
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import compression_of
from importer.input.layers import ChunkCursor, LayerReader
from importer.streams.compression import open_decompressed
from importer.streams.readers import HashingReader

_DEPTH = 8  # chunks (1 MiB each at most) waiting for the checking thread


class _Chunks(ChunkCursor):
    """A reader over the chunks another thread hands over; ``None`` ends it."""

    def __init__(self, depth: int) -> None:
        self.queue: queue.Queue[Optional[bytes]] = queue.Queue(maxsize=depth)
        self._item = b""
        self._pos = 0
        self._ended = False

    def read(self, n: Optional[int] = -1) -> bytes:
        if self._pos >= len(self._item) and not self._ended:
            item = self.queue.get()
            if item is None:
                self._ended = True
                self._item, self._pos = b"", 0
            else:
                self._item, self._pos = item, 0
        return self._take(n)

    def readable(self) -> bool:
        return True

    def drain(self) -> None:
        """Take every chunk until the end (after a failure: the producer never blocks)."""
        while not self._ended:
            if self.queue.get() is None:
                self._ended = True
        self._item, self._pos = b"", 0


class _Counted(HashingReader):
    """Counts the compressed bytes the decompressor reads, without hashing them: the stream that
    feeds the chunks hashes them as they pass and checks the blob's digest itself
    (importer/sinks/ociarchive.py ``copy_blob``), so each byte is hashed once."""

    hashes = False

    def __init__(self, raw: _Chunks, digest: Digest) -> None:
        super().__init__(raw)
        self._expected = digest

    def _passed(self, data: Any) -> None:
        self.count += len(data)

    def digest(self) -> Digest:
        return self._expected


class LayerCheck:
    """Feed the compressed bytes of ``layer`` (:meth:`feed`), then :meth:`finish` (raises the
    first problem: the blob's size, damaged compression, a bomb past the recorded size, the
    diff_id or its size) or :meth:`close` (stops, raises nothing). The blob's own digest is the
    feeder's to check: it hashes the chunks as they pass (so they are hashed once)."""

    def __init__(self, layer: LayerRecord, what: str, *, depth: int = _DEPTH) -> None:
        self.layer = layer
        self.what = what
        self._chunks = _Chunks(depth)
        self._error: Optional[BaseException] = None
        self._ended = False
        self._thread = threading.Thread(target=self._run, name=f"layercheck {layer.digest.hex[:12]}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            raw = _Counted(self._chunks, self.layer.digest)
            with open_decompressed(raw, compression_of(self.layer.media_type), bound=self.layer.uncompressed_size,
                                   what=self.what) as plain:
                LayerReader(raw, plain, self.layer, self.what).finish()
        except BaseException as e:  # handed to the producer by feed() or finish()
            self._error = e
        finally:
            self._chunks.drain()

    def feed(self, data: bytes) -> None:
        """Hand one chunk over; raises at once when the check already failed (no need to send the rest)."""
        if self._error is not None:
            raise self._error
        if data:
            self._chunks.queue.put(bytes(data))

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._chunks.queue.put(None)
        self._thread.join()

    def finish(self) -> None:
        """Every byte was fed: wait for the thread, raise what it found."""
        self._end()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop without a verdict (the stream failed elsewhere)."""
        self._end()


@contextlib.contextmanager
def checking(layer: Optional[LayerRecord], what: str) -> Iterator[Optional[LayerCheck]]:
    """A :class:`LayerCheck` for ``layer`` (None: nothing to check), always stopped on the way out."""
    if layer is None:
        yield None
        return
    check = LayerCheck(layer, what)
    try:
        yield check
    finally:
        check.close()
