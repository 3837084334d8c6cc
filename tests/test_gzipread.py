"""importer/streams/gzipread.py against gzip.GzipFile: the same bytes, or the same error (type and
message), on generated streams (sizes, levels, members, padding, header flags, every cut point,
flipped trailers, garbage), read in any step size and from a source that returns short reads;
a decompression bomb read in bounded memory; and the export's recompressed blob unchanged."""

from __future__ import annotations

import gzip
import io
import random
import struct
import tracemalloc
import zlib
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest

from bundle.blobstore import BlobStore
from importer.errors import LimitExceeded
from importer.streams.compression import open_decompressed
from importer.streams.gzipread import FEED, GzipReader

Outcome = Tuple[str, Any]


def _payload(rng: random.Random, size: int) -> bytes:
    """Text-like runs and random stretches: compresses somewhere between 1x and 100x."""
    out = bytearray()
    while len(out) < size:
        if rng.random() < 0.3:
            out += rng.randbytes(rng.randint(1, 5000))
        else:
            out += bytes([rng.randint(0x20, 0x7E)]) * rng.randint(1, 3000)
    return bytes(out[:size])


def _member(data: bytes, level: int, flags: int = 0, *, extra: bytes = b"", name: bytes = b"",
            comment: bytes = b"") -> bytes:
    """One gzip member with the header fields ``flags`` names (FHCRC with a right header CRC)."""
    head = b"\x1f\x8b\x08" + bytes([flags]) + struct.pack("<I", 1234567) + b"\x00\xff"
    if flags & 4:
        head += struct.pack("<H", len(extra)) + extra
    if flags & 8:
        head += name + b"\x00"
    if flags & 16:
        head += comment + b"\x00"
    if flags & 2:
        head += struct.pack("<H", zlib.crc32(head) & 0xFFFF)
    c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = c.compress(data) + c.flush()
    return head + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


class _Short:
    """A source (a pipe) that returns at most ``most`` bytes per read."""

    def __init__(self, data: bytes, most: int) -> None:
        self.f, self.most = io.BytesIO(data), most

    def read(self, n: int = -1) -> bytes:
        return self.f.read(self.most if n < 0 else min(n, self.most))


def _theirs(stream: bytes) -> Outcome:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(stream), mode="rb") as gz:
            return "ok", gz.read()
    except (OSError, EOFError, zlib.error) as e:
        return type(e).__name__, str(e)


def _ours(stream: bytes, step: int, most: Optional[int] = None, read_size: Optional[int] = None) -> Outcome:
    src: Any = io.BytesIO(stream) if most is None else _Short(stream, most)
    got: List[bytes] = []
    try:
        with (GzipReader(src) if read_size is None else GzipReader(src, read_size)) as r:
            while True:
                chunk = r.read(step)
                if not chunk:
                    break
                if step >= 0:
                    assert len(chunk) <= step
                got.append(chunk)
        return "ok", b"".join(got)
    except (OSError, EOFError, zlib.error) as e:
        return type(e).__name__, str(e)


def _same(stream: bytes, rng: random.Random) -> None:
    want = _theirs(stream)
    for step, most, read_size in ((1 << 20, None, None), (rng.randint(1, 70000), None, None), (-1, None, None),
                                  (rng.randint(1, 5000), rng.randint(1, 300), rng.randint(1, 40))):
        got = _ours(stream, step, most, read_size)
        assert got == want, f"step {step}, reads of at most {most}, read_size {read_size}: {got[0]} != {want[0]}" \
            f" ({str(got[1])[:200]!r} != {str(want[1])[:200]!r})"


def test_generated_streams_decode_as_gzipfile_does() -> None:
    rng = random.Random(44)
    for _ in range(150):
        stream = b""
        for _ in range(rng.choice([1, 1, 2, 3])):
            size = rng.choice([0, 1, rng.randint(2, 5000), rng.randint(5000, 400_000)])
            flags = rng.choice([0, 0, 2, 4, 8, 16, 30, 31, 0xE0 | 8])
            stream += _member(_payload(rng, size), rng.randint(0, 9), flags, extra=rng.randbytes(rng.randint(0, 300)),
                              name=b"layer.tar", comment=b"x" * rng.randint(0, 70000))
            stream += b"\x00" * rng.choice([0, 0, 1, 7, 100_000])
        _same(stream, rng)


def test_gzip_module_output_and_the_empty_stream() -> None:
    rng = random.Random(1)
    for level in range(10):
        _same(gzip.compress(_payload(rng, 300_000), level, mtime=0), rng)
    _same(b"", rng)
    _same(b"\x00" * 10, rng)  # zeros alone are not a member: GzipFile says so (not a gzipped file)
    assert _ours(gzip.compress(b"") * 3, 100) == ("ok", b"")


