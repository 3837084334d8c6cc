"""Image references as engines spell them.

Docker accepts short names (``app:1``) and shows them short; containerd and podman store the
full name (``docker.io/library/app:1``). :func:`normalize` is Docker's own rule
(distribution/reference ``ParseNormalizedNamed`` + default tag), so the same bundle ref names the
same image on every engine."""

from __future__ import annotations

from typing import Tuple

from importer.format.reference import (
    DOCKER_HUB,
    DOCKER_HUB_LEGACY,
    OFFICIAL_PREFIX,
    engine_host,
    official_path,
    split_host_path,
    split_reference,
)


def has_domain(name: str) -> bool:
    """The repository name starts with a registry (``reg.example/x``, ``localhost/x``, ``h:5000/x``)."""
    return bool(split_host_path(name, engine_host)[0])


def split_domain(name: str) -> Tuple[str, str]:
    """(domain, path) of a repository name without tag or digest."""
    domain, path = split_host_path(name, engine_host)
    domain = domain or DOCKER_HUB
    if domain == DOCKER_HUB_LEGACY:  # Docker's rule: registry-1.docker.io stays a host of its own
        domain = DOCKER_HUB
    if domain == DOCKER_HUB:
        path = official_path(path)
    return domain, path


def split_ref(ref: str) -> Tuple[str, str, str]:
    """(repository, tag, digest) of ``ref``; tag and digest may be empty."""
    return split_reference(ref)


def normalize(ref: str) -> str:
    """``app:1`` -> ``docker.io/library/app:1``; ``app`` -> ``docker.io/library/app:latest``;
    ``registry:5000/x/y@sha256:..`` stays as it is."""
    name, tag, digest = split_ref(ref)
    domain, path = split_domain(name)
    full = f"{domain}/{path}"
    if tag:
        full += f":{tag}"
    if digest:
        full += f"@{digest}"
    if not tag and not digest:
        full += ":latest"
    return full


def familiar(ref: str) -> str:
    """The short form Docker prints: ``docker.io/library/app:1`` -> ``app:1``."""
    full = normalize(ref)
    for prefix in (f"{DOCKER_HUB}/{OFFICIAL_PREFIX}", f"{DOCKER_HUB}/"):
        if full.startswith(prefix):
            return full[len(prefix):]
    return full
