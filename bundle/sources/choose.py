"""Which source an export reads from, by the references' transport prefix (skopeo's spelling):
``docker-daemon:REF`` or a bare ``REF`` (the Docker engine), ``containerd:REF`` (containerd's
content store, blobs copied as stored), ``oci:DIR[:REF]`` (an OCI image layout),
``docker://HOST[:PORT]/REPO:TAG`` (a registry, bundle/sources/registry.py)."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

from bundle.sources.containerd import ContainerdSource
from bundle.sources.docker_daemon import DockerDaemonSource
from bundle.sources.oci_layout import OciLayoutSource, split_oci_ref
from bundle.sources.protocol import ExportSource
from bundle.sources.registry import RegistrySource
from importer.errors import UsageError
from importer.format.reference import parse_reference, split_transport
from importer.registry.access import RegistryAccess

#: the transports bundle export reads (reference.TRANSPORTS also names those it refuses)
TRANSPORTS = ("docker-daemon", "containerd", "oci", "docker")


def transport_of(ref: str) -> Tuple[str, str]:
    """(transport, the reference as that source names it); a bare reference is Docker's."""
    head, rest = split_transport(ref)
    if head == "docker":
        if not rest.startswith("//") or len(rest) <= 2:
            raise UsageError(f"exporting {ref}: expected docker://HOST[:PORT]/REPO:TAG (or @sha256:...), "
                             f"found {ref!r}", hint="a registry image is written with two slashes: docker://...")
        return head, rest[2:]
    if head in TRANSPORTS:
        return head, rest
    if head:  # oci-archive:, docker-archive:, podman:, dir:
        raise UsageError(f"exporting {ref}: the {head}: source is not supported by bundle export",
                         hint="use docker-daemon:REF (or a bare REF), containerd:REF, oci:DIR[:REF] or "
                              "docker://HOST/REPO:TAG; for an archive, `skopeo copy` it into oci:DIR first")
    if _names_a_folder(ref):
        raise UsageError(f"exporting {ref}: expected an image reference (Docker's, without a transport prefix), "
                         "found a folder of that name",
                         hint=f"an OCI image layout is read with the oci: prefix: oci:{ref} (or oci:{ref}:TAG)")
    return "docker-daemon", ref


def _names_a_folder(ref: str) -> bool:
    """A bare reference that is an existing folder: a path (``./x``, ``/x``, ``~/x``, ``x/``) or a
    folder holding an OCI layout. A bare name beside an unrelated folder of that name stays Docker's."""
    path = os.path.expanduser(ref)
    if not os.path.isdir(path):
        return False
    looks_like_path = ref.startswith(("/", ".", "~")) or ref.endswith("/")
    return looks_like_path or os.path.isfile(os.path.join(path, "oci-layout"))


def open_source(refs: Sequence[str], *, docker_host: Optional[str] = None,
                address: Optional[str] = None, namespace: Optional[str] = None,
                access: Optional[RegistryAccess] = None,
                docker_read: str = "auto") -> Tuple[ExportSource, List[str]]:
    """(source, refs as that source names them: an OCI layout's "" is its one image). All
    references must come from one source. ``docker_read`` (``--docker-read``): how a Docker
    source reads its images (bundle/sources/docker_store.py)."""
    parsed = [transport_of(r) for r in refs]
    kinds = sorted({k for k, _ in parsed})
    if len(kinds) > 1:
        raise UsageError(f"exporting {', '.join(refs)}: expected images from one source, found {', '.join(kinds)}",
                         hint="export each source into its own bundle")
    kind = kinds[0]
    if access is not None and access.named() and kind != "docker":
        raise UsageError(f"exporting from {kind} with registry options (--insecure, --username, --authfile, "
                         "--cert-dir, --allow-realm-credentials): expected a docker:// (registry) source",
                         hint="they say how to reach a registry; drop them for other sources")
    if docker_read != "auto" and kind != "docker-daemon":
        raise UsageError(f"exporting from {kind} with --docker-read {docker_read}: expected a Docker source",
                         hint="--docker-read says how Docker's images are read; drop it for other sources")
    if kind in ("docker", "containerd", "docker-daemon"):
        for _, r in parsed:  # one parser says which part of a bad reference is wrong
            parse_reference(r, what="exporting: reading the image reference")
    if kind == "docker":
        names = [r for _, r in parsed]
        return RegistrySource(names, access=access), names
    if kind == "containerd":
        return ContainerdSource(address, namespace), [r for _, r in parsed]
    if kind == "oci":
        split = [split_oci_ref(r) for _, r in parsed]
        dirs = sorted({os.path.abspath(d) for d, _ in split})
        if len(dirs) > 1:
            raise UsageError(f"exporting {', '.join(refs)}: expected images from one OCI layout, "
                             f"found {len(dirs)} ({', '.join(dirs)})", hint="export each layout into its own bundle")
        return OciLayoutSource(dirs[0]), [r for _, r in split]
    if address or namespace:
        raise UsageError("exporting from Docker: --address/--namespace name a containerd source",
                         hint="prefix the images with containerd: to read them from containerd")
    return DockerDaemonSource(docker_host, docker_read), [r for _, r in parsed]