def test_every_cut_of_a_small_multi_member_stream() -> None:
    rng = random.Random(2)
    stream = (_member(_payload(rng, 3000), 6, 30, extra=b"ab", name=b"n", comment=b"c") + b"\x00\x00"
              + _member(b"tail", 1, 0))
    outcomes = set()
    for cut in range(len(stream) + 1):
        want = _theirs(stream[:cut])
        outcomes.add(want[0])
        for step in (1 << 20, 17):
            assert _ours(stream[:cut], step) == want, cut
            assert _ours(stream[:cut], step, most=5, read_size=3) == want, cut
    assert outcomes == {"ok", "EOFError", "BadGzipFile"}  # the cuts reach every kind of end


def test_damage_is_the_same_error() -> None:
    rng = random.Random(3)
    data = _payload(rng, 200_000)
    good = _member(data, 6)
    crc_at, isize_at = len(good) - 8, len(good) - 4
    cases = {
        "crc": good[:crc_at] + bytes([good[crc_at] ^ 1]) + good[crc_at + 1:],
        "isize": good[:isize_at] + bytes([good[isize_at] ^ 1]) + good[isize_at + 1:],
        "garbage after": good + b"garbage",
        "garbage after padding": good + b"\x00" * 5 + b"\x01",
        "one magic byte": good + b"\x1f",
        "method": good[:2] + b"\x07" + good[3:],
        "magic": b"\x1f\x8c" + good[2:],
        "deflate": good[:40] + bytes([good[40] ^ 0xFF]) + good[41:],
        "second member's crc": good + good[:crc_at] + b"\x00\x00\x00\x00" + good[isize_at:],
        "unterminated name": _member(b"x", 6, 8)[:10] + b"name",
    }
    for what, stream in cases.items():
        want = _theirs(stream)
        assert want[0] != "ok", what
        assert _ours(stream, 1 << 20) == want, what
        assert _ours(stream, 1000, most=7, read_size=5) == want, what
    for i in range(10, len(good) - 8, 997):  # any flipped deflate byte: the same error, or the same bytes
        stream = good[:i] + bytes([good[i] ^ 0x5A]) + good[i + 1:]
        assert _ours(stream, 1 << 20) == _theirs(stream), i


def test_reads_are_full_until_the_end() -> None:
    """read(n) returns n bytes until the last read, as GzipFile's does (the export's chunks)."""
    rng = random.Random(4)
    data = _payload(rng, 3_000_000)
    stream = _member(data[:1_000_001], 9) + b"\x00" + _member(data[1_000_001:], 1)
    r = GzipReader(io.BytesIO(stream))
    sizes = []
    while True:
        chunk = r.read(1 << 20)
        if not chunk:
            break
        sizes.append(len(chunk))
    assert sizes == [1 << 20, 1 << 20, 3_000_000 - 2 * (1 << 20)]
    assert r.read(5) == b"" and r.read(0) == b""
    r.close()
    with pytest.raises(ValueError):
        r.read(1)


def _bomb(gib: int = 1) -> bytes:
    """A gzip stream of ``gib`` GiB of zeros (about 1 MiB), made without compressing a GiB: one
    MiB of zeros compressed and fully flushed (the compressor's state reset), repeated."""
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    mib = bytes(1 << 20)
    segment = c.compress(mib) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(gib << 10):
        crc = zlib.crc32(mib, crc)
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + segment * (gib << 10) + b"\x03\x00"
            + struct.pack("<II", crc, (gib << 30) & 0xFFFFFFFF))


def test_a_bomb_is_read_in_bounded_memory() -> None:
    bomb = _bomb()
    assert len(bomb) < 1100 * 1024
    with GzipReader(io.BytesIO(bomb)) as r:
        assert r.read(10) == b"\x00" * 10
    tracemalloc.start()
    try:
        total = 0
        with GzipReader(io.BytesIO(bomb)) as r:
            while True:
                chunk = r.read(1 << 20)
                if not chunk:
                    break
                assert len(chunk) <= 1 << 20
                total += len(chunk)
                del chunk
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == 1 << 30
    # one source read (the whole ~1 MiB bomb here), one output chunk and a slice of input: never the GiB
    assert peak < 4 * (1 << 20) + FEED, peak
    # the importer's reader stops it at the recorded size plus one byte
    with pytest.raises(LimitExceeded), open_decompressed(io.BytesIO(bomb), "gzip", bound=5 << 20,
                                                         what="layer 1") as r:
        while r.read(1 << 20):
            pass


@pytest.mark.parametrize("target", ["zstd", "gzip"])
def test_the_export_recompresses_to_the_same_blob(tmp_path: Path, target: str) -> None:
    """The export decodes a stored gzip layer and compresses it again (``--compression``): the blob
    is the one GzipFile's bytes gave (GzipFile hands write_layer small read1() pieces, this 1 MiB reads)."""
    rng = random.Random(5)
    stream = _member(_payload(rng, 3_000_000), 6, 8, name=b"layer.tar") + b"\x00" * 3 + _member(b"end", 9)
    records = []
    for name, open_ in (("gzipfile", lambda f: gzip.GzipFile(fileobj=f, mode="rb")), ("gzipreader", GzipReader)):
        store = BlobStore(str(tmp_path / name), fsync=False)
        with open_(io.BytesIO(stream)) as plain:
            records.append(store.write_layer(plain, compression=target))
    assert records[0] == records[1]
