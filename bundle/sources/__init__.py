"""Image sources: where the exporter reads images from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from importer.format.artifacts import ArtifactRecord
from importer.format.manifest import LayerRecord

#: a parsed JSON object as a source reads it (a manifest, an index, a descriptor, bundle.json's
#: ``source``): checked field by field where it is used
JsonDoc = Dict[str, Any]
#: a parsed JSON document of any shape (what ``read_json`` returns before its shape is checked)
JsonValue = Any


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


@dataclass(frozen=True)
class SourceInfo:
    """What a source reports of itself: bundle.json's ``source`` (``kind`` and ``details``)."""

    kind: str
    details: JsonDoc


def platform_of(config: object) -> Dict[str, str]:
    out: Dict[str, str] = {}
    if isinstance(config, dict):
        for key in ("os", "architecture", "variant"):
            if isinstance(config.get(key), str) and config[key]:
                out[key] = config[key]
    return out


def order_refs(refs: List[str]) -> Tuple[str, ...]:
    seen: Dict[str, None] = {}
    for r in refs:
        seen.setdefault(r, None)
    return tuple(seen)
