"""Engine-free bundles for fast tests: fake `docker save` streams through the real exporter."""

from __future__ import annotations

import io
from pathlib import Path

from bundle.blobstore import BlobStore
from bundle.sources.docker_daemon import read_docker_save
from bundle.writer import write_bundle
from tests.fakesave import docker_save, sample_images


def make_bundle(root: Path, *, compression: str = "zstd") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(str(root), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save(sample_images())), store, compression=compression)
    write_bundle(str(root), store, images, {"kind": "test"})
    return root
