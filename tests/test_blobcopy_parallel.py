"""Layers of a blob-copy source (containerd content store, OCI layout) are read a few at a time by
the export loop (bundle/exportloop.py): bundle order kept, every blob streamed once, the first real
failure reported and the rest stopped."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterator, List

import pytest

from bundle import exportloop
from bundle.blobstore import BlobStore
from bundle.exportloop import Carry, carry_platform, read_layers
from bundle.sources import SourceImage
from bundle.sources.blobcopy import resolve_platform
from bundle.sources.records import ImageManifest
from importer.errors import SourceError

GZ = "application/vnd.oci.image.layer.v1.tar+gzip"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class SlowReader(io.RawIOBase):
    """A blob read in small pieces, slowly, counting what was read and how many are open at once."""

    def __init__(self, data: bytes, provider: FakeProvider, key: str) -> None:
        self.buf, self.provider, self.key = io.BytesIO(data), provider, key

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        time.sleep(self.provider.delay)
        chunk = self.buf.read(min(n if n and n > 0 else 1 << 30, 64 << 10))
        self.provider.read_bytes[self.key] = self.provider.read_bytes.get(self.key, 0) + len(chunk)
        return chunk


class FakeProvider:
    where = "a fake store"

    def __init__(self, blobs: Dict[str, bytes], delay: float = 0.002) -> None:
        self.blobs, self.delay = blobs, delay
        self.open_now = 0
        self.open_max = 0
        self.read_bytes: Dict[str, int] = {}
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def open_blob(self, digest: str, what: str) -> Iterator[BinaryIO]:
        with self.lock:
            self.open_now += 1
            self.open_max = max(self.open_max, self.open_now)
        try:
            yield SlowReader(self.blobs[digest], self, digest)  # type: ignore[misc]
        finally:
            with self.lock:
                self.open_now -= 1


def _image(layers: List[bytes], corrupt: int = -1) -> tuple:
    """(blobs, manifest): gzip layers of the given tar-ish payloads; layer ``corrupt`` is not gzip."""
    blobs: Dict[str, bytes] = {}
    descs, diff_ids = [], []
    for i, plain in enumerate(layers):
        packed = gzip.compress(plain, compresslevel=1, mtime=0)
        if i == corrupt:
            packed = packed[:10] + bytes(len(packed) - 10)  # a gzip header, then damage
        blobs[_digest(packed)] = packed
        descs.append({"mediaType": GZ, "digest": _digest(packed), "size": len(packed)})
        diff_ids.append(_digest(plain))
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    blobs[_digest(config)] = config
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                           "size": len(config)}, "layers": descs}
    return blobs, manifest


def copy_image(provider: FakeProvider, manifest: ImageManifest, refs: tuple, store: BlobStore, *,
               compression: str, level: None, what: str) -> SourceImage:
    """One image as the export loop carries it: resolved (config read), then its layers copied."""
    return carry_platform(provider, resolve_platform(provider, manifest, what), refs, Carry(store, compression, level),
                          {})


def _typed(manifest: Dict[str, Any]) -> ImageManifest:
    return ImageManifest.parse(json.dumps(manifest).encode(), "the test's manifest")


def test_layers_are_read_in_parallel_and_kept_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    payloads = [os.urandom(300_000) + b"layer %d" % i for i in range(5)]
    blobs, manifest = _image(payloads)
    provider = FakeProvider(blobs)
    store = BlobStore(str(tmp_path / "b"), fsync=False)
    raw = json.dumps(manifest).encode()
    image = copy_image(provider, ImageManifest.parse(raw, "x:1"), ("x:1",), store, compression="zstd", level=None,
                       what="exporting x:1")
    assert [str(layer.digest) for layer in image.layers] == [d["digest"] for d in manifest["layers"]]
    assert [str(layer.diff_id) for layer in image.layers] == [_digest(p) for p in payloads]
    assert image.raw_manifest == raw  # the manifest is kept: every blob carried as described
    assert 2 <= provider.open_max <= exportloop.MAX_LAYER_WORKERS
    for d in manifest["layers"]:  # each blob read once, all of it, and stored byte for byte
        assert provider.read_bytes[d["digest"]] == d["size"]
        assert (tmp_path / "b" / "blobs" / "sha256" / d["digest"][7:]).read_bytes() == blobs[d["digest"]]


def test_one_core_reads_one_layer_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    blobs, manifest = _image([os.urandom(50_000) for _ in range(3)])
    provider = FakeProvider(blobs, delay=0)
    copy_image(provider, _typed(manifest), ("x:1",), BlobStore(str(tmp_path / "b"), fsync=False), compression="zstd",
               level=None, what="exporting x:1")
    assert provider.open_max == 1


def test_a_damaged_layer_is_named_and_stops_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    big = os.urandom(4 << 20)  # slow to read: stopped long before its end
    blobs, manifest = _image([big, b"small" * 1000, big + b"2"], corrupt=1)
    provider = FakeProvider(blobs, delay=0.005)
    store_dir = tmp_path / "b"
    with pytest.raises(SourceError) as err:
        copy_image(provider, _typed(manifest), ("x:1",), BlobStore(str(store_dir), fsync=False), compression="zstd",
                   level=None, what="exporting x:1")
    msg = str(err.value)
    assert "layer 2/3" in msg and "gzip stream" in msg, msg
    big_ones = [manifest["layers"][0]["digest"], manifest["layers"][2]["digest"]]
    assert all(provider.read_bytes.get(d, 0) < len(big) // 2 for d in big_ones), provider.read_bytes
    assert not [p for p in (store_dir / "blobs" / "sha256").iterdir() if p.name.startswith(".tmp-")]


def test_the_first_real_failure_is_raised_not_a_stopped_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    started = threading.Barrier(2)

    def job(n: int, guard: Any) -> int:
        src = guard(io.BytesIO(b"x" * 1000))
        started.wait(timeout=10)
        if n == 1:
            raise SourceError("layer 2: broken")
        while src.read(1):  # stopped once job 1 failed
            time.sleep(0.01)
        return n

    with pytest.raises(SourceError, match="layer 2: broken"):
        read_layers([0, 1], job)
    assert read_layers([3, 1, 2], lambda n, guard: n * 10) == [30, 10, 20]
