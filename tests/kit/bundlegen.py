"""Engine-free bundles for fast tests: fake `docker save` streams through the real exporter."""

from __future__ import annotations

import io
from pathlib import Path

from bundle.blobstore import BlobStore
from bundle.sources.docker_daemon import read_docker_save
from bundle.writer import write_bundle
from tests.kit.fakesave import docker_save, sample_images


def make_bundle(root: Path, *, compression: str = "zstd") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(str(root), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save(sample_images())), store, compression=compression)
    write_bundle(str(root), store, images, {"kind": "test"})
    return root


def make_multiplatform_bundle(root: Path, *, layout: Path | None = None) -> Path:
    """A schema-3.2 bundle of one image index (linux/amd64, arm64, ppc64le: the layout
    tests/test_multiplatform.py writes) exported with ``--all-platforms``, engine-free."""
    from bundle.export import export_images
    from tests.test_multiplatform import REF, write_layout

    layout = layout or root.parent / f"{root.name}.layout"
    write_layout(layout)
    export_images([f"oci:{layout}:{REF}"], str(root), compression="gzip", all_platforms=True)
    return root
