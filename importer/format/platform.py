"""Which platform this host is (``linux``/``amd64``...) and which manifest of an index it runs."""

from __future__ import annotations

import platform
from typing import Any, Optional, Tuple

from importer.format.digest import is_digest


def host_platform() -> Tuple[str, str]:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
            "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}.get(machine, machine)
    return "linux", arch


def pick_platform_manifest(index: Any) -> Optional[str]:
    """The digest of the manifest in an image index made for this host's platform, or None."""
    want_os, want_arch = host_platform()
    for desc in index.get("manifests") or []:
        plat = desc.get("platform") if isinstance(desc, dict) else None
        if isinstance(plat, dict) and plat.get("os") == want_os and plat.get("architecture") == want_arch:
            d = desc.get("digest")
            return str(d) if is_digest(d) else None
    return None
