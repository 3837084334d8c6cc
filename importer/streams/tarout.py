"""Writing a tar stream member by member, big members straight through.

tarfile's stream mode (``"w|"``) passes every byte through a buffer of its own (``bytes +=``,
then two slices per block written: three copies of each layer byte, under the GIL, on the CPU
the engine needs). Here the TarFile writes to ``out`` directly (``"w"`` mode over
:class:`Position`, which gives a pipe or a socket body the ``tell()`` tarfile asks for), small
members go through ``tar.addfile`` as usual, and a big member is written by the caller between
:func:`begin_member` and :func:`end_member`, each chunk handed to ``out`` as it is."""

from __future__ import annotations

import contextlib
import tarfile
from typing import Any, BinaryIO, Iterator, Optional, cast

_MODE = 0o644


class Position:
    """``out`` with the count of bytes written so far as ``tell()``."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._pos = 0

    def write(self, data: Any) -> int:
        n = len(data)
        if n:
            self._out.write(data)
            self._pos += n
        return n

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        with contextlib.suppress(AttributeError):
            self._out.flush()


@contextlib.contextmanager
def writing_tar(out: BinaryIO) -> Iterator[tarfile.TarFile]:
    """A PAX TarFile writing to ``out`` without a buffer of its own. On a clean exit the end of
    the archive is written; on an exception nothing more is (the consumer sees a cut archive)."""
    with tarfile.open(fileobj=cast(Any, Position(out)), mode="w", format=tarfile.PAX_FORMAT) as tar:
        yield tar


def member_info(name: str, size: int) -> tarfile.TarInfo:
    """A regular file member as our archives write them (mode 0644, mtime 0, no owner names)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = _MODE
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def begin_member(tar: tarfile.TarFile, name: str, size: int, *, info: Optional[tarfile.TarInfo] = None) -> None:
    """Write the header of a ``size``-byte member ``name``; its bytes follow through ``tar.fileobj``
    (by hand: ``addfile()`` without a file object is refused on Python 3.13+)."""
    assert tar.fileobj is not None
    header = (info or member_info(name, size)).tobuf(tar.format, tar.encoding, tar.errors)
    tar.fileobj.write(header)
    tar.offset += len(header)


def end_member(tar: tarfile.TarFile, size: int) -> None:
    """Pad the member of ``size`` bytes just written to a whole block, as ``addfile`` would."""
    assert tar.fileobj is not None
    blocks, remainder = divmod(size, tarfile.BLOCKSIZE)
    if remainder:
        tar.fileobj.write(tarfile.NUL * (tarfile.BLOCKSIZE - remainder))
        blocks += 1
    tar.offset += blocks * tarfile.BLOCKSIZE
