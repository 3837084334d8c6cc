"""Shared pytest fixtures."""

from __future__ import annotations

# --- engine infrastructure (docker/scripts/dockerd.sh via tests/engines.py) ----------------
# docker_host      session: private dockerd "test-overlay2" (default storage driver)
# docker_host_vfs  session, lazy: private dockerd "test-vfs" (--storage-driver vfs)
# busybox          session: path of a statically linked busybox
# Each dockerd is wiped and started at first use and stopped (by pid, through the
# script) at session end. Missing tools: skip locally, FAIL under CI=true.
import os
from collections.abc import Iterator

import pytest

try:  # tests/ as a package
    from . import engines
except ImportError:  # tests/ as a plain rootdir (pytest's default "prepend" import mode)
    import engines  # type: ignore[no-redef]


def _instance_name(base: str) -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # keep xdist workers apart
    return f"{base}-{worker}" if worker else base


def _private_dockerd(base: str, *extra: str) -> Iterator[str]:
    engines.require_root("starting a private dockerd")
    for tool in ("dockerd", "containerd", "runc", "docker"):
        engines.require(tool)
    name = _instance_name(base)
    try:
        url = engines.start_dockerd(name, *extra, fresh=True)
    except engines.EngineError as e:
        engines.unavailable(f"could not start private dockerd {name!r}: {e}")
    try:
        yield url
    finally:
        engines.stop_dockerd(name)


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """DOCKER_HOST url (unix://...) of a private overlay2 dockerd for this session."""
    yield from _private_dockerd("test-overlay2")


@pytest.fixture(scope="session")
def docker_host_vfs() -> Iterator[str]:
    """DOCKER_HOST url of a second private dockerd using ``--storage-driver vfs``."""
    yield from _private_dockerd("test-vfs", "--storage-driver", "vfs")


@pytest.fixture(scope="session")
def busybox() -> str:
    """Path of a statically linked busybox (Debian busybox-static's /bin/busybox)."""
    return engines.static_busybox()
