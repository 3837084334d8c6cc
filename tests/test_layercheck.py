"""The diff_id check beside a stream (importer/input/layercheck.py) and the OCI archive that uses
it for Docker's containerd store: hostile layers (a wrong diff_id, a truncated blob, damaged
compression, a bomb past the recorded size) are refused, the producer never blocks on a checker
that already failed, and the archive stops before index.json, so an engine names nothing."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard

from importer.errors import DecompressFailed, DiffIDMismatch, DigestMismatch, LimitExceeded, SizeMismatch
from importer.format.digest import CHUNK, Digest
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import OCI_LAYER_GZIP, OCI_LAYER_ZSTD
from importer.input.layercheck import LayerCheck
from importer.input.layers import ReadAhead, open_layer
from importer.input.opened import open_bundle
from importer.sinks.dockerarchive import write_docker_archive
from importer.sinks.ociarchive import write_oci_archive
from tests.kit.bundlegen import big_bundle, lying_bundle, make_bundle
from tests.kit.fuzzkit import flip_byte
from tests.kit.helpers import run_cli
from tests.kit.trustkit import regenerate_sums


def _tar(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("f.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _record(plain: bytes, blob: bytes, media_type: str = OCI_LAYER_ZSTD, *, diff_id: Digest | None = None,
            uncompressed_size: int | None = None) -> LayerRecord:
    return LayerRecord(media_type=media_type, digest=Digest.of_bytes(blob), size=len(blob),
                       diff_id=diff_id or Digest.of_bytes(plain),
                       uncompressed_size=len(plain) if uncompressed_size is None else uncompressed_size)


def _feed_all(check: LayerCheck, blob: bytes, chunk: int = 64 * 1024) -> None:
    for start in range(0, len(blob), chunk):
        check.feed(blob[start:start + chunk])


PLAIN = _tar(os.urandom(3 * 1024 * 1024) + b"compressible " * 100_000)
ZSTD = zstandard.ZstdCompressor(level=3).compress(PLAIN)
GZIP = gzip.compress(PLAIN, compresslevel=1)


@pytest.mark.parametrize("blob,media_type", [(ZSTD, OCI_LAYER_ZSTD), (GZIP, OCI_LAYER_GZIP)], ids=["zstd", "gzip"])
def test_a_true_layer_passes(blob: bytes, media_type: str) -> None:
    check = LayerCheck(_record(PLAIN, blob, media_type), "layer 1/1 of t")
    _feed_all(check, blob)
    check.finish()


def test_a_wrong_diff_id_is_named() -> None:
    liar = Digest.of_bytes(b"something else")
    check = LayerCheck(_record(PLAIN, ZSTD, diff_id=liar), "layer 1/1 of t")
    _feed_all(check, ZSTD)
    with pytest.raises(DiffIDMismatch) as err:
        check.finish()
    assert str(liar) in err.value.message and str(Digest.of_bytes(PLAIN)) in err.value.message


def test_a_short_uncompressed_size_is_a_bomb_refused_at_the_bound() -> None:
    check = LayerCheck(_record(PLAIN, ZSTD, uncompressed_size=len(PLAIN) // 2), "layer 1/1 of t")
    with pytest.raises(LimitExceeded):
        _feed_all(check, ZSTD)  # fails early (feed raises) or at the end
        check.finish()


def test_a_long_uncompressed_size_is_refused() -> None:
    check = LayerCheck(_record(PLAIN, ZSTD, uncompressed_size=len(PLAIN) + 1), "layer 1/1 of t")
    _feed_all(check, ZSTD)
    with pytest.raises(SizeMismatch):
        check.finish()


@pytest.mark.parametrize("blob,media_type", [(ZSTD, OCI_LAYER_ZSTD), (GZIP, OCI_LAYER_GZIP)], ids=["zstd", "gzip"])
def test_a_truncated_blob_is_refused(blob: bytes, media_type: str) -> None:
    check = LayerCheck(_record(PLAIN, blob, media_type), "layer 1/1 of t")
    _feed_all(check, blob[: len(blob) // 2])
    with pytest.raises((DecompressFailed, SizeMismatch, DigestMismatch)):
        check.finish()


def test_bad_compression_fails_early_and_never_blocks_the_producer() -> None:
    """Garbage where a zstd frame should be: the checker fails on its first chunk; feeding many
    more chunks than its queue holds neither hangs nor goes unnoticed."""
    garbage = os.urandom(len(ZSTD))
    check = LayerCheck(_record(PLAIN, garbage), "layer 1/1 of t")
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            for _ in range(100):  # 100 x 64 KiB: far past the queue's depth
                check.feed(garbage[:64 * 1024])
            check.finish()
        except BaseException as e:
            failed.append(e)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the producer blocked on a checker that had failed"
    assert failed and isinstance(failed[0], DecompressFailed), failed


def test_close_without_finish_stops_the_thread() -> None:
    check = LayerCheck(_record(PLAIN, ZSTD), "layer 1/1 of t")
    check.feed(ZSTD[:1000])
    check.close()  # the stream failed elsewhere: no verdict, no hang
    assert not check._thread.is_alive()


def test_the_oci_archive_stops_before_index_json_on_a_lying_layer(tmp_path: Path) -> None:
    """A bundle whose every digest matches but one layer's diff_id is a lie: the archive for
    Docker's containerd store raises while that layer passes and never writes index.json."""
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    images = open_bundle(str(bundle)).manifest().images
    out = io.BytesIO()
    with pytest.raises(DiffIDMismatch) as err:
        write_oci_archive(out, str(bundle), [(img, f"docker.io/{img.refs[0]}") for img in images],
                          index_last=True, check_layers=True)
    assert diff_id in err.value.message
    names = _member_names(out.getvalue())
    assert "index.json" not in names and "manifest.json" not in names
    assert any(n.startswith("blobs/sha256/") for n in names)  # it did stream, and stopped


