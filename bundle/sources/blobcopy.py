"""What a source that names its blobs by digest (containerd's content store, an OCI layout, a
registry, Docker's containerd content store) resolves an image to, before any layer is read:
its manifest or index read once (bounded, its digest checked) into records.py's records, the
manifest for the platform asked for (or each platform chosen: :class:`PlatformChoice`), each
config read byte for byte and checked against its digest, each layer paired with its config's
diff_id (:func:`resolve_target`, a :class:`~bundle.sources.protocol.ResolvedImage`). The one
export loop (bundle/exportloop.py) then copies the layers: byte for byte where the source keeps
them compressed (diff_id computed on the way), compressed where it keeps them as tars. Also the
small rules the loop and the sources share: the layer media types carried
(:data:`LAYER_COMPRESSION`), whether the source's manifest can be kept (:func:`keep_manifest`),
which compression a stream starts (:func:`sniff_compression`)."""

from __future__ import annotations

import dataclasses
from typing import Callable, ContextManager, Dict, List, Optional, Protocol, Sequence, Tuple, Union

from bundle.sources import LayerBlob, PlatformImage, ResolvedImage, platform_of
from bundle.sources.records import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    Descriptor,
    ImageIndex,
    ImageManifest,
    as_object,
    load_json,
    parse_image,
)
from importer.errors import BundleError, PlatformNotFound, SourceError
from importer.format.digest import Digest, is_digest
from importer.format.limits import MAX_CONFIG
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import (
    DOCKER_LAYER_GZIP,
    LAYER_TYPES,
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_LAYER_ZSTD,
    compression_of,
)
from importer.format.platform import Platform, of_dict
from importer.streams.readers import Readable

ProgressFn = Callable[[int], None]

#: layer media type -> (compression, the OCI media type the bundle records)
LAYER_COMPRESSION: Dict[str, Tuple[str, str]] = {
    OCI_LAYER_GZIP: ("gzip", OCI_LAYER_GZIP),
    DOCKER_LAYER_GZIP: ("gzip", OCI_LAYER_GZIP),
    OCI_LAYER_ZSTD: ("zstd", OCI_LAYER_ZSTD),
    OCI_LAYER_TAR: ("none", OCI_LAYER_TAR),
    "application/vnd.docker.image.rootfs.diff.tar": ("none", OCI_LAYER_TAR),
}
__all__ = ["INDEX_TYPES", "MANIFEST_TYPES"]  # re-exported: the media types sources pick targets by


class BlobProvider(Protocol):
    """Where the blobs are: opens a blob (a manifest, an index, a config, a layer) by digest."""

    where: str

    def open_blob(self, digest: str, what: str) -> ContextManager[Readable]: ...


GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def sniff_compression(head: bytes) -> Optional[str]:
    """'gzip' or 'zstd' when ``head`` starts a compressed stream, else None."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return None


def keep_manifest(raw_manifest: bytes, raw_config: bytes,
                  layers: Sequence[LayerRecord]) -> Optional[Tuple[Tuple[LayerRecord, ...], str, str]]:
    """The source's manifest may go into the bundle byte for byte when it describes exactly what
    the bundle carries: its config, and every layer stored as that very blob, or left out (a delta)
    naming that very blob as the offline host keeps it, of a media type bundle.json records.
    Returns (the layers with the manifest's media types, manifest
    media type, config media type), or None: the bundle then writes an OCI manifest of its own."""
    try:
        manifest = ImageManifest.parse(raw_manifest, "the source's manifest")
    except BundleError:
        return None
    media_type = manifest.media_type or MANIFEST_TYPES[0]
    if manifest.schema_version != 2 or media_type not in MANIFEST_TYPES:
        return None
    config = manifest.config
    if config.digest != Digest.of_bytes(raw_config) or config.size != len(raw_config):
        return None
    if len(manifest.layers) != len(layers):
        return None
    kept: List[LayerRecord] = []
    for desc, layer in zip(manifest.layers, layers):  # a left-out layer fits when it names that very blob (a delta)
        mt = desc.media_type
        if mt not in LAYER_TYPES or compression_of(mt) != compression_of(layer.media_type):
            return None
        if desc.digest != layer.digest or desc.size != layer.size:
            return None
        kept.append(dataclasses.replace(layer, media_type=mt))
    return tuple(kept), media_type, config.media_type


def read_blob_bytes(provider: BlobProvider, digest: Digest, limit: int, what: str) -> bytes:
    """A small blob's bytes, bounded and checked against its digest."""
    with provider.open_blob(str(digest), what) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit or Digest.of_bytes(raw) != digest:
        raise SourceError(f"{what}: expected the blob to hash to {digest} (at most {limit} bytes), found other bytes",
                          hint="the source's copy is corrupt; re-pull the image")
    return bytes(raw)


