"""gzip decoding over large reads: :class:`GzipReader` (stdlib only).

``gzip.GzipFile`` (Python 3.11 and before) reads its source 8 KiB at a time, through a buffered
reader over a reader that prepends what the decoder left over: many small Python steps per MiB.
This reads the source :data:`importer.format.digest.CHUNK` (1 MiB) at a time and gives zlib's raw
deflate decoder slices of at most :data:`FEED` bytes of it (no copy: a memoryview), with
GzipFile's semantics where a layer's reader depends on them, error types and messages included
(so the callers' ``except (OSError, EOFError, zlib.error)`` and their messages stay as they were):

- concatenated members, each with its own header, CRC32 and ISIZE, checked as its end is read
  (``BadGzipFile("CRC check failed ...")``, ``BadGzipFile("Incorrect length of data produced")``);
- zero bytes after a member's trailer are padding and skipped; anything else there must start a
  new member (``BadGzipFile("Not a gzipped file (...)")``); an empty source is an empty stream;
- FEXTRA, FNAME, FCOMMENT and FHCRC are parsed and skipped (the header CRC is not checked, nor are
  the reserved flag bits, as GzipFile does not);
- a source that ends early is ``EOFError`` (the header, the deflate data or the trailer);
- damaged deflate data is ``zlib.error``.

``read(n)`` returns exactly ``n`` bytes until the end (as GzipFile's ``read`` does) and decodes
at most ``max(n, FEED)`` bytes for it: zlib's ``max_length`` stops the decoder, what it has not
read waits in the source buffer (a decompression bomb is read in bounded steps; the caller's bound
stops it). A read of less than :data:`FEED` (a tar header's 512 bytes) decodes :data:`FEED` and
keeps the rest for the next reads. Memory: one source read (1 MiB), ``n`` and :data:`FEED`.
"""

from __future__ import annotations

import gzip
import re
import struct
import zlib
from typing import Any, List, Optional

from importer.format.digest import CHUNK, Readable

__all__ = ["FEED", "GzipReader"]

#: the most compressed bytes given to zlib in one call: what zlib copies (its ``unconsumed_tail``,
#: ``unused_data``) is at most this, so a source of many tiny members costs no more per member
#: than GzipFile's 8 KiB reads do, and a big member still goes through in few Python steps
FEED = 64 * 1024

FHCRC, FEXTRA, FNAME, FCOMMENT = 2, 4, 8, 16
_TRUNCATED = "Compressed file ended before the end-of-stream marker was reached"
_NONZERO = re.compile(b"[^\x00]")


