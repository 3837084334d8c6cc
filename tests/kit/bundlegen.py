"""Engine-free bundles for fast tests: fake `docker save` streams through the real exporter."""

from __future__ import annotations

import io
from pathlib import Path

from bundle.blobstore import BlobStore
from bundle.sources.docker_daemon import read_docker_save
from bundle.writer import write_bundle
from tests.kit.fakesave import FakeImage, docker_save, layer_tar, sample_images

FLEET_REFS = ("fleet/base:1", "fleet/app:2")  # fleet_bundle's images


def make_bundle(root: Path, *, compression: str = "zstd") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(str(root), fsync=False)
    images = read_docker_save(io.BytesIO(docker_save(sample_images())), store, compression=compression)
    write_bundle(str(root), store, images, {"kind": "test"})
    return root


def make_multiplatform_bundle(root: Path, *, layout: Path | None = None) -> Path:
    """A schema-3.2 bundle of one image index (linux/amd64, arm64, ppc64le: the layout
    layoutgen.write_layout writes) exported with ``--all-platforms``, engine-free."""
    from bundle.export import export_images
    from tests.kit.layoutgen import REF, write_layout

    layout = layout or root.parent / f"{root.name}.layout"
    write_layout(layout)
    export_images([f"oci:{layout}:{REF}"], str(root), compression="gzip", all_platforms=True)
    return root


def fleet_bundle(root: Path, seed: bytes = b"") -> Path:
    """Two small images sharing a layer, named fleet/base:1 and fleet/app:2; gzip layers, which
    Debian 12's Docker 20.10 can pull from a registry (it cannot pull zstd)."""
    base = layer_tar({"bin/tool": b"#!/bin/sh\necho tool\n" * 200 + seed, "etc/os-release": b"ID=fleet\n"})
    top = layer_tar({"app/main.py": b"print('fleet')\n" * 500 + seed})
    images = [FakeImage(FLEET_REFS[0], [base]), FakeImage(FLEET_REFS[1], [base, top])]
    root.mkdir(parents=True)
    store = BlobStore(str(root), fsync=False)
    found = read_docker_save(io.BytesIO(docker_save(images)), store, compression="gzip")
    write_bundle(str(root), store, found, {"kind": "test"})
    return root