def read_image(provider: BlobProvider, desc: Descriptor, what: str) -> Union[ImageManifest, ImageIndex]:
    """The manifest or index ``desc`` names, read once (bounded, its digest checked) and parsed."""
    raw = read_blob_bytes(provider, desc.digest, MAX_CONFIG, f"{what}: manifest {str(desc.digest)[:19]}")
    return parse_image(raw, desc.media_type, f"{what}: manifest")


def _resolve(provider: BlobProvider, doc: Union[ImageManifest, ImageIndex], platform: Platform, what: str,
             notes: Optional[List[str]] = None) -> ImageManifest:
    """``doc`` itself, or the manifest an index lists for ``platform`` (indexes in indexes followed).
    ``notes``: gets one line when an index of several platforms is resolved to one (the others are
    dropped: the user is told how to keep them)."""
    if isinstance(doc, ImageManifest):
        return doc
    sub = _platform_entry(doc, platform, what)
    runs = sorted({str(p) for p in doc.platforms() if p.os != "unknown"})
    if notes is not None and len(runs) > 1:
        notes.append(f"note: {what}: a multi-platform image ({', '.join(runs)}); carrying "
                     f"{_entry_platform(sub)} only (pass --all-platforms to keep every platform)")
    return _resolve(provider, read_image(provider, sub, what), platform, what)


def _platform_entry(index: ImageIndex, want: Platform, what: str) -> Descriptor:
    sub = index.pick(want)
    if sub is not None:
        return sub
    found = [str(p) for p in index.platforms()]
    raise PlatformNotFound(f"{what}: expected a manifest for {want} in the index, "
                           f"found {', '.join(found) or 'none'}",
                           hint="pick one of those with --platform OS/ARCH[/VARIANT], or pull that platform first")


def pick_manifest(provider: BlobProvider, desc: Descriptor, platform: Platform, what: str, *,
                  strict: bool = False, notes: Optional[List[str]] = None) -> ImageManifest:
    """The image manifest of ``desc`` (an index resolves to the manifest for ``platform``).
    ``strict`` (``--platform`` given): a single-platform image must be for ``platform`` too, as its
    config says; without it a single manifest is carried whatever it runs on."""
    manifest = _resolve(provider, read_image(provider, desc, what), platform, what, None if strict else notes)
    if strict:
        require_platform(provider, manifest, platform, what)
    return manifest


def require_platform(provider: BlobProvider, manifest: ImageManifest, want: Platform, what: str) -> None:
    """PlatformNotFound unless the image's config names ``want`` (or names none)."""
    config = load_json(read_blob_bytes(provider, manifest.config.digest, MAX_CONFIG, f"{what}: config"),
                       f"{what}: config")
    found = of_dict(config)
    if found is not None and not want.matches(found):
        raise PlatformNotFound(f"{what}: expected an image for {want} (--platform), found a single-platform "
                               f"image for {found}",
                               hint=f"drop --platform to carry the {found} image, or export a build for {want}")


def resolve_target(provider: BlobProvider, target: Descriptor, ref: str, refs: Tuple[str, ...], *,
                   platform: Platform, choice: Optional[PlatformChoice], what: str) -> ResolvedImage:
    """What the export carries of the image ``target`` names (a manifest, or an index). Without
    ``choice``: the manifest for ``platform``. With one (``--all-platforms`` or several
    ``--platform``) and an index: every platform chosen, the primary (``platform``, this host's,
    when chosen; else the first) carrying the refs and the others beside it; with every platform,
    the index itself byte for byte. A single-manifest image is carried as it is."""
    doc = read_image(provider, target, what)
    if choice is None or isinstance(doc, ImageManifest):
        listed = platform if isinstance(doc, ImageIndex) else None
        image = resolve_platform(provider, _resolve(provider, doc, platform, what), what, listed)
        return ResolvedImage(ref, refs, target, what, (image,))
    entries = choice.entries(doc, what)
    primary = next((e for e in entries if _entry_platform(e).matches(platform)), entries[0])
    images = []
    for entry in [primary, *[e for e in entries if e is not primary]]:
        sub_what = f"{what} ({_entry_platform(entry)})"
        images.append(resolve_platform(provider, pick_manifest(provider, entry, platform, sub_what), sub_what,
                                       _entry_platform(entry)))
    return ResolvedImage(ref, refs, target, what, tuple(images), raw_index=doc.raw if choice.every else None,
                         index_media_type=target.media_type or doc.media_type)


