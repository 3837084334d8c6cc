"""The one contract between ``bundle export`` and its sources (Docker, containerd, an OCI layout,
a registry): :class:`ExportSource`, and the typed records it takes and returns.

A source says what it can do by DECLARED members (:class:`SourceBase`'s flags and methods), never
by its class: the exporter asks ``knows_sizes_ahead``, ``writes_legacy_schemas``,
``picks_platform_in_engine``, ``carries_attached`` and :meth:`ExportSource.image_env`, and no
``isinstance``/``hasattr`` on a source is left (tests/test_sources_protocol.py). What an export
asks of each image (platform, platforms, attached artifacts) is a :class:`Selection` passed to
every call: a source keeps no state between the images it reads (no cursor).

A source does not copy: :meth:`ExportSource.resolve` says what an export carries of each image (a
:class:`ResolvedImage`: its target, each platform's manifest, config and layers, the index kept),
:meth:`ExportSource.blobs` opens the bytes by digest, and the one export loop
(bundle/exportloop.py) reads, hashes, compresses and checks them into the blob store. A
``docker save`` archive names its layers only as it is read: :meth:`ExportSource.stream` yields
each layer's bytes (a :class:`StreamedLayer`) to the loop and gets its stored record back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    Callable,
    ContextManager,
    Generator,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    runtime_checkable,
)

from bundle.sources import LayerBlob, PlatformImage, ResolvedImage, SourceImage, SourceInfo
from bundle.sources.attached import ArtifactSource
from bundle.sources.blobcopy import BlobProvider, PlatformChoice
from importer.errors import UsageError
from importer.format.digest import Digest, Readable
from importer.format.manifest import LayerRecord
from importer.format.platform import Platform, host

__all__ = ["LayerBlob", "PlatformImage", "ResolvedImage"]  # re-exported: what resolve() returns


@dataclass(frozen=True)
class Selection:
    """What an export carries of each image: the platform picked from an image index (default:
    this host's), whether ``--platform`` was given (a single-platform image must then be for it
    too), several platforms (``--all-platforms``, several ``--platform``), and whether the
    artifacts attached to it (signatures, SBOMs, referrers) come along (unless --no-referrers)."""

    platform: Platform = field(default_factory=host)
    platform_given: bool = False
    choice: Optional[PlatformChoice] = None
    attached: bool = True


@dataclass(frozen=True)
class CheckedRefs:
    """What :meth:`ExportSource.check_refs` found before any layer is read: the layers' total size
    (exact where ``knows_sizes_ahead``, else the engine's own estimate) and lines for the user
    (the platforms a default export leaves out)."""

    size: int
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Attached:
    """Where the artifacts attached to a resolved image are read, and the index one platform was
    picked from (bytes, media type) when the target is one."""

    reader: ArtifactSource
    picked_from: Optional[Tuple[bytes, str]] = None


@dataclass(frozen=True)
class StreamedImages:
    """Images whose layers are known only as an archive is read (``docker save``): :meth:`ExportSource.stream`."""

    refs: Tuple[str, ...]
    #: how a Docker source read them ("save", "store"; ``SourceImage.read``)
    read: str = ""


@dataclass(frozen=True)
class StreamedLayer:
    """One layer's bytes as a source reaches it: ``form`` is "tar" (compressed by the loop) or
    "gzip"/"zstd" (stored as it is, its digest computed on the way). ``expected`` (a tar): the
    diff_id it must hash to; the loop then leaves it out where the offline host holds it (``--have``:
    hashed, not written) and gives back a :class:`LayerMismatch` where it hashes to another."""

    label: str
    #: opens the bytes (a ``docker save`` member: the stream itself; a classic store layer: its tar rebuilt)
    open: Callable[[], ContextManager[Readable]]
    form: str = "tar"
    expected: Optional[Digest] = None
    #: its bytes count in the export's progress
    counted: bool = True


class LayerRefused(Exception):
    """Raised by a source's reader mid-layer when what it reads cannot give the layer (one line
    saying why): the loop gives the layer back as a :class:`LayerMismatch`, the other layers go on."""


@dataclass(frozen=True)
class LayerMismatch:
    """A streamed layer not carried: it hashed to ``found`` (None: its reader refused, ``reason``),
    not its expected diff_id; ``measured``: it was only hashed (the offline host holds it)."""

    found: Optional[Digest]
    reason: str = ""
    measured: bool = False


#: what a source resolves each image to
Resolved = Union[ResolvedImage, StreamedImages]
#: what the loop gives back for a streamed layer (a layer left out: its LayerRecord says ``external``)
Stored = Union[LayerRecord, LayerMismatch]
#: a source's stream: layers (one at a time, or a batch read a few at a time) out, what was stored back in
LayerFeed = Generator[Union[StreamedLayer, List[StreamedLayer]], Union[Stored, List[Stored]], List[SourceImage]]


@runtime_checkable
class ExportSource(Protocol):
    """Where ``bundle export`` reads images from (bundle/sources/choose.py opens one)."""

    #: the source's name in bundle.json (``source.kind``) and in messages
    kind: str
    #: check_refs' size is the bytes the export will read (a progress total); Docker's image size
    #: counts file contents, not the tar read, so its total is unknown ahead
    knows_sizes_ahead: bool
    #: schemas 1 and 2 (a ``docker save`` archive): :meth:`legacy_save_argv`
    writes_legacy_schemas: bool
    #: the engine exports the platform it runs, not one picked from an index (no --platform choice)
    picks_platform_in_engine: bool
    #: carries the artifacts attached to an image (``Selection.attached``)
    carries_attached: bool

    def info(self) -> SourceInfo:
        """The source answers: its kind and details for bundle.json's ``source``."""
        ...

    def check_refs(self, refs: Sequence[str], selection: Selection) -> CheckedRefs:
        """Every reference found (else ImageNotFound naming it) before anything is written."""
        ...

    def resolve(self, refs: Sequence[str], selection: Selection) -> List[Resolved]:
        """What the export carries of each image (one record per image, all its names), read
        before any layer: the export loop (bundle/exportloop.py) then reads the layers."""
        ...

    def blobs(self, image: ResolvedImage) -> BlobProvider:
        """Opens ``image``'s blobs by digest (layers streamed, never held in memory)."""
        ...

    def attached(self, image: ResolvedImage) -> Optional[Attached]:
        """Where the artifacts attached to ``image`` are read (``carries_attached``), else None."""
        ...

    def stream(self, images: StreamedImages) -> LayerFeed:
        """``images``' layers as the source reaches them, each (or a batch, read a few at a time)
        sent to the loop; returns the images, their layers the records the loop sent back."""
        ...

    def image_env(self, ref: str) -> Optional[List[str]]:
        """The image's ``Config.Env`` read cheaply before the export (the early GPU-fit refusal,
        bundle/gpufit.py); None where the source cannot say without reading the image."""
        ...

    def legacy_save_argv(self, refs: Sequence[str]) -> List[str]:
        """The ``docker save`` command a schema 1 or 2 bundle is written from (``writes_legacy_schemas``)."""
        ...

    def close(self) -> None:
        """Connections the source opened, closed (after the export, or when it fails)."""
        ...


