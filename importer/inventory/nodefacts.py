"""What a node is, as the GPU Operator reads it from Node Feature Discovery's labels (inventory 1.4,
``node``): os-release ``ID`` and ``VERSION_ID`` (``feature.node.kubernetes.io/system-os_release.ID``,
``.VERSION_ID``), the kernel release (``uname -r``: ``kernel-version.full``), its flavour (the part
after the ABI number: ``generic``, ``aws``, ``cloud-amd64``; null for kernels named otherwise, RHEL's
``5.14.0-427.13.1.el9_4.x86_64``) and the architecture as OCI names it (``amd64``, ``arm64``).

``bundle export --images-from-manifests --have`` computes each node's GPU driver image tag from
them (bundle/gpudriver.py) and ``bundle check --have`` the platform each node pulls."""

from __future__ import annotations

import os
import platform
import re
from typing import Any, Dict, Optional

from importer.format.platform import host

OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")  # os-release(5): the first that exists
MAX_OS_RELEASE = 64 * 1024
_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_FLAVOUR = re.compile(r"^[0-9]+\.[0-9]+(?:\.[0-9]+)?-[0-9]+(?:\.[0-9]+)*-([a-z][a-z0-9-]*)$")
_VALUE = re.compile(r"^[A-Za-z0-9._+~-]{1,64}$")


def parse_os_release(text: str) -> Dict[str, str]:
    """``KEY=value`` lines of os-release(5); quotes (single or double) removed, ``\\`` escapes
    read as the shell does; comments and other lines skipped."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        value = m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            value = re.sub(r"\\(.)", r"\1", value) if m.group(2).strip()[0] == '"' else value
        out[m.group(1)] = value
    return out


def kernel_flavour(release: str) -> Optional[str]:
    """``5.15.0-139-generic`` -> ``generic``; ``6.1.0-18-cloud-amd64`` -> ``cloud-amd64``; None
    for a release without a flavour after its ABI number."""
    m = _FLAVOUR.match(release)
    return m.group(1) if m else None


def _read_os_release(paths: Any = OS_RELEASE) -> Dict[str, str]:
    for path in paths:
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_OS_RELEASE)
        except OSError:
            continue
        return parse_os_release(raw.decode("utf-8", "replace"))
    return {}


def node_facts(os_release: Any = OS_RELEASE, kernel: Optional[str] = None) -> Dict[str, Any]:
    """This host as the inventory's ``node`` (1.4)."""
    found = _read_os_release(os_release)
    release = kernel if kernel is not None else platform.release()
    return {
        "osRelease": {"ID": found.get("ID") or None, "VERSION_ID": found.get("VERSION_ID") or None},
        "kernelRelease": release or None,
        "kernelFlavour": kernel_flavour(release),
        "architecture": host().normalized().architecture,
    }


def os_tag(node: Dict[str, Any]) -> Optional[str]:
    """The GPU Operator's OS tag of a node: ``ID`` + ``VERSION_ID`` (``ubuntu22.04``, ``rhel9.4``), as
    controllers/object_controls.go kernelFullVersion and internal/state/nodepool.go getOS make it;
    None when the inventory does not say (or says something no tag can hold)."""
    rel = node.get("osRelease") if isinstance(node, dict) else None
    if not isinstance(rel, dict):
        return None
    os_id, version = rel.get("ID"), rel.get("VERSION_ID")
    if not isinstance(os_id, str) or not isinstance(version, str):
        return None
    if not _VALUE.match(os_id) or not _VALUE.match(version):
        return None
    return f"{os_id}{version}"


def kernel_of(node: Dict[str, Any]) -> Optional[str]:
    """The kernel release an inventory's ``node`` names (``uname -r``), when a tag can hold it."""
    value = node.get("kernelRelease") if isinstance(node, dict) else None
    return value if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9._+-]{1,100}", value) else None


def env_os_release() -> Any:
    """The os-release files to read: ``SNEAKERNET_OS_RELEASE`` (a test's) first when set."""
    extra = os.environ.get("SNEAKERNET_OS_RELEASE")
    return (extra, *OS_RELEASE) if extra else OS_RELEASE
