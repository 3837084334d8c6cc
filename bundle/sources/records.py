"""The typed records the exporter's sources read their JSON into, each parsed once where it is
read, with one SourceError naming the document and the field when the shape is wrong:
:class:`Descriptor` (an OCI descriptor: media type, digest, size, platform, annotations,
artifact type, urls), :class:`ImageManifest` and :class:`ImageIndex` (their exact bytes kept,
so a manifest's digest survives). JSON not yet narrowed is ``object``; :data:`JsonObject` and
the small helpers here narrow it (bundle/sources holds no untyped value: tests/test_architecture.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Protocol, Tuple, Union

from importer.errors import SourceError
from importer.format.digest import Digest, is_digest
from importer.format.limits import parse_json
from importer.format.mediatypes import DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, REF_NAME_ANNOTATION
from importer.format.platform import Platform, of_dict

#: a JSON object as read: its values are checked where they are used (the helpers below)
JsonObject = Mapping[str, object]

MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")
DAMAGED = "the source holds a damaged image; re-pull (or re-push) it"


class ClosingReader(Protocol):
    """A blob opened for reading that the caller closes (a file, a registry's answer)."""

    def read(self, __n: int = -1) -> bytes: ...

    def close(self) -> None: ...


def load_json(raw: bytes, what: str) -> object:
    """A JSON document of any shape (importer.format.limits.parse_json: UTF-8, no lone surrogate)."""
    doc: object = parse_json(raw, what)
    return doc


def kind_of(value: object) -> str:
    """``value``'s JSON type in words, for messages."""
    names: Dict[type, str] = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
                              type(None): "null"}
    return names.get(type(value), "a number")


def as_object(value: object) -> Optional[JsonObject]:
    """``value`` when it is a JSON object, else None."""
    return value if isinstance(value, dict) else None


def json_object(value: object, what: str, *, hint: str = DAMAGED) -> JsonObject:
    """``value`` as a JSON object, else a SourceError saying what it is instead."""
    doc = as_object(value)
    if doc is None:
        raise SourceError(f"{what}: expected a JSON object, found {kind_of(value)}", hint=hint)
    return doc


def list_of(doc: JsonObject, key: str, what: str, *, hint: str = DAMAGED) -> List[object]:
    """``doc[key]`` as a list ([] when absent or null), else a SourceError."""
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SourceError(f"{what}: expected `{key}` to be a list, found {kind_of(value)}", hint=hint)
    return value


def text(doc: JsonObject, key: str) -> str:
    """``doc[key]`` when it is a string, else ""."""
    value = doc.get(key)
    return value if isinstance(value, str) else ""


def media_type_of(doc: JsonObject, what: str) -> str:
    """A document's own ``mediaType`` ("" when it names none), else a SourceError."""
    value = doc.get("mediaType")
    if value is not None and not isinstance(value, str):
        raise SourceError(f"{what}: expected a string as `mediaType`, found {repr(value)[:100]}", hint=DAMAGED)
    return value or ""


