"""Text the CLIs print from a bundle (fields of bundle.json, file and member names, messages
that quote them) made safe for a terminal: one line, no escape sequences.

Both CLIs pass such text through :func:`printable` (``bundle`` also escapes rich markup; errors
are rendered by importer/cli/output.py; tables and reports of receipts, bundles and registries:
import, check-only, smoke, fleet-report, inspect, serve's log, copy, push), the one escaping
function; ``--json`` output is not touched (``json.dumps`` escapes control characters and lone
surrogates itself). A lone surrogate (``"\\udc80"`` in a JSON string) is shown escaped too: it
cannot be encoded for a terminal (UnicodeEncodeError)."""

from __future__ import annotations

import re

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0, DEL and C1 controls; line and paragraph separators; bidirectional overrides and marks;
# lone surrogates (no encoding writes them)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    ch = m.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` as one line with every control character shown escaped (``\\x1b``, ``\\n``);
    everything else, non-ASCII letters included, unchanged."""
    return _UNSAFE.sub(_escape, text)


def printable_block(text: str) -> str:
    """A block of lines (an error's context): each line made printable, the line breaks kept."""
    return "\n".join(printable(line) for line in text.split("\n"))
