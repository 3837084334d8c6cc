"""Size limits on everything read into memory, and the bounded readers that enforce them."""

from __future__ import annotations

import json
from typing import Any

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
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ManifestError(
            f"parsing {what}: expected JSON, found invalid data ({e})",
            hint="the file was modified or truncated; re-copy the bundle",
        ) from e
