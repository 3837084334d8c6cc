"""Sources that already keep compressed layers (containerd's content store, an OCI layout):
copy each blob byte for byte instead of decompressing and compressing it again.

One read per layer: the compressed bytes go to the bundle's blob store (temp-then-rename) and
through a hasher, and the same bytes are decompressed on the fly to compute the diff_id and the
uncompressed size. The blob must hash to its descriptor's digest and the diff_ids must equal the
config's, else the export stops naming the layer. A layer the source keeps uncompressed is
compressed like a ``docker save`` layer. Layers the offline host already holds (``--have``) are
not read at all: the config names their diff_ids."""

from __future__ import annotations

import dataclasses
import gzip
import os
import threading
import zlib
from typing import (
    IO,
    Callable,
    ContextManager,
    Dict,
    List,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

import zstandard

from bundle.blobstore import BlobStore
from bundle.sources import SourceImage, platform_of
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
from importer.errors import WRITE_ERRNOS, BundleError, PlatformNotFound, SourceError
from importer.format.digest import CHUNK, Digest, hash_stream, is_digest
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
from importer.input.cudascan import CudaScan
from importer.inventory.have import HaveLayers
from importer.streams.readers import HashingReader, Readable, Writable
from importer.streams.signals import stop_requested
from importer.streams.threads import each

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


def _decompressed(tee: HashingReader, compression: str) -> ContextManager[Readable]:
    # a forward read calls read() alone (never seek): the stream is a file to gzip and zstandard
    src = cast(IO[bytes], tee)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=src, mode="rb")
    reader: ContextManager[Readable] = zstandard.ZstdDecompressor().stream_reader(
        src, read_size=CHUNK, read_across_frames=True, closefd=False)
    return reader


class _NullWriter:
    def write(self, data: bytes) -> int:
        return len(data)


class _Scanned:
    """A reader whose bytes also go to a CudaScan (the same pass: no second read)."""

    def __init__(self, src: Readable, scan: Optional[CudaScan]) -> None:
        self.src, self.scan = src, scan

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.src.read(n)
        if self.scan is not None:
            self.scan.feed(data)
        return data


def _read_compressed(src: Readable, out: Writable, compression: str, what: str,
                     on_bytes: Optional[ProgressFn],
                     scan: Optional[CudaScan] = None) -> Tuple[Digest, int, int, Digest]:
    """Read one compressed layer to its end, every byte also written to ``out`` (and the
    uncompressed bytes to ``scan``): (diff_id, uncompressed size, compressed size, compressed digest)."""
    tee = HashingReader(src, on_bytes, tee=out)
    try:
        with _decompressed(tee, compression) as reader:
            diff_id, usize = hash_stream(_Scanned(reader, scan))
    except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:  # the write to ``out`` (a full disk), no read
            raise
        raise SourceError(f"{what}: expected a {compression} stream, found it damaged ({e})",
                          hint="the source's copy of this blob is corrupt; re-pull the image") from e
    tee.drain()
    return diff_id, usize, tee.count, Digest("sha256", tee.hasher.hexdigest())


def _read_layer(src: Readable, out: Writable, desc: Descriptor, what: str,
                on_bytes: Optional[ProgressFn], scan: Optional[CudaScan] = None) -> Tuple[Digest, int, int]:
    """Read one compressed layer to its end: (diff_id, uncompressed size, compressed size),
    every byte also written to ``out``; the blob must hash to the descriptor's digest and size."""
    compression = LAYER_COMPRESSION[desc.media_type][0]
    want = desc.digest
    diff_id, usize, count, got = _read_compressed(src, out, compression, what, on_bytes, scan)
    if got != want or count != desc.size:
        raise SourceError(
            f"{what}: expected {want} ({desc.size} bytes), found {got} ({count} bytes)",
            hint="the source's copy of this blob is corrupt; re-pull the image")
    return diff_id, usize, count


