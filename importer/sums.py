"""SHA256SUMS: the coreutils format (``<hex>  <path>``) that plain ``sha256sum -c`` accepts."""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Tuple

from importer.digest import Digest
from importer.manifest import safe_relpath

_LINE_RE = re.compile(r"([0-9a-f]{64}) [ *](.+)")


def format_sums(entries: Iterable[Tuple[str, Digest]]) -> bytes:
    """Render entries sorted by path, text mode (two spaces), LF line ends."""
    lines = [f"{d.hex}  {path}\n" for path, d in sorted(entries)]
    return "".join(lines).encode("utf-8")


def parse_sums(raw: bytes) -> Tuple[Dict[str, Digest], List[str]]:
    """Parse SHA256SUMS; returns (path -> digest, problems). Unsafe paths are problems."""
    entries: Dict[str, Digest] = {}
    problems: List[str] = []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return {}, ["SHA256SUMS: expected UTF-8 text, found binary data"]
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE_RE.fullmatch(line)
        if m is None:
            problems.append(f"SHA256SUMS line {number}: expected '<64 hex>  <path>', found {line[:120]!r}")
            continue
        path = m.group(2)
        if not safe_relpath(path):
            problems.append(f"SHA256SUMS line {number}: expected a relative path inside the bundle, found {path!r}")
            continue
        if path in entries:
            problems.append(f"SHA256SUMS line {number}: {path!r} is listed twice")
            continue
        entries[path] = Digest.from_hex(m.group(1))
    return entries, problems
