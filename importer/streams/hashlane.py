"""``HashLane``: the sha256 of a byte stream (and of its segments) on a thread of its own.

``bundle pack`` hashes every byte three times (each member against its pin, each part, the whole
archive): on one thread that made it CPU-bound. A lane takes the bytes the writer has just
written through a bounded queue (flat memory: at most ``depth`` batches of about ``batch`` bytes
waiting) and hashes them on its thread; hashlib releases the GIL on buffers over 2047 bytes, so
the hashing runs beside the reads, the writes and the member hashes. The whole and the segment
hashes share one thread: the second pass over a batch finds it in that core's cache (two threads
cost more CPU than they saved on this two-core machine); the first segment is hashed once, its
digest being the whole's at its end. Small writes (tar headers, padding) are
batched, so the queue sees about one item per ``batch`` bytes."""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import Any, List, Optional, Tuple

from importer.format.digest import CHUNK

_CUT = "cut"  # a segment ends here: its digest is recorded, a new one starts


class HashLane:
    """sha256 of what :meth:`update` is given, in order, on a thread of its own (started with the
    first bytes); with ``segments``, also of each segment :meth:`cut` ends (a part of a split
    archive). :meth:`close` waits for the thread and returns the hex digest of the whole and those
    of the segments cut, in order. :meth:`stop` ends the thread without them (the writer failed).
    The caller must not change a buffer it handed over: a writable one is copied."""

    def __init__(self, name: str, *, segments: bool = False, depth: int = 4, batch: int = CHUNK) -> None:
        self.name = name
        self._segments = segments
        self._batch = batch
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._pending: List[Any] = []
        self._pending_size = 0
        self._whole = hashlib.sha256()
        self._digests: List[str] = []
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        whole = self._whole
        part = None  # the first segment's hash is the whole's so far: one pass fewer over it
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # keep taking items, so the writer never blocks on a full queue
            try:
                if item == _CUT:
                    self._digests.append((whole if part is None else part).hexdigest())
                    part = hashlib.sha256()
                    continue
                for data in item:
                    whole.update(data)
                    if part is not None:
                        part.update(data)
            except BaseException as e:  # raised by close()
                self._error = e

    def _put(self, item: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put(item)

    def _flush(self) -> None:
        if self._pending:
            self._put(tuple(self._pending))
            self._pending = []
            self._pending_size = 0

    def update(self, data: Any) -> None:
        view = memoryview(data)
        if not len(view):
            return
        self._pending.append(view if view.readonly else bytes(view))
        self._pending_size += len(view)
        if self._pending_size >= self._batch:
            self._flush()

    def cut(self) -> None:
        """A segment ends here (nothing without ``segments``)."""
        if self._segments:
            self._flush()
            self._put(_CUT)

    def close(self) -> Tuple[str, List[str]]:
        """Wait for the thread; the digest of everything given and those of the segments cut, in order."""
        self._flush()
        self._end()
        if self._error is not None:
            raise self._error
        return self._whole.hexdigest(), list(self._digests)

    def stop(self) -> None:
        """End the thread, what was not hashed yet dropped; no digest."""
        self._pending = []
        self._end()

    def _end(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