def test_the_oci_archive_of_a_true_bundle_is_whole(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    images = open_bundle(str(bundle)).manifest().images
    out = io.BytesIO()
    write_oci_archive(out, str(bundle), [(img, f"docker.io/{img.refs[0]}") for img in images],
                      index_last=True, check_layers=True)
    names = _member_names(out.getvalue())
    assert names[-1] == "index.json"
    for image in images:
        for layer in image.layers:
            assert layer.digest.blob_path in names
    # each layer member is the bundle's compressed blob, byte for byte
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        layer = images[0].layers[0]
        member = tar.extractfile(layer.digest.blob_path)
        assert member is not None
        assert "sha256:" + hashlib.sha256(member.read()).hexdigest() == str(layer.digest)


def _member_names(raw: bytes) -> list[str]:
    names = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tar:
        try:
            for member in tar:
                names.append(member.name)
        except tarfile.ReadError:
            pass  # a cut archive: the members before the cut
    return names


def test_the_oci_archive_stops_before_index_json_on_a_layer_blob_changed_after_verification(tmp_path: Path) -> None:
    """The checker counts the compressed bytes but leaves their digest to the stream that feeds
    it (each byte hashed once): a layer blob flipped after verification is still refused there."""
    bundle = make_bundle(tmp_path / "b")
    images = open_bundle(str(bundle)).manifest().images
    layer = images[0].layers[0]
    path = bundle / layer.digest.blob_path
    flip_byte(path)
    out = io.BytesIO()
    with pytest.raises((DigestMismatch, DecompressFailed, DiffIDMismatch)) as err:
        write_oci_archive(out, str(bundle), [(img, f"docker.io/{img.refs[0]}") for img in images],
                          index_last=True, check_layers=True)
    assert str(layer.digest) in err.value.message
    assert "index.json" not in _member_names(out.getvalue())


def test_read_ahead_hands_over_every_byte_hashed_and_stops_early_without_blocking(tmp_path: Path) -> None:
    """The classic store's read-ahead (importer/input/layers.py ReadAhead): the same bytes, the
    blob's digest and count from its own thread; a consumer that stops early never leaves the
    thread blocked on its full queue; an error of the read is raised in the consumer."""
    blob = os.urandom(5 * 1024 * 1024 + 123)
    path = tmp_path / "blob"
    path.write_bytes(blob)
    with path.open("rb") as f:
        reader = ReadAhead(f)
        got = bytearray()
        while True:
            data = reader.read(300_000 if len(got) < 2_000_000 else -1)
            if not data:
                break
            got += data
        reader.stop()
    assert bytes(got) == blob and reader.count == len(blob) and reader.digest() == Digest.of_bytes(blob)
    with path.open("rb") as f:
        early = ReadAhead(f, depth=1)
        assert early.read(10) == blob[:10]
        early.stop()  # the thread was blocked on its queue: it ends
        assert not early._thread.is_alive()

    class Broken:
        def read(self, n: int = -1) -> bytes:
            raise OSError(5, "Input/output error")

    failing = ReadAhead(Broken())
    with pytest.raises(OSError, match="Input/output error"):
        failing.read(10)
    failing.stop()


def test_a_lying_layer_read_ahead_is_still_refused(tmp_path: Path) -> None:
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    image = open_bundle(str(bundle)).manifest().images[-1]
    layer = image.layers[-1]
    with pytest.raises(DiffIDMismatch) as err, open_layer(str(bundle), layer, "the lying layer",
                                                          read_ahead=True) as reader:
        reader.finish()
    assert diff_id in err.value.message


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("archive", ["oci", "docker"])
def test_a_layer_blob_changed_after_verification_never_completes_its_member(
        tmp_path: Path, archive: str, compression: str) -> None:
    """Into Docker the layer blobs' bytes are checked in the load stream, not before it (each is
    read once): so a blob's last chunk is sent only once its digest, size and diff_id matched. An
    engine that commits a blob as soon as all its bytes arrived (containerd's content store)
    never gets a complete one that failed, stored (digest = diff_id, hashed once) or compressed."""
    bundle = big_bundle(tmp_path / "b", compression=compression)
    images = open_bundle(str(bundle)).manifest().images
    layer = images[1].layers[1]
    assert layer.size > 2 * CHUNK
    path = bundle / layer.digest.blob_path
    flip_byte(path)
    out = io.BytesIO()
    with pytest.raises((DigestMismatch, DecompressFailed, DiffIDMismatch)) as err:
        if archive == "oci":
            write_oci_archive(out, str(bundle), [(img, f"docker.io/{img.refs[0]}") for img in images],
                              index_last=True, check_layers=True)
        else:
            write_docker_archive(out, str(bundle), images)
    assert str(layer.digest) in err.value.message
    raw = out.getvalue()
    name, size = ((layer.digest.blob_path, layer.size) if archive == "oci"
                  else (f"{layer.diff_id.hex}/layer.tar", layer.uncompressed_size))
    header = raw.find(name.encode())
    assert header >= 0 and header % 512 == 0, "the member was begun: its bytes went out as they were read"
    sent = len(raw) - header - 512
    assert 0 <= sent < size, f"{sent} of {size} bytes of the changed blob were sent"
    assert "index.json" not in _member_names(raw) and b"manifest.json" not in raw


def test_a_stored_layer_whose_diff_id_is_not_its_digest_is_refused_by_the_parser(tmp_path: Path) -> None:
    """A layer stored uncompressed is its own diff_id, so the load streams hash it once for both:
    bundle.json naming another diffId or uncompressedSize for it is refused when it is parsed
    (invalid-manifest, exit 4), before any byte is read."""
    for field, lie in (("diffId", "sha256:" + "0" * 64), ("uncompressedSize", None)):
        bundle = big_bundle(tmp_path / field)
        doc = json.loads((bundle / "bundle.json").read_text())
        layer = doc["images"][1]["layers"][1]
        layer[field] = layer["size"] + 1 if lie is None else lie
        (bundle / "bundle.json").write_text(json.dumps(doc))
        regenerate_sums(bundle)
        proc = run_cli("importer", str(bundle), "--verify-only")
        assert proc.returncode == 4 and "error[invalid-manifest]" in proc.stderr, proc.stderr
        assert "digest = diffId" in proc.stderr, proc.stderr
