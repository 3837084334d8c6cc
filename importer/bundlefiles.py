"""Reading a bundle's files wherever they are: a bundle folder, or a tar / parts read in place.

A *bundle root* is a folder path (``str``) or an :class:`~importer.archive.ArchiveReader`.
Everything that reads blobs after verification (layers, configs, the docker-archive writer, the
registry push) goes through :func:`open_bundle_file` and :func:`read_bundle_file`."""

from __future__ import annotations

import os
from typing import BinaryIO, Union

from importer.archive import ArchiveReader, locate
from importer.digest import Digest
from importer.limits import MAX_BUNDLE_JSON, read_limited
from importer.manifest import BUNDLE_JSON

BundleRoot = Union[str, ArchiveReader]


def open_root(path: str) -> BundleRoot:
    """The bundle root for a BUNDLE argument (folder, tar, parts index or one of the parts)."""
    loc = locate(path)
    return loc.path if loc.kind == "folder" else ArchiveReader(loc.path)


def open_bundle_file(root: BundleRoot, rel: str) -> BinaryIO:
    """Open the bundle file ``rel`` (a relative POSIX path) for reading; the caller closes it."""
    if isinstance(root, str):
        return open(os.path.join(root, rel), "rb")
    return root.open(rel)  # type: ignore[return-value]


def read_bundle_file(root: BundleRoot, rel: str, limit: int, what: str) -> bytes:
    """Read a whole (small) bundle file, refusing more than ``limit`` bytes."""
    with open_bundle_file(root, rel) as f:
        return read_limited(f, limit, what)


def root_label(root: BundleRoot) -> str:
    return root if isinstance(root, str) else root.path


def root_size(root: BundleRoot) -> int:
    """Bytes a full verification reads (for progress totals)."""
    if not isinstance(root, str):
        return root.size
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                continue
    return total


def bundle_json_digest(root: BundleRoot) -> Digest:
    return Digest.of_bytes(read_bundle_file(root, BUNDLE_JSON, MAX_BUNDLE_JSON, BUNDLE_JSON))
