"""The engines: the clients that talk to Docker (its Engine API and CLI), containerd (``ctr``) and
podman, and the facts they report (:class:`EngineInfo`, :class:`EngineImage`). The sinks
(importer/sinks/) load through them; the exporter's sources (bundle/sources/) read through them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, TypedDict, Union

from importer.errors import BundleError

#: what an engine says beside its kind, version and storage (Docker's transport, containerd's
#: namespace and snapshotter, podman's run root, a registry's scheme): the receipt's engine section
EngineExtra = Dict[str, Union[str, bool, None]]


class EngineBlob(TypedDict):
    """A compressed layer blob an engine keeps, as its manifest names it."""

    mediaType: Optional[str]
    digest: Optional[str]
    size: Optional[int]


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
    extra: EngineExtra = field(default_factory=dict)

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
    # compressed layer blobs the engine keeps (containerd content store, OCI layout); empty where
    # the engine keeps only unpacked layers
    blobs: List[EngineBlob] = field(default_factory=list)
    # what the engine reports missing or incomplete (content blobs, snapshots)
    problems: List[str] = field(default_factory=list)


#: how many images one ``docker|podman image inspect`` asks about
INSPECT_BATCH = 100


def inspect_each(ids: Sequence[str], inspect: Callable[[Sequence[str]], Optional[bytes]],
                 describe: Callable[[Any], EngineImage]) -> List[EngineImage]:
    """Every image of ``ids`` as ``describe`` reads one object of ``image inspect``'s JSON array,
    asked ``INSPECT_BATCH`` at a time. What the host holds besides the bundle never fails the run:
    a batch the engine refuses (``inspect`` returns None: an image removed since it was listed)
    is asked again one image at a time, and an image it still refuses, or whose description is
    not an image (no ``Id``), is left out, as one it does not hold. Left out, its layers count as
    absent: a delta then carries them, never assumes them (docs/deltas.md)."""
    images: List[EngineImage] = []
    for start in range(0, len(ids), INSPECT_BATCH):
        batch = list(ids[start:start + INSPECT_BATCH])
        raw = inspect(batch)
        if raw is None and len(batch) > 1:
            for one in batch:
                images += inspect_each([one], inspect, describe)
            continue
        try:
            docs = json.loads((raw or b"[]").decode("utf-8", "replace") or "[]")
        except ValueError:
            docs = []
        for doc in docs if isinstance(docs, list) else []:
            try:
                images.append(describe(doc))
            except BundleError:
                continue
    return images