class SourceBase:
    """The defaults of :class:`ExportSource`, declared once: a source overrides exactly the flags
    and methods it has (tests/test_sources_protocol.py holds every source to it); a method a
    source lacks refuses with a UsageError naming the source."""

    kind = "source"
    knows_sizes_ahead = True
    writes_legacy_schemas = False
    picks_platform_in_engine = False
    carries_attached = False

    def image_env(self, ref: str) -> Optional[List[str]]:
        return None

    def resolve(self, refs: Sequence[str], selection: Selection) -> List[Resolved]:
        return []

    def blobs(self, image: ResolvedImage) -> BlobProvider:
        raise UsageError(f"exporting from {self.kind}: expected a source that reads blobs by digest, found another")

    def attached(self, image: ResolvedImage) -> Optional[Attached]:
        return None

    def stream(self, images: StreamedImages) -> LayerFeed:
        raise UsageError(f"exporting from {self.kind}: expected a source that streams an archive, found another")

    def legacy_save_argv(self, refs: Sequence[str]) -> List[str]:
        raise UsageError(f"exporting from {self.kind} into a schema 1 or 2 bundle: expected a Docker source "
                         "(schemas 1 and 2 are a `docker save` archive), found another",
                         hint="drop --schema or use --schema 3")

    def close(self) -> None:
        return None