def size_of(value: object) -> Optional[int]:
    """A byte count (a non-negative integer, not a boolean), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True)
class Descriptor:
    """An OCI descriptor as a source names a blob: an index entry, a manifest's config or layer,
    an image a source lists (containerd's rows, Docker's image ID: no size known there)."""

    media_type: str
    digest: Digest
    #: None: the source names the blob without its size
    size: Optional[int] = None
    platform: Optional[Platform] = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    artifact_type: str = ""
    urls: Tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: object, what: str, *, hint: str = DAMAGED) -> Descriptor:
        """``value`` read as a descriptor: an object with a sha256 ``digest``, a string ``mediaType``
        and a byte count ``size`` when they are given; else a SourceError naming the field. A
        ``platform`` of another shape is no platform (index entries that name none are common)."""
        doc = json_object(value, what, hint=hint)

        def bad(key: str, expected: str) -> SourceError:
            return SourceError(f"{what}: expected {expected} as `{key}`, found {repr(doc.get(key))[:100]}",
                               hint=hint)

        if not is_digest(doc.get("digest")):
            raise bad("digest", "'sha256:' and 64 lowercase hex digits")
        media_type, size = doc.get("mediaType"), doc.get("size")
        if media_type is not None and not isinstance(media_type, str):
            raise bad("mediaType", "a string")
        if size is not None and size_of(size) is None:
            raise bad("size", "a byte count (an integer of at least 0)")
        annotations = as_object(doc.get("annotations")) or {}
        urls = doc.get("urls")
        return cls(media_type or "", Digest.parse(doc.get("digest")), size_of(size), of_dict(doc.get("platform")),
                   {k: v for k, v in annotations.items() if isinstance(v, str)}, text(doc, "artifactType"),
                   tuple(u for u in urls if isinstance(u, str)) if isinstance(urls, list) else ())

    @classmethod
    def of(cls, value: object) -> Optional[Descriptor]:
        """``value`` as a descriptor, or None when it is none (:meth:`parse`'s checks)."""
        try:
            return cls.parse(value, "a descriptor")
        except SourceError:
            return None

    @property
    def ref_name(self) -> str:
        """An OCI layout's name for the image (``org.opencontainers.image.ref.name``), or ""."""
        return self.annotations.get(REF_NAME_ANNOTATION, "")

    def to_json(self) -> Dict[str, object]:
        out: Dict[str, object] = {"mediaType": self.media_type, "digest": str(self.digest)}
        if self.size is not None:
            out["size"] = self.size
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        return out


@dataclass(frozen=True)
class ImageManifest:
    """An image manifest (OCI or Docker schema 2), its exact bytes kept."""

    raw: bytes
    media_type: str
    config: Descriptor
    layers: Tuple[Descriptor, ...]
    schema_version: Optional[int] = None

    @classmethod
    def parse(cls, raw: bytes, what: str) -> ImageManifest:
        return cls.of_doc(raw, json_object(load_json(raw, what), what), what)

    @classmethod
    def of_doc(cls, raw: bytes, doc: JsonObject, what: str) -> ImageManifest:
        config, layers = doc.get("config"), doc.get("layers")
        if not isinstance(layers, list) or not isinstance(config, dict):
            raise SourceError(f"{what}: expected an image manifest with a config and layers, found something else",
                              hint=DAMAGED)
        version = doc.get("schemaVersion")
        return cls(raw, media_type_of(doc, what), Descriptor.parse(config, f"{what}: config"),
                   tuple(Descriptor.parse(d, f"{what}: layer {n + 1}") for n, d in enumerate(layers)),
                   version if isinstance(version, int) and not isinstance(version, bool) else None)


@dataclass(frozen=True)
class ImageIndex:
    """An image index (OCI, or a Docker manifest list), its exact bytes kept."""

    raw: bytes
    media_type: str
    manifests: Tuple[Descriptor, ...]

    def platforms(self) -> List[Platform]:
        """The platforms it lists (entries without one left out)."""
        return [e.platform for e in self.manifests if e.platform is not None]

    def pick(self, want: Platform) -> Optional[Descriptor]:
        """The entry for ``want``, or None. The first match wins, as in containerd."""
        return next((e for e in self.manifests if e.platform is not None and e.platform.matches(want)), None)


def parse_image(raw: bytes, media_type: str, what: str) -> Union[ImageManifest, ImageIndex]:
    """A manifest or an index: an index when ``media_type`` (its descriptor's) says so or when it
    lists ``manifests``."""
    doc = json_object(load_json(raw, what), what)
    if media_type not in INDEX_TYPES and not isinstance(doc.get("manifests"), list):
        return ImageManifest.of_doc(raw, doc, what)
    entries = list_of(doc, "manifests", what)
    return ImageIndex(raw, media_type_of(doc, what),
                      tuple(Descriptor.parse(e, f"{what}: manifest {n}") for n, e in enumerate(entries)))
