"""One pass over a tar stream whose member data is read straight from the source's reads.

``tarfile``'s stream mode (``r|``) copies every byte three or four times (its block buffer joined
and sliced, then copied into a BufferedReader); for a ``docker save`` of a GiB that was the largest
CPU cost after hashing. Here the headers are still parsed by ``tarfile.TarInfo.fromtarfile``
(ustar, GNU long names, pax: the same rules), but a member's data comes from the source as it was
read: :meth:`Member.read1` hands on what the source's current block holds (one copy at most), and
:meth:`Member.read` is exact, like a file's.

Hostile input: a header that does not parse, a stream that ends inside a header or a member's
data (a member claiming more bytes than the stream holds), or a pax/long-name header larger than
:data:`MAX_META` is a ``tarfile.ReadError``; the caller says what it was reading."""

from __future__ import annotations

import tarfile
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from importer.format.digest import Readable

#: the most bytes a pax or GNU long-name header may hold (they are read into memory)
MAX_META = 1024 * 1024
_BLOCK = tarfile.BLOCKSIZE
#: the end-of-archive block, or the stream ended between members (tarfile's own names, untyped)
_END = (tarfile.EOFHeaderError, tarfile.EmptyHeaderError)  # type: ignore[attr-defined]


class TarStream:
    """Iterate with :meth:`members`; each member's data must be read (or not) before the next."""

    encoding = "utf-8"
    errors = "surrogateescape"

    def __init__(self, src: Readable) -> None:
        self._src = src
        self._read_some: Callable[[int], bytes] = getattr(src, "read1", None) or src.read
        self._buf = b""  # what the last source read left over
        self._pos = 0  # bytes consumed from the stream
        # what tarfile.TarInfo.fromtarfile() reads and sets on "the tar file" it is given
        self.fileobj = _HeaderReader(self)
        self.pax_headers: Dict[str, str] = {}
        self.offset = 0

    def _take(self, n: int, exact: bool) -> bytes:
        """Up to ``n`` bytes (all ``n`` when ``exact``, short only at the end of the stream)."""
        parts: List[bytes] = []
        want = n
        while want > 0:
            if not self._buf:
                self._buf = bytes(self._read_some(max(want, 64 * 1024)) if exact else self._read_some(want))
                if not self._buf:
                    break
            if len(self._buf) <= want:
                piece, self._buf = self._buf, b""
            else:
                piece, self._buf = self._buf[:want], self._buf[want:]
            parts.append(piece)
            want -= len(piece)
            self._pos += len(piece)
            if not exact:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _skip(self, n: int) -> None:
        while n > 0:
            got = self._take(min(n, 1024 * 1024), exact=False)
            if not got:
                raise tarfile.ReadError("unexpected end of data")
            n -= len(got)

    def members(self) -> Iterator[Tuple[tarfile.TarInfo, Member]]:
        while True:
            try:
                info = tarfile.TarInfo.fromtarfile(self)  # type: ignore[arg-type]
            except _END:
                return
            except tarfile.HeaderError as e:
                raise tarfile.ReadError(f"bad header at byte {self._pos}: {e}") from None
            has_data = self.offset - info.offset_data  # data and padding, block-rounded (0 for links, dirs)
            member = Member(self, info.size if has_data > 0 else 0)
            yield info, member
            self._skip(member.left)
            self._skip(max(0, self.offset - self._pos))


class _HeaderReader:
    """The ``fileobj`` TarInfo's header parsing reads: exact reads, bounded."""

    def __init__(self, stream: TarStream) -> None:
        self._stream = stream

    def read(self, n: int) -> bytes:
        if n > MAX_META:
            raise tarfile.ReadError(f"a pax or long-name header of {n} bytes (at most {MAX_META})")
        data = self._stream._take(n, exact=True)
        if len(data) != n and n != _BLOCK:  # a short header block is TarInfo's own error
            raise tarfile.ReadError("unexpected end of data in a header")
        return data

    def tell(self) -> int:
        return self._stream._pos


class Member:
    """One member's data: ``read1`` as the source delivers it, ``read`` exact."""

    def __init__(self, stream: TarStream, size: int) -> None:
        self._stream = stream
        self.left = size

    def read1(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self._stream._take(want, exact=False)
        if not data:
            raise tarfile.ReadError("unexpected end of data")
        self.left -= len(data)
        return data

    def read(self, n: Optional[int] = -1) -> bytes:
        want = self.left if n is None or n < 0 else min(n, self.left)
        if want <= 0:
            return b""
        data = self._stream._take(want, exact=True)
        self.left -= len(data)
        if len(data) != want:
            raise tarfile.ReadError("unexpected end of data")
        return data

    def readable(self) -> bool:
        return True
