"""SHA256SUMS: the coreutils format (``<hex>  <path>``) that plain ``sha256sum -c`` accepts."""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Tuple

from importer.format.digest import Digest
from importer.format.manifest import safe_relpath

#: exactly what ``sha256sum -c`` reads, minus its leniencies (leading blanks, a trailing CR, blank
#: lines, BSD-style lines, escaped names): 64 lowercase hex, a space, a space or '*', the name.
_LINE_RE = re.compile(r"([0-9a-f]{64}) [ *](.+)", re.DOTALL)
#: never in a name: C0 controls, DEL, and what str.splitlines() would split on (NEL, U+2028/9)
_BAD_CHAR_RE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
#: malformed lines named one by one; past this many, one problem counts the rest
MAX_LINE_PROBLEMS = 50


def format_sums(entries: Iterable[Tuple[str, Digest]]) -> bytes:
    """Render entries sorted by path, text mode (two spaces), LF line ends."""
    lines = [f"{d.hex}  {path}\n" for path, d in sorted(entries)]
    return "".join(lines).encode("utf-8")


def parse_sums(raw: bytes) -> Tuple[Dict[str, Digest], List[str]]:
    """Parse SHA256SUMS; returns (path -> digest, problems). Unsafe paths are problems."""
    entries: Dict[str, Digest] = {}
    problems: List[str] = []
    # coreutils splits on LF and nothing else; the writer ends every line with one
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, raw_line in enumerate(lines, 1):
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"SHA256SUMS line {number}: expected UTF-8 text, found {raw_line[:120]!r}")
            continue
        m = _LINE_RE.fullmatch(line)
        bad = _BAD_CHAR_RE.search(line)
        if m is None or bad is not None:
            what = f"a control or line-separator character {bad.group()!r} in" if bad else "a malformed line"
            problems.append(f"SHA256SUMS line {number}: expected '<64 lowercase hex>  <path>' ending in LF, "
                            f"found {what} {line[:120]!r}")
            continue
        path = m.group(2)
        if not safe_relpath(path):
            problems.append(f"SHA256SUMS line {number}: expected a relative path inside the bundle, found {path!r}")
            continue
        if path in entries:
            problems.append(f"SHA256SUMS line {number}: {path!r} is listed twice")
            continue
        entries[path] = Digest.from_hex(m.group(1))
    if len(problems) > MAX_LINE_PROBLEMS:
        rest = len(problems) - MAX_LINE_PROBLEMS
        problems[MAX_LINE_PROBLEMS:] = [f"SHA256SUMS: {rest} more malformed line(s) not shown"]
    return entries, problems
