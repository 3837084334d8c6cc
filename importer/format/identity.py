"""Which ID an engine gives a bundle image, and how its layers are keyed.

- Docker classic store and podman: image ID = config digest.
- Docker's containerd image store (Docker 25+ with the containerd snapshotter; the default
  from Docker 29): image ID = the digest of the manifest the engine holds. The importer loads an
  OCI archive of the bundle's own manifest there, so the ID is the bundle's manifest digest
  (checked exactly). Only a delta bundle still goes in as a docker-archive: that load goes
  through containerd's archive importer, which writes a Docker schema-2 manifest of its own: compact JSON, the config as
  ``application/vnd.docker.container.image.v1+json``, and every layer uncompressed
  (``application/vnd.docker.image.rootfs.diff.tar``, digest = diff_id, size = uncompressed size).
  :func:`docker_archive_manifest` rebuilds those bytes, so the ID is predictable.
- Bare containerd and an OCI layout keep the bundle's own manifest: ID = bundle manifest digest.
- A schema 1/2 bundle pins no manifest: outside a classic store, the config digest and the
  diff_ids say what the image is (:data:`DOCKER_ARCHIVE`).
"""

from __future__ import annotations

import hashlib
import json
from typing import List, Optional

from importer.format.digest import Digest
from importer.format.manifest import ImageRecord
from importer.format.mediatypes import DOCKER_CONFIG, DOCKER_MANIFEST

DOCKER_LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"

CLASSIC = "classic"
CONTAINERD = "containerd"
OCI = "oci"
#: Not an image store: the rule for a schema 1/2 bundle (one docker-archive, no manifest pinned)
#: loaded into anything but a classic store: config digest and diff_ids, uncompressed layer blobs.
DOCKER_ARCHIVE = "docker-archive"


def docker_archive_manifest(image: ImageRecord) -> bytes:
    """The manifest containerd's archive importer writes for this image loaded from a
    docker-archive (Go ``json.Marshal`` field order, no spaces)."""
    doc = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": DOCKER_CONFIG, "digest": str(image.config.digest), "size": image.config.size},
        "layers": [
            {"mediaType": DOCKER_LAYER_TAR, "digest": str(layer.diff_id), "size": layer.uncompressed_size}
            for layer in image.layers
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def docker_archive_manifest_digest(image: ImageRecord) -> str:
    return str(Digest.of_bytes(docker_archive_manifest(image)))


def loads_as_docker_archive(image: ImageRecord) -> bool:
    """On Docker's containerd store: a delta image with a left-out layer described uncompressed
    (digest = diff_id: made with --have from a Docker inventory) is loaded as a docker-archive (its
    ID is the manifest that load makes); every other one, deltas whose left-out layers name the
    compressed blobs included, as an OCI archive of the bundle's own manifest (ID = its digest).
    An image of a schema 1/2 bundle pins no manifest (its record names the config in its place):
    it is one docker-archive, loaded as such."""
    if image.manifest.digest == image.config.digest:  # no manifest pinned: a schema 1/2 bundle's image
        return True
    return any(layer.external and not layer.names_compressed_blob for layer in image.layers)


def expected_image_id(image_store: str, image: ImageRecord) -> Optional[str]:
    """The ID the engine must report for ``image``; None where only the diff_ids can say."""
    if image_store == CLASSIC:
        return str(image.config.digest)
    if image_store == OCI:
        return str(image.manifest.digest)
    if image_store == CONTAINERD and not loads_as_docker_archive(image):
        return str(image.manifest.digest)
    return None


def chain_ids(diff_ids: List[str]) -> List[str]:
    """Layer chain IDs (image-spec config.md): how Docker and containerd key unpacked layers
    (Docker's ``layerdb/sha256/<chain-id>``, containerd's snapshot names)."""
    out: List[str] = []
    for diff_id in diff_ids:
        if not out:
            out.append(diff_id)
        else:
            out.append("sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest())
    return out


def lookup_name(image_store: str, image: ImageRecord) -> str:
    """How to find an image the engine holds without a name (untagged in the bundle): by the
    ID the identity rule predicts."""
    if image_store == CONTAINERD and loads_as_docker_archive(image):
        return docker_archive_manifest_digest(image)
    return expected_image_id(image_store, image) or str(image.config.digest)
