"""--compression auto (BlobStore.adaptive): a layer whose start does not compress is stored
uncompressed (media type ...layer.v1.tar, digest = diff_id); one that compresses stays zstd/gzip;
a compression asked explicitly is always applied. Checked on the bytes that land in the store."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
from pathlib import Path

import pytest
import zstandard

from bundle.blobstore import SAMPLE, BlobStore, compresses
from importer.format.mediatypes import OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD


def _text(n: int) -> bytes:
    line = b"libfoo.so.1 => /usr/lib/x86_64-linux-gnu/libfoo.so.1 (0x00007f0000000000)\n"
    return (line * (n // len(line) + 1))[:n]


def _store(tmp_path: Path, adaptive: bool) -> BlobStore:
    store = BlobStore(str(tmp_path / "b"), fsync=False)
    store.adaptive = adaptive
    return store


def _blob(store: BlobStore, digest: str) -> bytes:
    return (Path(store.root) / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()


def test_random_layer_is_stored_as_it_is(tmp_path: Path) -> None:
    data = os.urandom(SAMPLE + 3 * 1024 * 1024 + 17)  # longer than the sample: the rest follows it
    store = _store(tmp_path, adaptive=True)
    seen: list[int] = []
    rec = store.write_layer(io.BytesIO(data), on_bytes=seen.append)
    assert rec.media_type == OCI_LAYER_TAR
    assert str(rec.digest) == str(rec.diff_id) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert rec.size == rec.uncompressed_size == len(data) == sum(seen)
    assert _blob(store, str(rec.digest)) == data
    assert store.stored == [str(rec.diff_id)]


def test_short_random_layer_is_stored_too(tmp_path: Path) -> None:
    data = os.urandom(70_000)  # shorter than one read
    rec = _store(tmp_path, adaptive=True).write_layer(io.BytesIO(data))
    assert rec.media_type == OCI_LAYER_TAR and rec.size == len(data)


@pytest.mark.parametrize("compression,media_type", [("zstd", OCI_LAYER_ZSTD), ("gzip", OCI_LAYER_GZIP)])
def test_compressible_layer_stays_compressed(tmp_path: Path, compression: str, media_type: str) -> None:
    data = _text(SAMPLE * 2 + 5)
    store = _store(tmp_path, adaptive=True)
    rec = store.write_layer(io.BytesIO(data), compression=compression)
    assert rec.media_type == media_type
    assert rec.size < len(data) // 4
    blob = _blob(store, str(rec.digest))
    plain = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read() if compression == "zstd" \
        else gzip.decompress(blob)
    assert plain == data
    assert str(rec.diff_id) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert store.stored == []


def test_asked_compression_compresses_random_data_anyway(tmp_path: Path) -> None:
    data = os.urandom(2 * 1024 * 1024)
    rec = _store(tmp_path, adaptive=False).write_layer(io.BytesIO(data), compression="zstd")
    assert rec.media_type == OCI_LAYER_ZSTD
    assert rec.digest != rec.diff_id


def test_judged_on_the_start_only(tmp_path: Path) -> None:
    """The rule reads only the first SAMPLE bytes (held in memory while judged): a random start
    stores the whole layer, a compressible start compresses it whole."""
    store = _store(tmp_path, adaptive=True)
    random_first = store.write_layer(io.BytesIO(os.urandom(SAMPLE) + _text(SAMPLE)))
    text_first = store.write_layer(io.BytesIO(_text(SAMPLE) + os.urandom(SAMPLE)))
    assert random_first.media_type == OCI_LAYER_TAR
    assert text_first.media_type == OCI_LAYER_ZSTD


def test_empty_layer_is_compressed(tmp_path: Path) -> None:
    rec = _store(tmp_path, adaptive=True).write_layer(io.BytesIO(b"\0" * 1024))
    assert rec.media_type == OCI_LAYER_ZSTD and rec.uncompressed_size == 1024


def test_compresses_threshold() -> None:
    assert compresses(b"")
    assert compresses(_text(100_000))
    assert not compresses(os.urandom(100_000))
    half = os.urandom(50_000) + b"\0" * 50_000  # saves about half: worth it
    assert compresses(half)


def test_a_failing_source_leaves_no_temp_file(tmp_path: Path) -> None:
    class Broken(io.RawIOBase):
        def __init__(self) -> None:
            self.n = 0

        def read(self, size: int = -1) -> bytes:
            self.n += 1
            if self.n > 6:
                raise OSError("daemon went away")
            return os.urandom(1024 * 1024)

    store = _store(tmp_path, adaptive=True)
    with pytest.raises(OSError, match="daemon went away"):
        store.write_layer(Broken())
    assert os.listdir(store.dir) == []
