"""The exporter parses both `docker save` layouts into the same bundle content."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bundle.blobstore import BlobStore
from bundle.exportloop import read_docker_save
from bundle.writer import write_bundle
from importer.errors import SourceError
from importer.verify.bundle import verify_bundle
from tests.kit.fakesave import FakeImage, docker_save, layer_tar, sample_images, sha


@pytest.mark.parametrize("layout", ["classic", "v25"])
def test_both_layouts_give_the_same_images(tmp_path: Path, layout: str) -> None:
    images = sample_images()
    store = BlobStore(str(tmp_path), fsync=False)
    got = read_docker_save(io.BytesIO(docker_save(images, layout)), store)
    assert [g.refs for g in got] == [("fake/base:1",), ("fake/app:2",)]
    for want, have in zip(images, got):
        assert have.raw_config == want.config  # byte for byte: the image ID survives
        assert [str(x.diff_id) for x in have.layers] == [f"sha256:{sha(x)}" for x in want.layers]
        assert [x.uncompressed_size for x in have.layers] == [len(x) for x in want.layers]
        assert have.platform == {"os": "linux", "architecture": "amd64"}


def test_layers_shared_between_images_are_stored_once(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path), fsync=False)
    read_docker_save(io.BytesIO(docker_save(sample_images())), store)
    blobs = [p for p in (tmp_path / "blobs" / "sha256").iterdir() if not p.name.startswith(".")]
    assert len(blobs) == 3  # base, empty, top: each compressed once, nothing left in temp files


def test_written_bundle_verifies(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save(sample_images(), "v25")), store)
    write_bundle(str(tmp_path), store, images, {"kind": "test"})
    report = verify_bundle(str(tmp_path))
    assert report.ok, report.problems
    assert report.layers_checked == 3


def test_gzip_layers(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save(sample_images())), store, compression="gzip")
    assert all(x.media_type.endswith("+gzip") for img in images for x in img.layers)
    write_bundle(str(tmp_path), store, images, {"kind": "test"})
    assert verify_bundle(str(tmp_path)).ok


def test_a_config_whose_diff_ids_disagree_is_refused(tmp_path: Path) -> None:
    class Liar(FakeImage):
        @property
        def config(self) -> bytes:
            return super().config.replace(sha(self.layers[0]).encode(), b"0" * 64)

    raw = docker_save([Liar("fake/bad:1", [layer_tar({"a": b"a"})])])
    with pytest.raises(SourceError, match="diff_ids differ"):
        read_docker_save(io.BytesIO(raw), BlobStore(str(tmp_path), fsync=False))


def test_a_stream_without_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"manifest\.json"):
        read_docker_save(io.BytesIO(layer_tar({"x": b"y"})), BlobStore(str(tmp_path), fsync=False))
