"""Engine sinks: where a verified bundle is loaded. One small protocol, one module per engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer.format.manifest import ImageRecord

try:  # Protocol is in typing since 3.8
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore[assignment]


@dataclass(frozen=True)
class EngineInfo:
    kind: str
    version: str
    storage_driver: str
    # "classic": image ID = config digest (Docker classic store, podman); "containerd": Docker's
    # containerd image store, ID = the manifest Docker made while loading; "oci": the engine keeps
    # the bundle's own OCI manifest, ID = its digest (bare containerd, an OCI layout)
    image_store: str
    address: str
    data_root: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "storageDriver": self.storage_driver,
            "imageStore": self.image_store,
            "address": self.address,
            "dataRoot": self.data_root,
            **self.extra,
        }


@dataclass(frozen=True)
class EngineImage:
    """What an engine reports for one image."""

    image_id: str
    diff_ids: List[str]
    tags: List[str]
    config_digest: Optional[str] = None  # when the engine reports it separately from the ID
    manifest_digest: Optional[str] = None  # the manifest the engine keeps, where it keeps one
    # compressed layer blobs the engine keeps (containerd content store, OCI layout), as
    # {"mediaType", "digest", "size"}; empty where the engine keeps only unpacked layers
    blobs: List[Dict[str, Any]] = field(default_factory=list)
    # what the engine reports missing or incomplete (content blobs, snapshots)
    problems: List[str] = field(default_factory=list)


ProgressFn = Callable[[int], None]


class Sink(Protocol):
    """Load verified images into an engine and read back what it holds."""

    def probe(self) -> EngineInfo:
        """Check the engine answers; report its kind, version and storage."""
        ...

    def lookup(self, name: str) -> Optional[EngineImage]:
        """The image called ``name`` (a tag or an ID), or None."""
        ...

    def load(self, root: str, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn]) -> None:
        """Load ``images`` from the bundle at ``root`` untagged; raise on any failure."""
        ...

    def tag(self, image_id: str, ref: str) -> None: ...

    def remove(self, image_id: str) -> None: ...
