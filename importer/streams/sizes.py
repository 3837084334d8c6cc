"""Sizes on the command line: ``4G``, ``3900M``, ``512K``, ``1048576`` (binary units: M = MiB)."""

from __future__ import annotations

import re

from importer.errors import UsageError

_SIZE_RE = re.compile(r"([0-9]+)\s*([KMGT]?)(i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str, *, what: str = "a size", minimum: int = 1) -> int:
    """``3900M`` -> 3900 * 2**20. Units K, M, G, T are powers of 1024 (``3900M`` fits FAT32's 4 GiB - 1)."""
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"reading {what}: expected a number with an optional K, M, G or T (e.g. 3900M), "
                         f"found {text!r}")
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < minimum:
        raise UsageError(f"reading {what}: expected at least {minimum} bytes, found {text!r} ({value} bytes)")
    return value