def resolve_platform(provider: BlobProvider, manifest: ImageManifest, what: str,
                     listed: Optional[Platform] = None) -> PlatformImage:
    """One image manifest's config (read byte for byte, checked against its digest) and its
    layers, each paired with the config's diff_id and of a media type the bundle carries."""
    config_digest = manifest.config.digest
    with provider.open_blob(str(config_digest), f"{what}: config") as f:
        raw_config = f.read(MAX_CONFIG + 1)
    if len(raw_config) > MAX_CONFIG or Digest.of_bytes(raw_config) != config_digest:
        raise SourceError(f"{what}: expected the config to hash to {config_digest}, found other bytes",
                          hint="the source's copy of the config is corrupt; re-pull the image")
    config = load_json(raw_config, f"{what}: config")
    diff_ids = _diff_ids(config)
    descs = manifest.layers
    if len(descs) != len(diff_ids):
        raise SourceError(f"{what}: expected as many layers as the config's diff_ids ({len(diff_ids)}), "
                          f"found {len(descs)}")
    layers = []
    for i, (desc, diff_id) in enumerate(zip(descs, diff_ids)):
        label = f"{what}: layer {i + 1}/{len(descs)} {str(desc.digest)[:19]}"
        if desc.media_type not in LAYER_COMPRESSION:
            raise SourceError(f"{label}: expected a tar, tar+gzip or tar+zstd layer, found {desc.media_type!r}",
                              hint="foreign or non-distributable layers cannot be carried; rebuild the image")
        if not is_digest(diff_id):
            raise SourceError(f"{label}: expected a sha256 diff_id in the config, found {diff_id!r}")
        layers.append(LayerBlob(label, desc, Digest.parse(diff_id)))
    return PlatformImage(what, manifest, bytes(raw_config), platform_of(config), tuple(layers), listed)


def _diff_ids(config: object) -> List[str]:
    """The config's ``rootfs.diff_ids`` as strings (another type: no layer matches)."""
    rootfs = as_object((as_object(config) or {}).get("rootfs"))
    listed = rootfs.get("diff_ids") if rootfs is not None else None
    return [str(d) for d in listed] if isinstance(listed, list) else []


def manifests_for(provider: BlobProvider, target: Descriptor, platform: Platform, choice: Optional[PlatformChoice],
                  what: str, *, strict: bool = False, notes: Optional[List[str]] = None) -> List[ImageManifest]:
    """The image manifests :func:`resolve_target` resolves ``target`` to (every platform chosen,
    not one), checked before any layer is read."""
    if choice is None:
        return [pick_manifest(provider, target, platform, what, strict=strict, notes=notes)]
    doc = read_image(provider, target, what)
    if isinstance(doc, ImageManifest):
        return [doc]
    return [pick_manifest(provider, e, platform, what) for e in choice.entries(doc, what)]


def add_layer_sizes(manifests: Sequence[ImageManifest], sizes: Dict[str, int]) -> None:
    """Each layer blob's size into ``sizes`` (digest -> size): a blob two images share is read once,
    so the export's progress total counts it once."""
    for manifest in manifests:
        for d in manifest.layers:
            sizes[str(d.digest)] = d.size or 0


def _entry_platform(entry: Descriptor) -> Platform:
    return entry.platform or Platform("unknown", "unknown")


@dataclasses.dataclass(frozen=True)
class PlatformChoice:
    """Several platforms of a multi-platform image: ``every`` (``--all-platforms``: the whole
    index, kept byte for byte) or those ``wanted`` (several ``--platform``)."""

    every: bool = False
    wanted: Tuple[Platform, ...] = ()

    def entries(self, index: ImageIndex, what: str) -> List[Descriptor]:
        listed = list(index.manifests)
        if self.every:
            # attestation manifests (buildkit: platform unknown/unknown) describe, they run nowhere
            chosen = [e for e in listed if _entry_platform(e).os != "unknown"]
            if len(chosen) != len(listed):
                raise SourceError(f"{what}: expected every manifest of the index to be an image for a platform, "
                                  f"found {len(listed) - len(chosen)} attestation or unknown entries",
                                  hint="--all-platforms keeps the index as it is, so it needs all of it; pick the "
                                  "platforms with --platform OS/ARCH (repeatable) instead")
            return chosen
        chosen = []
        for want in self.wanted:
            entry = index.pick(want)
            if entry is None:
                found = [str(p) for p in index.platforms()]
                raise PlatformNotFound(f"{what}: expected a manifest for {want} in the index, "
                                       f"found {', '.join(found) or 'none'}",
                                       hint="pick among those with --platform OS/ARCH[/VARIANT]")
            if entry not in chosen:
                chosen.append(entry)
        return chosen
