"""Hash what an engine hands back: a ``docker save`` / ``podman save`` / ``ctr export`` tar
stream, or the blobs of an OCI layout directory.

One pass over the stream: every regular member is hashed as it is (its digest) and, when it is
gzip or zstd, also decompressed and hashed (a layer's diff_id). Small JSON members are kept to
find the image afterwards. Symlinks and hardlinks (``podman save`` links every ``layer.tar``)
are resolved. Nothing is written to disk and no member is held in memory whole unless it is
small JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tarfile
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

from importer.errors import BundleError, LimitExceeded
from importer.format.digest import CHUNK, Digest, is_digest
from importer.input.layers import decompress_errors
from importer.streams.compression import open_decompressed
from importer.streams.readers import HashingReader, PrefixedReader

ProgressFn = Callable[[int], None]
MAX_JSON_MEMBER = 4 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_DECOMPRESS_ERRORS = decompress_errors()


@dataclass
class MemberFacts:
    """One file of the re-export: its bytes as stored, and as a layer (decompressed)."""

    path: str
    size: int
    digest: Digest
    compression: str  # "none", "gzip", "zstd"
    plain_digest: Optional[Digest]  # None when the bytes do not decompress (or grew past the bound)
    plain_size: int
    note: str = ""


@dataclass
class ArchiveScan:
    source: str  # how the bytes were obtained, e.g. "docker save sha256:..."
    members: Dict[str, MemberFacts] = field(default_factory=dict)
    links: Dict[str, str] = field(default_factory=dict)
    docs: Dict[str, bytes] = field(default_factory=dict)
    error: str = ""  # the stream was not a readable tar (to its end)

    def resolve(self, path: str) -> Optional[MemberFacts]:
        seen = 0
        path = posixpath.normpath(path)
        while path in self.links and seen < 40:
            path = self.links[path]
            seen += 1
        return self.members.get(path)

    def doc(self, path: str) -> Optional[Any]:
        path = posixpath.normpath(path)
        for _ in range(40):
            if path not in self.links:
                break
            path = self.links[path]
        raw = self.docs.get(path)
        if raw is None:
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None

    def find_image(self, config_digest: str) -> Optional[Tuple[List[str], str]]:
        """The layer paths of the image whose config is ``config_digest``, and how they were
        found ("manifest.json" or "index.json"); None when the re-export holds no such image."""
        legacy = self.doc("manifest.json")
        if isinstance(legacy, list):
            for entry in legacy:
                if not isinstance(entry, dict) or not isinstance(entry.get("Config"), str):
                    continue
                config = self.resolve(entry["Config"])
                if config is not None and str(config.digest) == config_digest:
                    layers = entry.get("Layers")
                    if isinstance(layers, list) and all(isinstance(x, str) for x in layers):
                        return [str(x) for x in layers], "manifest.json"
        for manifest in self._oci_manifests():
            config = manifest.get("config")
            if isinstance(config, dict) and config.get("digest") == config_digest:
                paths = []
                for layer in manifest.get("layers") or []:
                    d = layer.get("digest") if isinstance(layer, dict) else None
                    if not is_digest(d):
                        break
                    paths.append(Digest.parse(d).blob_path)
                else:
                    return paths, "index.json"
        return None

    def _oci_manifests(self) -> List[Dict[str, Any]]:
        found: List[Dict[str, Any]] = []
        queue: List[Any] = [self.doc("index.json")]
        seen = 0
        while queue and seen < 1000:
            seen += 1
            doc = queue.pop(0)
            if not isinstance(doc, dict):
                continue
            if isinstance(doc.get("manifests"), list):
                for desc in doc["manifests"]:
                    d = desc.get("digest") if isinstance(desc, dict) else None
                    if is_digest(d):
                        queue.append(self.doc(Digest.parse(d).blob_path))
            elif isinstance(doc.get("layers"), list):
                found.append(doc)
        return found


def layer_bound(image: Any) -> int:
    """How far to decompress a re-exported member: past the image's largest layer means the
    engine holds other bytes (and protects against a decompression bomb in a damaged store)."""
    sizes = [int(layer.uncompressed_size) for layer in getattr(image, "layers", ())]
    return max(sizes, default=0) + 64 * 1024 * 1024


def sniff(head: bytes) -> str:
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return "none"


def hash_member(raw: Any, path: str, *, bound: int, on_bytes: Optional[ProgressFn] = None,
                keep_json: bool = True) -> Tuple[MemberFacts, Optional[bytes]]:
    """Hash one member (a file object), decompressing it when it is gzip/zstd."""
    head = raw.read(4)
    compression = sniff(head)
    hashing = HashingReader(PrefixedReader(head, raw), on_bytes)
    kept: Optional[bytearray] = bytearray() if keep_json and head[:1] in (b"{", b"[") else None
    plain_h = hashlib.sha256()
    plain_n = 0
    note = ""
    if compression == "none":
        while True:
            data = hashing.read(CHUNK)
            if not data:
                break
            plain_h.update(data)
            plain_n += len(data)
            if kept is not None:
                kept += data
                if len(kept) > MAX_JSON_MEMBER:
                    kept = None
        plain: Optional[Digest] = Digest("sha256", plain_h.hexdigest())
    else:
        plain = None
        try:
            with open_decompressed(hashing, compression, bound=bound, what=path) as reader:
                while True:
                    data = reader.read(CHUNK)
                    if not data:
                        break
                    plain_h.update(data)
                    plain_n += len(data)
            plain = Digest("sha256", plain_h.hexdigest())
        except LimitExceeded:
            note = f"decompresses to more than {bound} bytes"
        except BundleError as e:
            note = f"does not decompress ({e.message})"
        except _DECOMPRESS_ERRORS as e:
            note = f"does not decompress ({e})"
        while hashing.read(CHUNK):  # the rest of the stored bytes, for the blob digest
            pass
        kept = None
    facts = MemberFacts(path, hashing.count, hashing.digest(), compression, plain,
                        plain_n, note)
    return facts, (bytes(kept) if kept is not None else None)


def scan_tar(stream: BinaryIO, source: str, *, bound: int, on_bytes: Optional[ProgressFn] = None) -> ArchiveScan:
    """Hash every member of the tar ``stream`` (read once, in order)."""
    scan = ArchiveScan(source)
    try:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK) as tar:
            for member in tar:
                name = posixpath.normpath(member.name.lstrip("/"))
                if member.issym():
                    scan.links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
                elif member.islnk():
                    scan.links[name] = posixpath.normpath(member.linkname.lstrip("/"))
                elif member.isfile():
                    f = tar.extractfile(member)
                    if f is None:
                        continue
                    facts, doc = hash_member(f, name, bound=bound, on_bytes=on_bytes)
                    scan.members[name] = facts
                    if doc is not None:
                        scan.docs[name] = doc
    except (tarfile.TarError, EOFError) as e:  # an empty or cut stream: the command's status says why
        scan.error = f"{type(e).__name__}: {e}"
    return scan


def scan_layout_blobs(layout: str, digests: List[Digest], source: str, *, bound: int,
                      on_bytes: Optional[ProgressFn] = None) -> ArchiveScan:
    """Hash the named blobs of the OCI layout at ``layout`` (plus its index.json)."""
    scan = ArchiveScan(source)
    index = os.path.join(layout, "index.json")
    if os.path.isfile(index):
        with open(index, "rb") as f:
            facts, doc = hash_member(f, "index.json", bound=bound)
        scan.members["index.json"] = facts
        if doc is not None:
            scan.docs["index.json"] = doc
    for digest in digests:
        path = os.path.join(layout, digest.blob_path)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            facts, doc = hash_member(f, digest.blob_path, bound=bound, on_bytes=on_bytes)
        scan.members[digest.blob_path] = facts
        if doc is not None:
            scan.docs[digest.blob_path] = doc
    return scan