class GzipReader:
    """The decompressed bytes of the gzip stream ``raw`` (anything with ``read(n)``), read forward.
    Closing it does not close ``raw``."""

    def __init__(self, raw: Readable, read_size: int = CHUNK) -> None:
        self._raw = raw
        self._read_size = read_size
        self._buf = b""  # the last read of ``raw``; bytes before ``_at`` are consumed
        self._at = 0
        self._inflate: Any = None  # the current member's decoder; None between members
        self._crc = 0
        self._size = 0
        self._spare = b""  # decoded for a small read, not returned yet: from ``_spare_at`` on
        self._spare_at = 0
        self._end = False
        self._closed = False

    def __enter__(self) -> GzipReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._buf, self._at, self._inflate, self._spare, self._spare_at = b"", 0, None, b"", 0

    def read(self, n: Optional[int] = -1) -> bytes:
        if self._closed:
            raise ValueError("I/O operation on closed file.")
        if n is None or n < 0:
            every: List[bytes] = []
            while True:
                chunk = self.read(CHUNK)
                if not chunk:
                    return b"".join(every)
                every.append(chunk)
        parts: List[bytes] = []
        want = n
        if self._spare_at < len(self._spare):
            part = self._spare[self._spare_at:self._spare_at + want]
            self._spare_at += len(part)
            parts.append(part)
            want -= len(part)
        while want > 0:
            if want < FEED:  # a small read (a tar header): decode FEED, keep the rest for the next reads
                self._spare, self._spare_at = self._decode(FEED), want
                part = self._spare[:want]
            else:
                part = self._decode(want)
            if not part:
                break
            parts.append(part)
            want -= len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _decode(self, want: int) -> bytes:
        """Up to ``want`` bytes (at least one unless the stream ended)."""
        while not self._end:
            if self._inflate is None and not self._begin_member():
                self._end = True
                break
            inflate = self._inflate
            if self._at == len(self._buf):
                self._buf, self._at = self._raw.read(self._read_size), 0
            data = memoryview(self._buf)[self._at:self._at + FEED]
            self._at += len(data)
            out: bytes = inflate.decompress(data, want)
            # what zlib did not take goes back: it is the end of the slice just given (at the
            # member's end zlib may leave a stale unconsumed_tail beside unused_data)
            self._at -= len(inflate.unused_data) if inflate.eof else len(inflate.unconsumed_tail)
            if out:
                self._crc = zlib.crc32(out, self._crc)
                self._size += len(out)
            if inflate.eof:
                self._end_member()
            elif not out and not data:
                raise EOFError(_TRUNCATED)
            if out:
                return out
        return b""

    def _fill(self, k: int) -> bool:
        """At least ``k`` unconsumed bytes in the buffer; False when ``raw`` ends first."""
        while len(self._buf) - self._at < k:
            more = self._raw.read(max(self._read_size, k))
            if not more:
                return False
            self._buf, self._at = self._buf[self._at:] + more, 0
        return True

    def _take(self, k: int) -> bytes:
        """The next ``k`` bytes, or fewer when ``raw`` ends first."""
        self._fill(k)
        got = self._buf[self._at:self._at + k]
        self._at += len(got)
        return got

    def _exact(self, k: int) -> bytes:
        got = self._take(k)
        if len(got) < k:
            raise EOFError(_TRUNCATED)
        return got

    def _skip(self, k: int) -> None:
        while k > 0:
            if not self._fill(1):
                raise EOFError(_TRUNCATED)
            step = min(k, len(self._buf) - self._at)
            self._at += step
            k -= step

    def _skip_string(self) -> None:
        """Past the next NUL byte, or to the end of ``raw`` (as GzipFile: what follows then fails)."""
        while self._fill(1):
            nul = self._buf.find(b"\x00", self._at)
            if nul >= 0:
                self._at = nul + 1
                return
            self._at = len(self._buf)

    def _begin_member(self) -> bool:
        """Read a member's header; False at the end of ``raw``."""
        magic = self._take(2)
        if not magic:
            return False
        if magic != b"\x1f\x8b":
            raise gzip.BadGzipFile(f"Not a gzipped file ({magic!r})")
        method, flag = struct.unpack("<BB", self._exact(8)[:2])
        if method != 8:
            raise gzip.BadGzipFile("Unknown compression method")
        if flag & FEXTRA:
            self._skip(struct.unpack("<H", self._exact(2))[0])
        if flag & FNAME:
            self._skip_string()
        if flag & FCOMMENT:
            self._skip_string()
        if flag & FHCRC:
            self._exact(2)
        self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
        self._crc, self._size = 0, 0
        return True

    def _end_member(self) -> None:
        """Check the member's trailer, then skip the zero padding after it."""
        crc, isize = struct.unpack("<II", self._exact(8))
        if crc != self._crc:
            raise gzip.BadGzipFile(f"CRC check failed {hex(crc)} != {hex(self._crc)}")
        if isize != self._size & 0xFFFFFFFF:
            raise gzip.BadGzipFile("Incorrect length of data produced")
        self._inflate = None
        while self._fill(1):
            found = _NONZERO.search(self._buf, self._at)
            if found is not None:
                self._at = found.start()
                return
            self._at = len(self._buf)
