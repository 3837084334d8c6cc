"""Image sources: where the exporter reads images from, and the records they give the export
loop: :class:`ResolvedImage` (what an export carries of an image, before any layer is read) and
:class:`SourceImage` (an image as carried: its stored layers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from bundle.sources.records import Descriptor, ImageManifest
from importer.format.artifacts import ArtifactRecord
from importer.format.digest import Digest
from importer.format.manifest import LayerRecord
from importer.format.platform import Platform


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
class LayerBlob:
    """One layer of a resolved image as its manifest names it (media type, digest, size) and the
    diff_id its config gives: what the export loop reads and checks."""

    label: str
    descriptor: Descriptor
    diff_id: Digest


@dataclass(frozen=True)
class PlatformImage:
    """One platform's image of a :class:`ResolvedImage`: its manifest (bytes kept), its config
    (bytes kept, hashed to the manifest's config digest) and its layers."""

    what: str
    manifest: ImageManifest
    raw_config: bytes
    platform: Dict[str, str]
    layers: Tuple[LayerBlob, ...]
    #: the platform an index lists it for: its config must be for that platform (None: not from an index)
    listed: Optional[Platform] = None


@dataclass(frozen=True)
class ResolvedImage:
    """What an export carries of one image, resolved before any layer is read: the names the
    bundle gives it, its target (a manifest or an index), each platform's image (the primary
    first) and, with every platform asked for, the index byte for byte."""

    #: the reference as the source was given it (``blobs`` and ``attached`` look it up again)
    ref: str
    refs: Tuple[str, ...]
    target: Descriptor
    what: str
    images: Tuple[PlatformImage, ...]
    raw_index: Optional[bytes] = None
    index_media_type: str = ""
    #: how a Docker source read it ("content-store"; ``SourceImage.read``)
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
