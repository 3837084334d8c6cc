"""A sink that reads the bundle's blobs in place from a tar or its parts (no unpacking, no
concatenation), through the one archive reader of the opened bundle (importer/input/opened.py)."""

from __future__ import annotations

import os
from typing import Any, Sequence

from importer.errors import UsageError
from importer.format.manifest import ImageRecord
from importer.input.archive import ArchiveReader
from importer.input.opened import OpenedBundle

#: Sinks whose load() reads blobs through importer/input/opened.py (and so from a tar in place).
READS_ARCHIVES = ("docker",)


class InPlaceSink:
    """A sink whose load() reads the bundle from a tar or its parts instead of a folder."""

    def __init__(self, sink: Any, reader: ArchiveReader) -> None:
        self._sink = sink
        self._reader = reader

    def load(self, root: Any, images: Sequence[ImageRecord], on_bytes: Any, **kw: Any) -> Any:
        return self._sink.load(self._reader, images, on_bytes, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def sink_for(bundle: OpenedBundle, sink: Any) -> Any:
    """``sink`` itself for a folder; for a tar or parts, a wrapper that loads from them in place."""
    if bundle.archive is None:
        return sink
    kind = sink.kind
    if kind not in READS_ARCHIVES:
        name = os.path.basename(bundle.path)
        raise UsageError(
            f"importing {name} into {kind}: expected a bundle folder for this engine, found a tar/parts",
            hint=f"verify it here with --verify-only, or import it into {', '.join(READS_ARCHIVES)} or a "
            "registry; for this engine unpack it first (mkdir B && tar -xf FILE.tar -C B; "
            "for parts: cat FILE.tar.part[0-9]* | tar -x -C B) and import B",
        )
    return InPlaceSink(sink, bundle.archive)
