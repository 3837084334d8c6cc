"""Content digests: parsing with validation (digests become file paths) and streaming hashes."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Dict, Protocol, Tuple

from importer.errors import InvalidDigest

#: Read and hash in chunks of this size (large chunks release the GIL inside hashlib).
CHUNK = 1024 * 1024


class Readable(Protocol):
    """Anything with ``read(n) -> bytes``: a file, a decompressor, a reader of
    importer/streams/readers.py. The one type for a stream passed around (defined on the lowest
    floor so that every floor may name it; importer.streams.readers re-exports it)."""

    def read(self, __n: int = -1) -> bytes: ...


_SHA256_RE = re.compile(r"sha256:[0-9a-f]{64}")
_HEX_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, order=True)
class Digest:
    """A validated ``sha256:<64 lowercase hex>`` digest. Safe to use as a path component."""

    algorithm: str
    hex: str

    @classmethod
    def parse(cls, value: object, *, what: str = "digest") -> Digest:
        """Parse and validate; anything but ``sha256:`` + 64 lowercase hex is refused."""
        if not isinstance(value, str) or _SHA256_RE.fullmatch(value) is None:
            shown = repr(value)[:100]
            raise InvalidDigest(
                f"{what}: expected 'sha256:' followed by 64 lowercase hex digits, found {shown}",
                hint="the bundle was modified or produced by an incompatible tool",
            )
        return cls("sha256", value[7:])

    @classmethod
    def from_hex(cls, hexdigest: str, *, what: str = "digest") -> Digest:
        if _HEX_RE.fullmatch(hexdigest) is None:
            raise InvalidDigest(f"{what}: expected 64 lowercase hex digits, found {hexdigest!r}")
        return cls("sha256", hexdigest)

    @classmethod
    def of_bytes(cls, data: bytes) -> Digest:
        return cls("sha256", hashlib.sha256(data).hexdigest())

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @property
    def short(self) -> str:
        return f"{self.algorithm}:{self.hex[:12]}"

    @property
    def blob_path(self) -> str:
        """Relative path of this blob in an OCI image layout."""
        return f"blobs/{self.algorithm}/{self.hex}"


def is_digest(value: object) -> bool:
    return isinstance(value, str) and _SHA256_RE.fullmatch(value) is not None


def hash_stream(stream: Readable) -> Tuple[Digest, int]:
    """Hash a stream to its end; returns (digest, size). The caller closes the stream."""
    h = hashlib.sha256()
    size = 0
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            break
        h.update(chunk)
        size += len(chunk)
    return Digest("sha256", h.hexdigest()), size


def hash_file(path: str) -> Tuple[Digest, int]:
    with open(path, "rb", buffering=0) as f:
        return hash_stream(f)


@dataclass(frozen=True)
class BlobRef:
    """A pinned blob as an OCI descriptor names it: media type, digest, size (bundle.json's
    manifests, configs, indexes and attached artifacts' blobs)."""

    media_type: str
    digest: Digest
    size: int

    def to_dict(self) -> Dict[str, Any]:
        return {"mediaType": self.media_type, "digest": str(self.digest), "size": self.size}
