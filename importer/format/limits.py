"""Size limits on everything read into memory, and the bounded readers that enforce them."""

from __future__ import annotations

import json
import re
from typing import Any, List, Optional

from importer.errors import LimitExceeded, ManifestError
from importer.format.digest import Readable

MAX_BUNDLE_JSON = 64 * 1024 * 1024
MAX_INDEX = 4 * 1024 * 1024
MAX_MANIFEST = 4 * 1024 * 1024
MAX_CONFIG = 16 * 1024 * 1024
MAX_SUMS = 64 * 1024 * 1024
MAX_LEGACY_SUMS = 64 * 1024  # schema 1/2: three lines at most; larger is refused, never truncated
MAX_DOCKER_SAVE_JSON = 64 * 1024 * 1024
MAX_SIGNATURE = 64 * 1024
MAX_ENGINE_JSON = 256 * 1024 * 1024
MAX_INDEX_DEPTH = 4  # indexes naming indexes: manifests at most this many levels below the one a reference names
MAX_BUNDLE_DEPTH = 32  # folder levels below a bundle root (a bundle needs 2: blobs/sha256/<digest>)
# a registry's listing (bundle-import --inventory --registry, delta pushes searching for a mount source)
MAX_REGISTRY_REPOSITORIES = 10_000
MAX_REGISTRY_TAGS = 10_000  # per repository
MAX_REGISTRY_IMAGES = 20_000  # tags described, all repositories together
REGISTRY_PAGE = 1_000  # `n` asked for per page of /v2/_catalog and /v2/<repo>/tags/list


def read_limited(stream: Readable, limit: int, what: str) -> bytes:
    """Read a whole stream, refusing more than ``limit`` bytes (reads at most limit+1)."""
    data = bytes(stream.read(limit + 1))
    if len(data) > limit:
        raise LimitExceeded(
            f"reading {what}: expected at most {limit} bytes, found more",
            hint="the file is not what the bundle describes; re-copy the bundle",
        )
    return data


def read_file_limited(path: str, limit: int, what: str) -> bytes:
    with open(path, "rb") as f:
        return read_limited(f, limit, what)


def parse_json(raw: bytes, what: str) -> Any:
    """A JSON document of the bundle (or one the tools read), refused as ManifestError when it is
    not UTF-8 JSON or holds a lone surrogate (``"\\udc80"``: no encoding writes it, so printing
    or storing the value later would fail)."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ManifestError(
            f"parsing {what}: expected JSON, found invalid data ({e})",
            hint="the file was modified or truncated; re-copy the bundle",
        ) from e
    if _SURROGATE_ESCAPE.search(raw) is not None:
        bad = _lone_surrogate(doc)
        if bad is not None:
            raise ManifestError(
                f"parsing {what}: expected JSON of valid Unicode, found a lone surrogate in {bad}",
                hint="the file was modified or damaged; re-copy the bundle (or re-export it)",
            )
    return doc


#: a \uD800-\uDFFF escape: only then can json.loads return a lone surrogate (UTF-8 input cannot hold one)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(doc: Any) -> Optional[str]:
    """The first string (key or value) of ``doc`` holding a lone surrogate, shown escaped; or None.
    Iterative: json.loads already bounded the depth."""
    pending: List[Any] = [doc]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str) and _SURROGATE.search(value) is not None:
            return ascii(value[:80])
    return None
