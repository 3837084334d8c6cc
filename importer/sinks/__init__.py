"""Engine sinks: where a verified bundle is loaded. One small protocol, one module per engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer.manifest import ImageRecord

try:  # Protocol is in typing since 3.8
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore[assignment]


@dataclass(frozen=True)
class EngineInfo:
    kind: str
    version: str
    storage_driver: str
    image_store: str  # "classic" (image ID = config digest) or "containerd" (ID = manifest digest)
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
