"""A stream read ahead by a thread into a bounded queue of blocks.

The ``docker save`` stream is produced by the engine while the exporter hashes, compresses and
writes what it already has: reading it from a thread keeps the socket (or pipe) drained, so the
engine's work and ours overlap instead of taking turns. Memory stays bounded: at most ``depth``
blocks of ``block`` bytes wait in the queue (plus the one being consumed). An error the thread
meets (the engine cut the stream, a broken connection) is raised to the reader at the point in
the stream where it happened, with its own type; closing early stops the thread."""

from __future__ import annotations

import queue
import threading
from typing import List, Optional, Union

from importer.format.digest import CHUNK, Readable

_Item = Union[bytes, BaseException]


class ReadAhead:
    """A read-only file object over ``src`` (anything with ``read(n)``), read ahead by a thread."""

    def __init__(self, src: Readable, *, block: int = CHUNK, depth: int = 8) -> None:
        if block < 1 or depth < 1:
            raise ValueError("ReadAhead: expected a positive block size and depth")
        self._src = src
        self._block = block
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._buf = b""
        self._pos = 0
        self._done = False  # the end (or an error) was taken from the queue
        self._thread = threading.Thread(target=self._run, name="sneakernet-readahead", daemon=True)
        self._thread.start()

    def _put(self, item: _Item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                data = self._src.read(self._block)
                if not self._put(bytes(data)) or not data:
                    return
        except BaseException as e:
            self._put(e)

    def _next(self) -> bool:
        """The next block into ``_buf``; False at the end."""
        if self._done:
            return False
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if not item:
            self._done = True
            return False
        self._buf, self._pos = item, 0
        return True

    def read(self, size: Optional[int] = -1) -> bytes:
        if size is None or size < 0:
            parts = [self._buf[self._pos:]]
            self._buf, self._pos = b"", 0
            while self._next():
                parts.append(self._buf)
                self._buf = b""
            return b"".join(parts)
        out: List[bytes] = []
        want = size
        while want > 0:
            if self._pos >= len(self._buf) and not self._next():
                break
            avail = len(self._buf) - self._pos
            # a whole block is handed on as it is (no copy)
            piece = self._buf if self._pos == 0 and avail <= want else self._buf[self._pos:self._pos + min(want, avail)]
            self._pos += len(piece)
            want -= len(piece)
            out.append(piece)
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    def read1(self, size: Optional[int] = -1) -> bytes:
        """What the current block still holds (up to ``size``): no copy for a whole block, no join."""
        if size == 0 or (self._pos >= len(self._buf) and not self._next()):
            return b""
        avail = len(self._buf) - self._pos
        n = avail if size is None or size < 0 else min(size, avail)
        piece = self._buf if self._pos == 0 and n == avail else self._buf[self._pos:self._pos + n]
        self._pos += n
        return piece

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """Stop the thread: it ends after the read it is in (the caller then closes ``src``)."""
        self._stop.set()
        while True:  # free a put waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=5)
        self._buf, self._pos, self._done = b"", 0, True

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
