"""What a BUNDLE argument names (a folder, a tar, a parts index), and the first steps of an
import for each: the signature check, the schema major, and a sink that reads the bundle's
blobs in place from a tar or its parts (no unpacking, no concatenation)."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Tuple

from importer.archive import ArchiveReader, locate
from importer.bundlefiles import read_bundle_file
from importer.errors import UsageError
from importer.legacy import bundle_major
from importer.limits import MAX_BUNDLE_JSON, MAX_SIGNATURE, parse_json
from importer.manifest import BUNDLE_JSON, SIGNATURE_FILE, ImageRecord, parse_schema_version
from importer.signature import SignatureCheck, TrustPolicy, check_signature, check_signature_bytes

#: Sinks whose load() reads blobs through importer/bundlefiles.py (and so from a tar in place).
READS_ARCHIVES = ("docker",)


def is_archive(path: str) -> bool:
    return locate(path).kind != "folder"


def schema_major_at(path: str) -> Tuple[int, bytes]:
    """The schema major of the bundle BUNDLE names, and its bundle.json bytes."""
    if not is_archive(path):
        return bundle_major(path)
    raw = read_bundle_file(ArchiveReader(path), BUNDLE_JSON, MAX_BUNDLE_JSON, BUNDLE_JSON)
    major, _ = parse_schema_version(parse_json(raw, BUNDLE_JSON))
    return major, raw


def check_signature_at(path: str, policy: TrustPolicy) -> SignatureCheck:
    """The trust policy over bundle.json (and bundle.json.sig) wherever they are."""
    if not is_archive(path):
        return check_signature(path, policy)
    reader = ArchiveReader(path)
    raw = read_bundle_file(reader, BUNDLE_JSON, MAX_BUNDLE_JSON, BUNDLE_JSON)
    raw_sig: Optional[bytes] = None
    if SIGNATURE_FILE in reader.members():
        raw_sig = read_bundle_file(reader, SIGNATURE_FILE, MAX_SIGNATURE, SIGNATURE_FILE)
    return check_signature_bytes(raw, raw_sig, policy, where=reader.path)


class InPlaceSink:
    """A sink whose load() reads the bundle from a tar or its parts instead of a folder."""

    def __init__(self, sink: Any, reader: ArchiveReader) -> None:
        self._sink = sink
        self._reader = reader

    def load(self, root: str, images: Sequence[ImageRecord], on_bytes: Any, **kw: Any) -> Any:
        return self._sink.load(self._reader, images, on_bytes, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def sink_for(path: str, sink: Any) -> Any:
    """``sink`` itself for a folder; for a tar or parts, a wrapper that loads from them in place."""
    if not is_archive(path):
        return sink
    kind = getattr(sink, "kind", "?")
    if kind not in READS_ARCHIVES:
        name = os.path.basename(path)
        raise UsageError(
            f"importing {name} into {kind}: expected a bundle folder for this engine, found a tar/parts",
            hint=f"verify it here with --verify-only, or import it into {', '.join(READS_ARCHIVES)} or a "
            "registry; for this engine unpack it first (mkdir B && tar -xf FILE.tar -C B; "
            "for parts: cat FILE.tar.part* | tar -x -C B) and import B",
        )
    return InPlaceSink(sink, ArchiveReader(path))
