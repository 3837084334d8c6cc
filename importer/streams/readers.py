"""The one reader type (:class:`Readable`) and the small reader family every stream is built from:
a reader that first returns bytes already read (:class:`PrefixedReader`), and readers/writers that
hash and count what passes (:class:`HashingReader`, :class:`HashingWriter`). They compose:
``HashingReader(PrefixedReader(head, raw), on_bytes)``."""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Optional, Protocol, cast

from importer.format.digest import CHUNK, Digest, Readable

__all__ = ["HashingReader", "HashingWriter", "PrefixedReader", "Readable", "Writable"]

ProgressFn = Callable[[int], None]


class Writable(Protocol):
    def write(self, __data: Any) -> Any: ...


class PrefixedReader:
    """Returns ``head`` (bytes already read, to sniff the format) first, then the rest of ``raw``.
    A read that asks for at least what is left of ``head`` gets it plus more from ``raw``."""

    def __init__(self, head: bytes, raw: Readable) -> None:
        self._head = head
        self._raw = raw

    def read(self, n: Optional[int] = -1) -> bytes:
        if self._head:
            if n is None or n < 0 or n >= len(self._head):
                head, self._head = self._head, b""
                return head + bytes(self._raw.read(-1 if n is None or n < 0 else n - len(head)))
            head, self._head = self._head[:n], self._head[n:]
            return head
        return bytes(self._raw.read(-1 if n is None else n))

    def readable(self) -> bool:
        return True


class HashingReader:
    """Passes reads of ``raw`` through while hashing (sha256) and counting them; each byte read
    is also reported to ``on_bytes`` and written to ``tee`` when given. ``hashes``: False in a
    subclass that only counts (its :meth:`digest` is then not computed from the bytes)."""

    hashes = True

    def __init__(self, raw: Readable, on_bytes: Optional[ProgressFn] = None, tee: Optional[Writable] = None) -> None:
        self._raw = raw
        self._on = on_bytes
        self._tee = tee
        self.hasher = hashlib.sha256()
        self.count = 0

    def _passed(self, data: Any) -> None:
        self.hasher.update(data)
        self.count += len(data)
        if self._tee is not None:
            self._tee.write(data)
        if self._on is not None:
            self._on(len(data))

    def read(self, n: Optional[int] = -1) -> bytes:
        data = bytes(self._raw.read(-1 if n is None else n))
        if data:
            self._passed(data)
        return data

    def readinto(self, b: Any) -> int:
        n: int = cast(Any, self._raw).readinto(b)  # only called where raw is a file
        if n:
            self._passed(memoryview(b)[:n])
        return n

    def readable(self) -> bool:
        return True

    def drain(self) -> None:
        """Read ``raw`` to its end (hashing, counting and teeing the rest)."""
        while self.read(CHUNK):
            pass

    def digest(self) -> Digest:
        return Digest("sha256", self.hasher.hexdigest())


class HashingWriter:
    """Passes writes to ``raw`` while hashing (sha256) and counting them."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.hasher = hashlib.sha256()
        self.count = 0

    def write(self, data: Any) -> int:
        self.hasher.update(data)
        self.count += len(data)
        return int(self._raw.write(data))

    def flush(self) -> None:
        self._raw.flush()

    def digest(self) -> Digest:
        return Digest("sha256", self.hasher.hexdigest())