def _recompress(store: BlobStore, src: Readable, compression: str, what: str,
                on_bytes: Optional[ProgressFn], expected: Optional[str] = None) -> Optional[LayerRecord]:
    """``--compression`` asked explicitly and this layer is kept compressed otherwise: decompress
    it (streamed) into a layer compressed as asked; None when it stays as stored."""
    target = store.recompress_to
    if target is None or target == compression:
        return None
    tee = HashingReader(src, on_bytes)  # counts the stored bytes read, as the progress total does
    try:
        with _decompressed(tee, compression) as plain:
            record = store.write_layer(plain, compression=target)
        tee.drain()
    except BundleError:
        raise
    except (OSError, EOFError, ValueError, zlib.error) as e:
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:  # the recompressed layer's write (a full disk)
            raise
        raise SourceError(f"{what}: expected a {compression} stream, found it damaged ({e})",
                          hint="the source's copy of this blob is corrupt; re-pull the image") from e
    got = "sha256:" + tee.hasher.hexdigest()
    if expected is not None and got != expected:
        store.discard(record.digest)
        raise SourceError(f"{what}: expected the stored blob to hash to {expected}, found {got}",
                          hint="the source's copy of this blob is corrupt; re-pull the image")
    store.recompressed.append(what)
    return record


def copy_layer(store: BlobStore, src: Readable, desc: Descriptor, what: str, *,
               on_bytes: Optional[ProgressFn] = None) -> LayerRecord:
    """Copy one compressed layer blob verbatim; its diff_id is computed on the way."""
    compression, media_type = LAYER_COMPRESSION[desc.media_type]
    again = _recompress(store, src, compression, what, on_bytes, str(desc.digest))
    if again is not None:
        return again
    scan = CudaScan()
    with store.temp() as (f, tmp):
        diff_id, usize, size = _read_layer(src, f, desc, what, on_bytes, scan)
    blob = store.commit(tmp, desc.digest, size)
    store.noted(diff_id, scan)
    return LayerRecord(media_type, blob.digest, blob.size, diff_id, usize)


GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def sniff_compression(head: bytes) -> Optional[str]:
    """'gzip' or 'zstd' when ``head`` starts a compressed stream, else None."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return None


def copy_stored_layer(store: BlobStore, src: Readable, compression: str, what: str, *,
                      on_bytes: Optional[ProgressFn] = None) -> LayerRecord:
    """Copy a compressed layer whose descriptor is not known yet (a ``docker save`` stream of
    Docker's containerd store, where blobs arrive before the manifest naming them): stored as it
    is, its digest and diff_id computed on the way."""
    again = _recompress(store, src, compression, what, on_bytes)
    if again is not None:
        return again
    media_type = OCI_LAYER_GZIP if compression == "gzip" else OCI_LAYER_ZSTD
    scan = CudaScan()
    with store.temp() as (f, tmp):
        diff_id, usize, size, digest = _read_compressed(src, f, compression, what, on_bytes, scan)
    blob = store.commit(tmp, digest, size)
    store.noted(diff_id, scan)
    return LayerRecord(media_type, blob.digest, blob.size, diff_id, usize)


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


class _Measured(NamedTuple):
    """A layer left out (the offline host holds it): read only to check its diff_id."""

    diff_id: Digest
    size: int


#: one layer blob to read: (its label, its descriptor, left out (``--have``) or carried)
_Job = Tuple[str, Tuple[str, Descriptor, bool]]


def _diff_ids(config: object) -> List[str]:
    """The config's ``rootfs.diff_ids`` as strings (another type: no layer matches)."""
    rootfs = as_object((as_object(config) or {}).get("rootfs"))
    listed = rootfs.get("diff_ids") if rootfs is not None else None
    return [str(d) for d in listed] if isinstance(listed, list) else []


def copy_image(provider: BlobProvider, manifest: ImageManifest, refs: Tuple[str, ...], store: BlobStore, *,
               compression: str, level: Optional[int], what: str, on_bytes: Optional[ProgressFn] = None,
               have: Optional[HaveLayers] = None, copied: Optional[Dict[str, LayerRecord]] = None) -> SourceImage:
    """One image: its config byte for byte, each layer copied (or left out when ``have`` holds it).
    The manifest's bytes are kept in the bundle when every layer is carried as that manifest
    describes it (:func:`keep_manifest`), so the manifest digest does not change."""
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
    copied = {} if copied is None else copied
    measured: Dict[str, _Measured] = {}
    labels: List[str] = []
    jobs: Dict[str, Tuple[str, Descriptor, bool]] = {}  # blob digest -> (label, descriptor, external)
    for i, (desc, diff_id) in enumerate(zip(descs, diff_ids)):
        label = f"{what}: layer {i + 1}/{len(descs)} {str(desc.digest)[:19]}"
        labels.append(label)
        if desc.media_type not in LAYER_COMPRESSION:
            raise SourceError(f"{label}: expected a tar, tar+gzip or tar+zstd layer, found {desc.media_type!r}",
                              hint="foreign or non-distributable layers cannot be carried; rebuild the image")
        if not is_digest(diff_id):
            raise SourceError(f"{label}: expected a sha256 diff_id in the config, found {diff_id!r}")
        key = str(desc.digest)
        external = have is not None and Digest.parse(diff_id) in have
        if key not in copied and (key not in jobs or (jobs[key][2] and not external)):
            jobs[key] = (label, desc, external)  # a blob one image both leaves out and carries is carried
    # every blob read at most once, a few at a time (each streamed), results kept in the image's order
    done = read_layers(list(jobs.items()), lambda job, guard: _read_one(
        provider, store, job, guard, compression=compression, level=level, on_bytes=on_bytes))
    for key, result in zip(jobs, done):
        if isinstance(result, LayerRecord):
            copied[key] = result
        else:
            measured[key] = result
    layers: List[LayerRecord] = []
    for label, desc, diff_id in zip(labels, descs, diff_ids):
        key = str(desc.digest)
        if have is not None and Digest.parse(diff_id) in have:
            got, usize = measured[key] if key in measured else (copied[key].diff_id, copied[key].uncompressed_size)
            if str(got) != diff_id:
                raise SourceError(f"{label}: expected diff_id {diff_id} (the config's), found {got}",
                                  hint="the source holds an inconsistent image; re-pull it")
            layers.append(_external(Digest.parse(diff_id), usize, have))
            continue
        record = copied[key]
        if str(record.diff_id) != diff_id:
            raise SourceError(f"{label}: expected diff_id {diff_id} (the config's), found {record.diff_id}",
                              hint="the source holds an inconsistent image; re-pull it")
        layers.append(record)
    kept = keep_manifest(manifest.raw, raw_config, layers)
    if kept is not None:
        return SourceImage(refs=refs, raw_config=raw_config, layers=kept[0], platform=platform_of(config),
                           raw_manifest=manifest.raw, manifest_media_type=kept[1], config_media_type=kept[2])
    return SourceImage(refs=refs, raw_config=raw_config, layers=tuple(layers), platform=platform_of(config))


def copy_target(provider: BlobProvider, target: Descriptor, refs: Tuple[str, ...], store: BlobStore, *,
                platform: Platform, choice: Optional[PlatformChoice], what: str, compression: str,
                level: Optional[int], on_bytes: Optional[ProgressFn] = None, have: Optional[HaveLayers] = None,
                copied: Optional[Dict[str, LayerRecord]] = None) -> SourceImage:
    """The image ``target`` names (a manifest, or an index). Without ``choice``: the manifest for
    ``platform`` (:func:`pick_manifest`). With one (``--all-platforms`` or several
    ``--platform``) and an index: every platform chosen, the primary (``platform``, this host's,
    when chosen; else the first) carrying the refs and the others beside it; with every platform,
    the index itself byte for byte. A single-manifest image is carried as it is."""
    copied = {} if copied is None else copied

    def copy(manifest: ImageManifest, names: Tuple[str, ...], label: str) -> SourceImage:
        return copy_image(provider, manifest, names, store, compression=compression, level=level, what=label,
                          on_bytes=on_bytes, have=have, copied=copied)

    doc = read_image(provider, target, what)
    if choice is None or isinstance(doc, ImageManifest):
        image = copy(_resolve(provider, doc, platform, what), refs, what)
        if isinstance(doc, ImageIndex):
            _check_index_platform(image, platform, what)
        return image
    entries = choice.entries(doc, what)
    primary = next((e for e in entries if _entry_platform(e).matches(platform)), entries[0])
    images = []
    for entry in [primary, *[e for e in entries if e is not primary]]:
        sub_what = f"{what} ({_entry_platform(entry)})"
        images.append(copy(pick_manifest(provider, entry, platform, sub_what), refs if entry is primary else (),
                           sub_what))
        _check_index_platform(images[-1], _entry_platform(entry), sub_what)
    return dataclasses.replace(images[0], others=tuple(images[1:]),
                               raw_index=doc.raw if choice.every else None,
                               index_media_type=target.media_type or doc.media_type)


def _check_index_platform(image: SourceImage, listed: Platform, what: str) -> None:
    """The config of the manifest an index lists for ``listed`` is for that platform: a reader
    picking its platform from the index must get its own image (issue 24 class 4)."""
    got = of_dict(image.platform)
    if got is not None and not got.matches(listed):
        raise SourceError(f"{what}: expected the manifest the index lists for {listed} to be an image for "
                          f"{listed}, found a config for {got}",
                          hint="the source's index contradicts its images; rebuild or re-push the image index")


def manifests_for(provider: BlobProvider, target: Descriptor, platform: Platform, choice: Optional[PlatformChoice],
                  what: str, *, strict: bool = False, notes: Optional[List[str]] = None) -> List[ImageManifest]:
    """The image manifests :func:`copy_target` will carry for ``target`` (every platform chosen,
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


#: layers read at once (each streamed: a read buffer and a decompressor's window apiece)
MAX_LAYER_WORKERS = 4


class _Stopped(Exception):
    """A layer read given up because another failed or a stop signal arrived (never reported)."""


class _Stoppable:
    """``src`` that gives up at the next read once ``stop`` is set."""

    def __init__(self, src: Readable, stop: threading.Event) -> None:
        self.src, self.stop = src, stop

    def read(self, n: int = -1) -> bytes:
        if self.stop.is_set() or stop_requested():
            raise _Stopped()
        return self.src.read(n)

    def readable(self) -> bool:
        return True


_J = TypeVar("_J")
_R = TypeVar("_R")


def read_layers(jobs: List[_J], fn: Callable[[_J, Callable[[Readable], Readable]], _R]) -> List[_R]:
    """``fn(job, guard)`` for every job on a small pool (``guard`` wraps the blob ``fn`` reads so it
    stops early once another job failed or a stop signal arrived), results in the jobs' order.
    The first real failure is raised, never a job that merely stopped because of it."""
    workers = min(len(jobs), MAX_LAYER_WORKERS, os.cpu_count() or 1)
    if workers <= 1:
        return [fn(job, lambda f: f) for job in jobs]
    stop = threading.Event()
    failures: List[BaseException] = []

    def one(job: _J) -> _R:
        try:
            return fn(job, lambda f: _Stoppable(f, stop))
        except _Stopped:
            raise
        except BaseException as e:
            failures.append(e)
            stop.set()
            raise

    try:
        return each(workers, one, jobs, on_abort=stop.set)
    except Exception:  # each() raises the first failure in the jobs' order; the one that stopped the rest counts
        if failures:
            raise failures[0] from None
        raise


def _read_one(provider: BlobProvider, store: BlobStore, job: _Job, guard: Callable[[Readable], Readable], *,
              compression: str, level: Optional[int], on_bytes: Optional[ProgressFn]) -> Union[LayerRecord, _Measured]:
    """One layer blob, streamed: left out (``external``: (diff_id, size) measured, nothing written)
    or copied into ``store`` (its LayerRecord)."""
    key, (label, desc, external) = job
    plain = LAYER_COMPRESSION[desc.media_type][0] == "none"
    with provider.open_blob(key, label) as raw:
        f = guard(raw)
        if external:
            if plain:
                counted = HashingReader(f)
                counted.drain()
                return _Measured(counted.digest(), counted.count)
            scan = CudaScan()  # measured anyway: what it shows of CUDA is seen in that pass
            got, usize, _ = _read_layer(f, _NullWriter(), desc, label, on_bytes, scan)
            store.noted(got, scan)
            return _Measured(got, usize)
        if plain:
            record = store.write_layer(f, compression=compression, level=level, on_bytes=on_bytes)
            if str(record.diff_id) != key:
                raise SourceError(f"{label}: expected the uncompressed layer to hash to {key}, "
                                  f"found {record.diff_id}", hint="re-pull the image")
            return record
        return copy_layer(store, f, desc, label, on_bytes=on_bytes)


def _external(diff_id: Digest, usize: int, have: HaveLayers) -> LayerRecord:
    """A layer the offline host holds: named by the blob it keeps, else uncompressed by diff_id
    (the same two forms a ``docker save`` export writes)."""
    blob = have[diff_id]
    if blob is not None:
        return LayerRecord(blob.media_type, blob.digest, blob.size, diff_id, usize, external=True)
    return LayerRecord(OCI_LAYER_TAR, diff_id, usize, diff_id, usize, external=True)
