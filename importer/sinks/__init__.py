"""Engine sinks: where a verified bundle is loaded. One small protocol, one module per engine."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Set

from importer.engines import EngineImage, EngineInfo
from importer.format.digest import Digest
from importer.format.manifest import ImageRecord
from importer.input.opened import BundleRoot

try:  # Protocol is in typing since 3.8
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore[assignment]


ProgressFn = Callable[[int], None]


class Sink(Protocol):
    """Load verified images into an engine and read back what it holds.

    Every sink declares its ``kind`` and what it can do beyond loading (the capability flags of
    :class:`SinkBase`); the pipeline asks the flag, never probes for a method."""

    kind: str
    reads_archives: bool
    loads_docker_archive: bool
    completes_deltas: bool
    lists_tags: bool
    lists_images: bool
    reexports: bool
    takes_file_artifacts: bool

    @property
    def checks_layers_while_loading(self) -> bool: ...

    def streamed_layers(self, images: Sequence[ImageRecord]) -> Set[Digest]: ...

    def archive_command(self, what: str) -> Any: ...

    def prepare_delta(self, manifest: Any) -> Any: ...

    def list_tags(self) -> List[str]: ...

    def inventory(self) -> List[EngineImage]: ...

    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> Any: ...

    def load_files(self, root: BundleRoot, artifacts: Sequence[Any], on_bytes: Optional[ProgressFn]) -> List[str]: ...

    def ref_digest(self, ref: str) -> Optional[str]: ...

    def load_total(self, images: Sequence[ImageRecord], external: Optional[Any] = None) -> Optional[int]: ...

    def close(self) -> None: ...

    def probe(self) -> EngineInfo:
        """Check the engine answers; report its kind, version and storage."""
        ...

    def lookup(self, name: str) -> Optional[EngineImage]:
        """The image called ``name`` (a tag or an ID), or None."""
        ...

    def load(self, root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[Any] = None) -> None:
        """Load ``images`` from the bundle at ``root`` (its folder, or with ``reads_archives`` the opened
        tar or parts) untagged; ``external``: what :meth:`prepare_delta` returned for a delta bundle.
        Raise on any failure."""
        ...

    def tag(self, image_id: str, ref: str) -> None: ...

    def remove(self, image_id: str) -> None: ...


class SinkBase:
    """What a sink can do beyond probe/lookup/load/tag/remove, declared once per class: each flag
    is True exactly where the class implements the method beside it (tests/test_architecture.py
    holds every sink to it); a method a sink lacks refuses with a UsageError naming the sink. The
    registry sink loads by pushing (importer/pipeline/registry.py), so it has no lookup, load, tag
    or remove of its own."""

    kind = "engine"
    #: ``load`` reads the blobs from a tar or parts in place: its ``root`` may be the opened archive
    #: (importer/input/opened.py); other sinks load from a bundle folder only
    reads_archives = False
    #: ``archive_command``: loads a docker-archive stream (schema 1/2 bundles)
    loads_docker_archive = False
    #: ``prepare_delta``: completes a delta bundle from layers it already holds
    completes_deltas = False
    #: ``list_tags``: lists its tags (stale staging tags are found and removed)
    lists_tags = False
    #: ``inventory``: lists every image it holds (``--inventory``)
    lists_images = False
    #: ``reexport``: exports an image again, for ``--deep``
    reexports = False
    #: ``load_files`` (and ``ref_digest``): keeps the files a bundle carries (3.6) as the OCI
    #: artifacts they are, under their refs (the OCI layout)
    takes_file_artifacts = False

    @property
    def checks_layers_while_loading(self) -> bool:
        """The load stream checks each layer blob it sends (digest, size, diff_id: read once,
        decompressed once) and holds back the end of a blob until it matched, so the verification
        before it leaves those blobs' bytes to the stream (importer/pipeline/importing.py)."""
        return False

    def streamed_layers(self, images: Sequence[ImageRecord]) -> Set[Digest]:
        """The layer blobs (digests) that loading ``images`` sends through such a checking stream."""
        return set()

    def _lacks(self, what: str) -> Exception:
        from importer.errors import UsageError

        return UsageError(f"{what} with the {self.kind} engine: expected an engine that can, found one that cannot")

    def lookup(self, name: str) -> Optional[EngineImage]:
        raise self._lacks(f"looking up {name}")

    def load(self, root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[Any] = None) -> None:
        raise self._lacks("loading images one by one")

    def tag(self, image_id: str, ref: str) -> None:
        raise self._lacks(f"tagging {ref}")

    def remove(self, image_id: str) -> None:
        raise self._lacks(f"removing {image_id}")

    def archive_command(self, what: str) -> Any:
        raise self._lacks("loading a docker-archive")

    def prepare_delta(self, manifest: Any) -> Any:
        raise self._lacks("completing a delta bundle")

    def list_tags(self) -> List[str]:
        raise self._lacks("listing tags")

    def inventory(self) -> List[EngineImage]:
        raise self._lacks("listing images (--inventory)")

    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> Any:
        raise self._lacks("exporting an image again (--deep)")

    def load_files(self, root: BundleRoot, artifacts: Sequence[Any], on_bytes: Optional[ProgressFn]) -> List[str]:
        raise self._lacks("keeping file artifacts")

    def ref_digest(self, ref: str) -> Optional[str]:
        raise self._lacks(f"looking up the artifact {ref}")

    def load_total(self, images: Sequence[ImageRecord], external: Optional[Any] = None) -> Optional[int]:
        """The bytes ``load`` reports to its progress callback where that is not the uncompressed
        layers it streams (None: it is)."""
        return None

    def close(self) -> None:
        """Release what the sink holds open (connections); nothing by default."""


def folder_of(root: BundleRoot, kind: str) -> str:
    """The bundle folder a sink without ``reads_archives`` loads from (the pipeline refuses a tar or
    parts for it before any change: importer/pipeline/importing.py)."""
    if not isinstance(root, str):
        raise AssertionError(f"the {kind} sink loads from a bundle folder only")  # pragma: no cover
    return root
