"""Platforms (``linux/amd64``, ``linux/arm64/v8``): parsing ``--platform``, this host's platform,
and which manifest of an image index a platform runs.

Matching follows containerd's normalisation: ``aarch64`` is ``arm64`` and arm64's variant ``v8``
is its default (``linux/arm64`` matches an index entry ``linux/arm64/v8`` and the reverse), as
``v7`` is arm's (``linux/arm`` is ``linux/arm/v7``); ``x86_64`` is ``amd64``. Other variants
must be equal (``linux/arm/v6`` does not match ``linux/arm/v7``). Every comparison of two platforms
is :func:`platform_matches` (tests/test_architecture.py)."""

from __future__ import annotations

import platform as _platform
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from importer.errors import UsageError
from importer.format.digest import is_digest

_ARCH_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "aarch64": "arm64", "armhf": "arm", "armel": "arm",
                 "i386": "386", "i686": "386"}
_DEFAULT_VARIANT = {"arm64": "v8", "arm": "v7"}
_PART = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class Platform(NamedTuple):
    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    def normalized(self) -> Platform:
        arch = _ARCH_ALIASES.get(self.architecture, self.architecture)
        variant = self.variant or _DEFAULT_VARIANT.get(arch, "")
        if arch == "arm64" and variant == "8":
            variant = "v8"
        return Platform(self.os, arch, variant)

    def matches(self, other: Platform) -> bool:
        """Both name the same platform once normalised (containerd's rules, see the module doc)."""
        return platform_matches(self, other)


#: how :func:`platform_matches` compares variants
VARIANT_EQUAL, VARIANT_IF_BOTH, VARIANT_IGNORED = "equal", "if-both", "ignored"


def platform_matches(a: Platform, b: Platform, *, variant: str = VARIANT_EQUAL) -> bool:
    """The one rule that says two platforms are the same: OS and architecture equal once normalised
    (containerd's rules, see the module doc), and the variant by ``variant``: VARIANT_EQUAL
    (containerd's matcher: index entries, ``--platform`` lists), VARIANT_IF_BOTH (compared only when
    both name one: which carried platform an engine imports), VARIANT_IGNORED (OS and architecture
    alone: a single-platform bundle refused for another architecture)."""
    p, q = a.normalized(), b.normalized()
    if (p.os, p.architecture) != (q.os, q.architecture):
        return False
    if variant == VARIANT_IGNORED:
        return True
    if variant == VARIANT_IF_BOTH and not (p.variant and q.variant):
        return True
    return p.variant == q.variant


def parse_platform(text: str, *, what: str = "--platform") -> Platform:
    """``OS/ARCH[/VARIANT]`` -> Platform, or a UsageError saying what is wrong."""
    parts = text.strip().lower().split("/")
    if len(parts) not in (2, 3) or not all(_PART.match(p) for p in parts):
        raise UsageError(f"reading {what} {text!r}: expected OS/ARCH or OS/ARCH/VARIANT "
                         "(e.g. linux/amd64, linux/arm64/v8), found something else",
                         hint="one platform per --platform, or a comma-separated list")
    return Platform(*parts)


def parse_platforms(values: Sequence[str], *, what: str = "--platform") -> List[Platform]:
    """Repeated and comma-separated ``--platform`` values, in order, without duplicates."""
    out: List[Platform] = []
    for value in values:
        for item in value.split(","):
            if not item.strip():
                raise UsageError(f"reading {what} {value!r}: expected OS/ARCH[/VARIANT] between the commas, "
                                 "found an empty entry")
            p = parse_platform(item, what=what)
            if not any(p.matches(q) for q in out):
                out.append(p)
    return out


def of_dict(doc: Any) -> Optional[Platform]:
    """An index entry's ``platform`` object (or an image config) -> Platform, or None."""
    if not isinstance(doc, dict):
        return None
    os_name, arch, variant = doc.get("os"), doc.get("architecture"), doc.get("variant") or ""
    if not isinstance(os_name, str) or not isinstance(arch, str) or not isinstance(variant, str):
        return None
    return Platform(os_name, arch, variant)


def to_dict(p: Platform) -> Dict[str, str]:
    out = {"os": p.os, "architecture": p.architecture}
    if p.variant:
        out["variant"] = p.variant
    return out


def host() -> Platform:
    """This host's platform (Linux; arm64 hosts are ``linux/arm64/v8``)."""
    machine = _platform.machine().lower()
    arch = _ARCH_ALIASES.get(machine, machine)
    return Platform("linux", arch).normalized() if arch == "arm64" else Platform("linux", arch)


def host_platform() -> Tuple[str, str]:
    p = host()
    return p.os, p.architecture


def pick_entry(index: Any, want: Platform) -> Optional[Dict[str, Any]]:
    """The index entry (descriptor) for ``want``, or None. The first match wins, as in containerd."""
    for desc in index.get("manifests") or [] if isinstance(index, dict) else []:
        if not isinstance(desc, dict):
            continue
        p = of_dict(desc.get("platform"))
        if p is not None and p.matches(want):
            return desc
    return None


def pick_platform_manifest(index: Any, want: Optional[Platform] = None) -> Optional[str]:
    """The digest of the manifest in an image index made for ``want`` (default: this host), or None."""
    desc = pick_entry(index, want or host())
    d = desc.get("digest") if desc else None
    return str(d) if is_digest(d) else None
