"""The docker-archive the Docker sink streams into ``docker load`` (importer/sinks/dockerarchive.py),
on an image of many small layers (issue 44 point 3): the next layer is read, checked and
decompressed while the one before it is sent, the archive stays the same bytes in the same order,
a failing layer still never completes its member, and no thread outlives a failed stream."""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
import threading
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from importer.errors import DecompressFailed, DiffIDMismatch, DigestMismatch
from importer.input.opened import open_bundle
from importer.sinks import dockerarchive
from importer.sinks.dockerarchive import write_docker_archive
from tests.kit.bundlegen import many_layers_bundle
from tests.kit.fuzzkit import flip_byte


def _ahead_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("layer ahead")]


def test_every_layer_goes_out_whole_in_order_as_its_diff_id(tmp_path: Path) -> None:
    bundle = many_layers_bundle(tmp_path / "b", 12)
    images = open_bundle(str(bundle)).manifest().images
    out = io.BytesIO()
    write_docker_archive(out, str(bundle), images, with_tags=True)
    layers = images[0].layers
    with tarfile.open(fileobj=io.BytesIO(out.getvalue()), mode="r:") as tar:
        names = tar.getnames()
        assert names == [f"{images[0].config.digest.hex}.json"] + [
            f"{x.diff_id.hex}/layer.tar" for x in layers] + ["manifest.json"]
        for x in layers:
            member = tar.extractfile(f"{x.diff_id.hex}/layer.tar")
            assert member is not None
            data = member.read()
            assert len(data) == x.uncompressed_size and str(x.diff_id) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert not _ahead_threads()


def test_the_next_layer_is_read_while_one_is_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Layer 2's blob is opened before layer 1's member is complete: an image of many small layers
    does not wait at each layer's start for its first chunk nor at its end for its checks."""
    bundle = many_layers_bundle(tmp_path / "b", 4)
    images = open_bundle(str(bundle)).manifest().images
    second = images[0].layers[1]
    opened = threading.Event()
    real = dockerarchive.open_layer

    @contextlib.contextmanager
    def recording(root: Any, layer: Any, what: str, **kw: Any) -> Iterator[Any]:
        if layer.digest == second.digest:
            opened.set()
        with real(root, layer, what, **kw) as reader:
            yield reader

    monkeypatch.setattr(dockerarchive, "open_layer", recording)
    first = images[0].layers[0]
    seen: List[bool] = []

    class Out(io.BytesIO):
        def write(self, data: Any) -> int:
            if not seen and bytes(data).startswith(f"{second.diff_id.hex}/layer.tar".encode()):
                seen.append(False)  # the header of layer 2 before anything of layer 2 was read
            n = super().write(data)
            if not seen and bytes(data).startswith(f"{first.diff_id.hex}/layer.tar".encode()):
                seen.append(opened.wait(5))  # layer 1's header went out: layer 2 is read beside it
            return n

    write_docker_archive(Out(), str(bundle), images, with_tags=True)
    assert seen and seen[0], "layer 2 was opened only once layer 1 was sent"


@pytest.mark.parametrize("bad", [0, 5, 11])
def test_a_changed_layer_among_many_never_completes_its_member(tmp_path: Path, bad: int) -> None:
    bundle = many_layers_bundle(tmp_path / "b", 12)
    images = open_bundle(str(bundle)).manifest().images
    layer = images[0].layers[bad]
    flip_byte(bundle / layer.digest.blob_path)
    out = io.BytesIO()
    with pytest.raises((DigestMismatch, DecompressFailed, DiffIDMismatch)) as err:
        write_docker_archive(out, str(bundle), images, with_tags=True)
    assert str(layer.digest) in err.value.message
    raw = out.getvalue()
    header = raw.find(f"{layer.diff_id.hex}/layer.tar".encode())
    assert header >= 0, "the layers before it went out"
    assert len(raw) - header < 512 + layer.uncompressed_size, "its member was completed"
    assert b"manifest.json" not in raw
    for later in images[0].layers[bad + 1:]:
        assert f"{later.diff_id.hex}/layer.tar".encode() not in raw
    assert not _ahead_threads()


def test_a_consumer_that_fails_stops_every_layer_read(tmp_path: Path) -> None:
    """The engine hangs up in the middle: the write's error is raised, and the threads reading
    the layers ahead end (none is left blocked on its full queue)."""
    bundle = many_layers_bundle(tmp_path / "b", 12)
    images = open_bundle(str(bundle)).manifest().images

    class Broken(io.BytesIO):
        def write(self, data: Any) -> int:
            if self.tell() > 3 << 20:
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(data)

    with pytest.raises(BrokenPipeError):
        write_docker_archive(Broken(), str(bundle), images, with_tags=True)
    assert not _ahead_threads()
