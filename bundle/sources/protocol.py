"""The one contract between ``bundle export`` and its sources (Docker, containerd, an OCI layout,
a registry): :class:`ExportSource`, and the typed records it takes and returns.

A source says what it can do by DECLARED members (:class:`SourceBase`'s flags and methods), never
by its class: the exporter asks ``knows_sizes_ahead``, ``writes_legacy_schemas``,
``picks_platform_in_engine``, ``carries_attached`` and :meth:`ExportSource.image_env`, and no
``isinstance``/``hasattr`` on a source is left (tests/test_sources_protocol.py). What an export
asks of each image (platform, platforms, attached artifacts) is a :class:`Selection` passed to
every call: a source keeps no state between the images it reads (no cursor)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from bundle.blobstore import BlobStore
from bundle.sources import SourceImage, SourceInfo
from bundle.sources.blobcopy import PlatformChoice, ProgressFn
from importer.errors import UsageError
from importer.format.platform import Platform, host
from importer.inventory.have import HaveLayers


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

    def export(self, refs: Sequence[str], store: BlobStore, selection: Selection, *, compression: str,
               level: Optional[int], on_bytes: Optional[ProgressFn] = None,
               have: Optional[HaveLayers] = None) -> List[SourceImage]:
        """Every image's layers into ``store`` (``have``: layers the offline host holds, left out)."""
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

    def legacy_save_argv(self, refs: Sequence[str]) -> List[str]:
        raise UsageError(f"exporting from {self.kind} into a schema 1 or 2 bundle: expected a Docker source "
                         "(schemas 1 and 2 are a `docker save` archive), found another",
                         hint="drop --schema or use --schema 3")

    def close(self) -> None:
        return None
