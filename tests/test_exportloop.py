"""The one export loop (bundle/exportloop.py, issue 41 point 4) over a source that streams its
layers (``ExportSource.stream``, as ``docker save`` and Docker's classic store do): each layer
stored and its record sent back; a layer that hashes to another diff_id than the one expected, or
whose reader refuses it, given back as a LayerMismatch with nothing kept; a layer the offline
host holds hashed, not written; a failure met while storing thrown back into the source, which
names it in its own terms."""

from __future__ import annotations

import contextlib
import io
import tarfile
from pathlib import Path
from typing import Iterator, List

import pytest

from bundle.blobstore import BlobStore
from bundle.exportloop import Carry, run_feed
from bundle.sources import SourceImage
from bundle.sources.protocol import LayerFeed, LayerMismatch, LayerRefused, StreamedLayer
from importer.errors import SourceError
from importer.format.digest import Digest
from importer.format.manifest import LayerRecord


def _tar(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _opened(data: bytes) -> contextlib.AbstractContextManager[io.BytesIO]:
    return contextlib.nullcontext(io.BytesIO(data))


class _Refusing:
    def read(self, n: int = -1) -> bytes:
        raise LayerRefused("layer 1234: a file of another size")


@contextlib.contextmanager
def _refusing() -> Iterator[_Refusing]:
    yield _Refusing()


def _image(layers: List[LayerRecord]) -> SourceImage:
    return SourceImage(refs=("x:1",), raw_config=b"{}", layers=tuple(layers), platform={})


def test_a_batch_comes_back_stored_mismatched_or_refused(tmp_path: Path) -> None:
    good, bad = _tar("a", b"a" * 1000), _tar("b", b"b" * 1000)
    store = BlobStore(str(tmp_path / "b"), fsync=False)
    got: list = []

    def feed() -> LayerFeed:
        sent = yield [StreamedLayer("good", lambda: _opened(good), expected=Digest.of_bytes(good)),
                      StreamedLayer("bad", lambda: _opened(bad), expected=Digest.of_bytes(good)),
                      StreamedLayer("refused", _refusing, expected=Digest.of_bytes(bad))]
        got.extend(sent if isinstance(sent, list) else [sent])
        return [_image([r for r in got if isinstance(r, LayerRecord)])]

    images = run_feed(feed(), Carry(store, "zstd"))
    record, mismatch, refused = got
    assert isinstance(record, LayerRecord) and record.diff_id == Digest.of_bytes(good)
    assert mismatch == LayerMismatch(Digest.of_bytes(bad))
    assert refused == LayerMismatch(None, "layer 1234: a file of another size")
    assert [p.name for p in (tmp_path / "b" / "blobs" / "sha256").iterdir()] == [record.digest.hex]
    assert images[0].layers == (record,)


def test_a_layer_the_offline_host_holds_is_hashed_not_written(tmp_path: Path) -> None:
    held = _tar("h", b"h" * 5000)
    diff_id = Digest.of_bytes(held)
    store = BlobStore(str(tmp_path / "b"), fsync=False)

    def feed() -> LayerFeed:
        sent = yield StreamedLayer("held", lambda: _opened(held), expected=diff_id)
        assert isinstance(sent, LayerRecord)
        return [_image([sent])]

    image = run_feed(feed(), Carry(store, "zstd", have={diff_id: None}))[0]
    assert image.layers[0].external and image.layers[0].diff_id == diff_id
    assert image.layers[0].uncompressed_size == len(held)
    assert not store.written


def test_streamed_layers_the_host_holds_are_left_out_once_the_images_are_known(tmp_path: Path) -> None:
    """A ``docker save`` layer (no diff_id known ahead) is written as it passes, then discarded."""
    data = _tar("s", b"s" * 5000)
    store = BlobStore(str(tmp_path / "b"), fsync=False)

    def feed() -> LayerFeed:
        sent = yield StreamedLayer("saved", lambda: _opened(data))
        assert isinstance(sent, LayerRecord)
        return [_image([sent])]

    image = run_feed(feed(), Carry(store, "zstd", have={Digest.of_bytes(data): None}))[0]
    assert image.layers[0].external and not store.written


def test_a_failure_while_storing_is_thrown_back_into_the_source(tmp_path: Path) -> None:
    class Cut:
        def read(self, n: int = -1) -> bytes:
            raise ConnectionError("the engine went away")

    def feed() -> LayerFeed:
        try:
            yield StreamedLayer("cut", lambda: contextlib.nullcontext(Cut()))
        except ConnectionError as e:
            raise SourceError(f"exporting x:1: expected the whole stream, found it cut off ({e})") from e
        raise AssertionError("not reached")

    with pytest.raises(SourceError, match=r"found it cut off \(the engine went away\)"):
        run_feed(feed(), Carry(BlobStore(str(tmp_path / "b"), fsync=False), "zstd"))
