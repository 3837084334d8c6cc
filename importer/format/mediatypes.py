"""Media types the bundle writes and reads."""

from __future__ import annotations

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

LAYER_TYPES = (OCI_LAYER_TAR, OCI_LAYER_GZIP, OCI_LAYER_ZSTD, DOCKER_LAYER_GZIP)

REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


def compression_of(media_type: str) -> str:
    """'zstd', 'gzip' or 'none' for a layer media type."""
    if media_type.endswith("+zstd"):
        return "zstd"
    if media_type.endswith("+gzip") or media_type.endswith(".tar.gzip"):
        return "gzip"
    return "none"
