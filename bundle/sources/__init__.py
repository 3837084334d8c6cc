"""Image sources: where the exporter reads images from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from importer.format.artifacts import ArtifactRecord
from importer.format.manifest import LayerRecord


@dataclass(frozen=True)
class SourceImage:
    """One image read from a source: exact config bytes and its stored layers, in order."""

    refs: Tuple[str, ...]
    raw_config: bytes
    layers: Tuple[LayerRecord, ...]
    platform: Dict[str, str]
    #: The source's own image manifest, kept byte for byte (its digest is the image ID on stores
    #: that keep manifests: Docker's containerd store, containerd, OCI layouts); None: the bundle
    #: writes an OCI manifest of its own. Set only when every layer is carried exactly as that
    #: manifest describes it (see blobcopy.keep_manifest).
    raw_manifest: Optional[bytes] = None
    manifest_media_type: str = ""
    config_media_type: str = ""
    #: a multi-platform image (bundle schema 3.2): the source's image index byte for byte when
    #: every platform was asked for (``--all-platforms``), and the other platforms carried
    raw_index: Optional[bytes] = None
    index_media_type: str = ""
    others: Tuple[SourceImage, ...] = ()
    #: bundle schema 3.5: signatures, attestations, SBOMs and referrers attached to it in the source
    artifacts: Tuple[ArtifactRecord, ...] = ()
    #: how a Docker source read it (``bundle export --json``'s ``read``): "store" (the classic store's
    #: layer files, bundle/sources/docker_store.py), "save" (the ``docker save`` stream),
    #: "content-store" (Docker's containerd content store); "" for other sources
    read: str = ""


@dataclass(frozen=True)
class SourceInfo:
    """What a source reports of itself: bundle.json's ``source`` (``kind`` and ``details``)."""

    kind: str
    details: Dict[str, object]


def platform_of(config: object) -> Dict[str, str]:
    """``os``, ``architecture`` and ``variant`` of an image config (those that are non-empty strings)."""
    out: Dict[str, str] = {}
    if isinstance(config, dict):
        for key in ("os", "architecture", "variant"):
            value = config.get(key)
            if isinstance(value, str) and value:
                out[key] = value
    return out


def order_refs(refs: List[str]) -> Tuple[str, ...]:
    seen: Dict[str, None] = {}
    for r in refs:
        seen.setdefault(r, None)
    return tuple(seen)
