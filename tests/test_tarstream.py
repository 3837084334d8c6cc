"""bundle/sources/tarstream.py against tarfile itself: the same members and bytes for every header
form (ustar, pax, GNU long names, links, directories, empty files), whatever sizes the source
delivers and however the members are read (or skipped); and a ReadError, never a short member or a
hang, for a stream cut in a header or in data, a damaged header, a lying size or a huge pax header."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from bundle.sources.tarstream import MAX_META, TarStream


class Dribble(io.RawIOBase):
    """A source whose reads return at most ``step`` bytes (as a socket or a pipe may)."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.pos, self.step = data, 0, step

    def read(self, size: int = -1) -> bytes:
        n = self.step if size is None or size < 0 else min(size, self.step)
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    read1 = read


def _archive(fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        def add(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        add("a" * 40 + "/layer.tar", os.urandom(3 * 1024 * 1024 + 5))
        add("d" * 150 + "/long-name.json", b'{"x": 1}')  # over 100 characters: pax or GNU longname
        add("dir", kind=tarfile.DIRTYPE)
        add("empty", b"")
        add("sym", kind=tarfile.SYMTYPE, link="l" * 120)  # long link target
        add("hard", kind=tarfile.LNKTYPE, link="empty")
        add("odd", os.urandom(511))
        add("manifest.json", b"[]")
    return buf.getvalue()


def _expected(raw: bytes) -> list[tuple[str, str, bytes]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isfile() else None
            out.append((m.name, m.linkname, f.read() if f else b""))
    return out


def _got(src: object, sizes: list[int], use_read1: bool) -> list[tuple[str, str, bytes]]:
    out = []
    for info, member in TarStream(src).members():
        parts, n = [], 0
        while True:
            size = sizes[n % len(sizes)]
            n += 1
            chunk = member.read1(size) if use_read1 else member.read(size)
            if not chunk:
                break
            assert len(chunk) <= size
            parts.append(chunk)
        out.append((info.name, info.linkname, b"".join(parts)))
    return out


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])  # ustar cannot hold long names
@pytest.mark.parametrize("step", [1 << 20, 4096, 777])
@pytest.mark.parametrize("use_read1", [True, False])
def test_same_members_and_bytes_as_tarfile(fmt: int, step: int, use_read1: bool) -> None:
    raw = _archive(fmt)
    assert _got(Dribble(raw, step), [1 << 20, 3, 512], use_read1) == _expected(raw)


def test_exact_read_fills_across_source_reads() -> None:
    raw = _archive(tarfile.PAX_FORMAT)
    for info, member in TarStream(Dribble(raw, 100)).members():
        if info.name.endswith("layer.tar"):
            assert len(member.read(4096)) == 4096  # exact, though the source gives 100 bytes a read
            break


def test_unread_members_are_skipped() -> None:
    raw = _archive(tarfile.PAX_FORMAT)
    names = [info.name for info, _ in TarStream(Dribble(raw, 65536)).members()]
    assert names == [n for n, _, _ in _expected(raw)]


def test_half_read_member_then_the_next_is_right() -> None:
    raw = _archive(tarfile.PAX_FORMAT)
    got = {}
    for info, member in TarStream(Dribble(raw, 65536)).members():
        got[info.name] = member.read(10) if info.name.endswith("layer.tar") else member.read()
    assert got["manifest.json"] == b"[]"


@pytest.mark.parametrize("cut", [100, 700, 2 * 1024 * 1024])
def test_stream_cut_short_is_a_read_error(cut: int) -> None:
    raw = _archive(tarfile.PAX_FORMAT)
    with pytest.raises(tarfile.ReadError):
        for _, member in TarStream(Dribble(raw[:cut], 65536)).members():
            member.read()


def test_stream_ending_between_members_ends_quietly() -> None:
    """No end-of-archive blocks (the caller then misses manifest.json and says so)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("x")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    raw = buf.getvalue()[:1024]  # the header and one data block, no end blocks
    assert [(i.name, m.read()) for i, m in TarStream(io.BytesIO(raw)).members()] == [("x", b"abc")]


def test_damaged_header_is_a_read_error() -> None:
    raw = bytearray(_archive(tarfile.PAX_FORMAT))
    raw[200] ^= 0xFF  # inside the first header: the checksum no longer matches
    with pytest.raises(tarfile.ReadError, match="bad header"):
        list(TarStream(io.BytesIO(bytes(raw))).members())


def test_lying_size_is_a_read_error() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("big")
        info.size = 5000
        tar.addfile(info, io.BytesIO(os.urandom(5000)))
    raw = bytearray(buf.getvalue())
    raw[124:136] = format(1 << 30, "011o").encode() + b"\0"  # claims a GiB
    raw[148:156] = format(sum(raw[:148]) + 256 + sum(raw[156:512]), "06o").encode() + b"\0 "
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        for _, member in TarStream(io.BytesIO(bytes(raw))).members():
            while member.read1(1 << 20):
                pass


def test_huge_pax_header_is_refused_before_it_is_read() -> None:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = MAX_META * 64
    raw = info.tobuf(format=tarfile.USTAR_FORMAT)
    src = Dribble(raw + b"\0" * 4096, 1 << 20)
    with pytest.raises(tarfile.ReadError, match="pax or long-name header"):
        list(TarStream(src).members())
    assert src.pos < MAX_META
