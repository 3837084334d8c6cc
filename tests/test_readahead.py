"""bundle/sources/readahead.py: the same bytes as the source, in any read sizes; memory bounded by
its queue; the source's error raised to the reader with its own type, where it happened in the
stream; an early close stops the thread. And the docker save parser on top of it: a truncated
stream, an engine error mid-stream and a member whose size lies are one clear error each."""

from __future__ import annotations

import http.client
import io
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from bundle.blobstore import BlobStore
from bundle.exportloop import read_docker_save
from bundle.sources.readahead import ReadAhead
from importer.errors import SourceError
from tests.kit.fakesave import docker_save, sample_images


class Counting(io.RawIOBase):
    """A source that counts the bytes read from it, optionally failing after ``fail_at`` bytes."""

    def __init__(self, data: bytes, fail_at: int | None = None, exc: BaseException | None = None) -> None:
        self.data, self.pos = data, 0
        self.fail_at, self.exc = fail_at, exc
        self.lock = threading.Lock()

    def read(self, size: int = -1) -> bytes:
        with self.lock:
            if self.fail_at is not None and self.pos >= self.fail_at:
                raise self.exc or OSError("cut")
            end = len(self.data) if size < 0 else min(len(self.data), self.pos + size)
            if self.fail_at is not None:
                end = min(end, self.fail_at)
            out = self.data[self.pos:end]
            self.pos = end
            return out


@pytest.mark.parametrize("sizes", [[1], [7, 4096, 1], [1 << 20], [3 << 20, 5]])
def test_same_bytes_in_any_read_sizes(sizes: list[int]) -> None:
    data = os.urandom((5 << 20) + 123)
    got = []
    with ReadAhead(Counting(data), block=1 << 16, depth=4) as r:
        n = 0
        while True:
            chunk = r.read(sizes[n % len(sizes)])
            n += 1
            if not chunk:
                break
            assert len(chunk) <= sizes[(n - 1) % len(sizes)]
            got.append(chunk)
        assert r.read(10) == b""
    assert b"".join(got) == data


def test_read_all_and_empty_source() -> None:
    data = os.urandom(300_000)
    with ReadAhead(Counting(data), block=65536) as r:
        assert r.read(10) == data[:10]
        assert r.read() == data[10:]
    with ReadAhead(Counting(b"")) as r:
        assert r.read(5) == b""


def test_memory_is_bounded_by_the_queue() -> None:
    """A reader that takes nothing: the thread stops depth+1 blocks ahead, not at the end."""
    src = Counting(os.urandom(32 << 20))
    with ReadAhead(src, block=1 << 20, depth=3):
        time.sleep(0.5)
        assert src.pos <= (3 + 1) << 20  # the queue's blocks and the one waiting to be put
    assert src.pos < len(src.data)


@pytest.mark.parametrize("exc", [http.client.IncompleteRead(b"x"), ConnectionResetError("reset"), OSError("io")])
def test_source_error_reaches_the_reader_with_its_type_after_the_good_bytes(exc: BaseException) -> None:
    data = os.urandom(1 << 20)
    with ReadAhead(Counting(data, fail_at=300_000, exc=exc), block=65536) as r:
        got = b""
        with pytest.raises(type(exc)):
            while True:
                chunk = r.read(50_000)
                assert chunk, "the end was reported instead of the error"
                got += chunk
        assert got == data[:300_000]  # every byte before the error, then the error


def test_early_close_stops_the_thread() -> None:
    src = Counting(os.urandom(32 << 20))
    r = ReadAhead(src, block=1 << 20, depth=2)
    assert len(r.read(100)) == 100
    r.close()
    assert not r._thread.is_alive()
    assert src.pos < len(src.data)
    assert r.read(10) == b""


def _save_bytes() -> bytes:
    return docker_save(sample_images())


def _parse(stream: object, tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path / "b"), fsync=False)
    store.adaptive = True
    with ReadAhead(stream, block=4096, depth=2) as r:
        read_docker_save(r, store)


def test_docker_save_through_read_ahead_matches_a_plain_read(tmp_path: Path) -> None:
    raw = _save_bytes()
    a = read_docker_save(io.BytesIO(raw), BlobStore(str(tmp_path / "a"), fsync=False))
    store = BlobStore(str(tmp_path / "b"), fsync=False)
    with ReadAhead(Counting(raw), block=4096, depth=2) as r:
        b = read_docker_save(r, store)
    assert [(i.refs, i.raw_config, i.layers) for i in a] == [(i.refs, i.raw_config, i.layers) for i in b]


def test_truncated_docker_save_is_one_clear_error(tmp_path: Path) -> None:
    raw = _save_bytes()
    with pytest.raises(SourceError, match="cut short"):
        _parse(Counting(raw[: len(raw) // 2]), tmp_path)
    assert [n for n in os.listdir(tmp_path / "b" / "blobs" / "sha256") if n.startswith(".tmp-")] == []


def test_engine_error_mid_stream_reaches_the_export(tmp_path: Path) -> None:
    raw = _save_bytes()
    with pytest.raises(http.client.IncompleteRead):
        _parse(Counting(raw, fail_at=len(raw) // 2, exc=http.client.IncompleteRead(b"")), tmp_path)
    assert [n for n in os.listdir(tmp_path / "b" / "blobs" / "sha256") if n.startswith(".tmp-")] == []


def test_member_whose_size_lies_is_refused(tmp_path: Path) -> None:
    """A layer member that claims more bytes than the stream holds: an error, never a short layer."""
    raw = bytearray(_save_bytes())
    with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("layer.tar"))
    header = member.offset
    size_field = raw[header + 124:header + 136]
    bigger = format(member.size + (1 << 20), "011o").encode() + b"\0"
    raw[header + 124:header + 136] = bigger
    chk = sum(raw[header:header + 148]) + 8 * 32 + sum(raw[header + 156:header + 512])
    raw[header + 148:header + 156] = format(chk, "06o").encode() + b"\0 "
    assert size_field != bigger
    with pytest.raises(SourceError, match="cut short"):
        _parse(Counting(bytes(raw)), tmp_path)
