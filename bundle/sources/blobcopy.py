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
import json
import os
import threading
import zlib
from typing import Any, BinaryIO, Callable, ContextManager, Dict, List, Optional, Protocol, Sequence, Tuple

import zstandard

from bundle.blobstore import BlobStore
from bundle.sources import JsonValue, SourceImage, platform_of
from importer.errors import BundleError, PlatformNotFound, SourceError
from importer.format.digest import CHUNK, Digest, hash_stream, is_digest
from importer.format.limits import MAX_CONFIG, parse_json
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import (
    DOCKER_LAYER_GZIP,
    LAYER_TYPES,
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_LAYER_ZSTD,
    compression_of,
)
from importer.format.platform import Platform, index_platforms, of_dict, pick_entry
from importer.input.cudascan import CudaScan
from importer.inventory.have import HaveLayers
from importer.streams.readers import HashingReader, Readable
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
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")


class BlobProvider(Protocol):
    """Where the blobs are: reads JSON documents and opens blobs by digest."""

    where: str

    def read_json(self, digest: str, limit: int, what: str) -> JsonValue: ...

    def open_blob(self, digest: str, what: str) -> ContextManager[BinaryIO]: ...


def _decompressed(tee: HashingReader, compression: str) -> ContextManager[Any]:
    src: Any = tee
    if compression == "gzip":
        return gzip.GzipFile(fileobj=src, mode="rb")
    dctx = zstandard.ZstdDecompressor()
    return dctx.stream_reader(src, read_size=CHUNK, read_across_frames=True, closefd=False)


class _NullWriter:
    def write(self, data: Any) -> int:
        return len(data)


class _Scanned:
    """A reader whose bytes also go to a CudaScan (the same pass: no second read)."""

    def __init__(self, src: Any, scan: Optional[CudaScan]) -> None:
        self.src, self.scan = src, scan

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.src.read(n)
        if self.scan is not None:
            self.scan.feed(data)
        return data


def _read_compressed(src: Readable, out: Any, compression: str, what: str,
                     on_bytes: Optional[ProgressFn],
                     scan: Optional[CudaScan] = None) -> Tuple[Digest, int, int, Digest]:
    """Read one compressed layer to its end, every byte also written to ``out`` (and the
    uncompressed bytes to ``scan``): (diff_id, uncompressed size, compressed size, compressed digest)."""
    tee = HashingReader(src, on_bytes, tee=out)
    try:
        with _decompressed(tee, compression) as reader:
            diff_id, usize = hash_stream(_Scanned(reader, scan))
    except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:
        raise SourceError(f"{what}: expected a {compression} stream, found it damaged ({e})",
                          hint="the source's copy of this blob is corrupt; re-pull the image") from e
    tee.drain()
    return diff_id, usize, tee.count, Digest("sha256", tee.hasher.hexdigest())


def _read_layer(src: Readable, out: Any, desc: Dict[str, Any], what: str,
                on_bytes: Optional[ProgressFn], scan: Optional[CudaScan] = None) -> Tuple[Digest, int, int]:
    """Read one compressed layer to its end: (diff_id, uncompressed size, compressed size),
    every byte also written to ``out``; the blob must hash to the descriptor's digest and size."""
    compression = LAYER_COMPRESSION[str(desc["mediaType"])][0]
    want = Digest.parse(desc.get("digest"), what=f"{what}: digest")
    diff_id, usize, count, got = _read_compressed(src, out, compression, what, on_bytes, scan)
    if got != want or count != desc.get("size"):
        raise SourceError(
            f"{what}: expected {want} ({desc.get('size')} bytes), found {got} ({count} bytes)",
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
        raise SourceError(f"{what}: expected a {compression} stream, found it damaged ({e})",
                          hint="the source's copy of this blob is corrupt; re-pull the image") from e
    got = "sha256:" + tee.hasher.hexdigest()
    if expected is not None and got != expected:
        store.discard(record.digest)
        raise SourceError(f"{what}: expected the stored blob to hash to {expected}, found {got}",
                          hint="the source's copy of this blob is corrupt; re-pull the image")
    store.recompressed.append(what)
    return record


def copy_layer(store: BlobStore, src: Readable, desc: Dict[str, Any], what: str, *,
               on_bytes: Optional[ProgressFn] = None) -> LayerRecord:
    """Copy one compressed layer blob verbatim; its diff_id is computed on the way."""
    again = _recompress(store, src, LAYER_COMPRESSION[str(desc["mediaType"])][0], what, on_bytes,
                        str(desc.get("digest")))
    if again is not None:
        return again
    media_type = LAYER_COMPRESSION[str(desc["mediaType"])][1]
    scan = CudaScan()
    with store.temp() as (f, tmp):
        diff_id, usize, size = _read_layer(src, f, desc, what, on_bytes, scan)
    blob = store.commit(tmp, Digest.parse(desc["digest"]), size)
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
        doc = json.loads(raw_manifest)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        return None
    media_type = doc.get("mediaType") or MANIFEST_TYPES[0]
    config = doc.get("config")
    descs = doc.get("layers")
    if media_type not in MANIFEST_TYPES or not isinstance(config, dict) or not isinstance(descs, list):
        return None
    if config.get("digest") != str(Digest.of_bytes(raw_config)) or config.get("size") != len(raw_config):
        return None
    if len(descs) != len(layers):
        return None
    kept: List[LayerRecord] = []
    for desc, layer in zip(descs, layers):
        if not isinstance(desc, dict):  # a left-out layer fits when it names that very blob (a delta)
            return None
        mt = desc.get("mediaType")
        if mt not in LAYER_TYPES or compression_of(str(mt)) != compression_of(layer.media_type):
            return None
        if desc.get("digest") != str(layer.digest) or desc.get("size") != layer.size:
            return None
        kept.append(dataclasses.replace(layer, media_type=str(mt)))
    return tuple(kept), str(media_type), str(config.get("mediaType") or "")


def read_blob_bytes(provider: BlobProvider, digest: str, limit: int, what: str) -> bytes:
    """A small blob's bytes, bounded and checked against its digest."""
    want = Digest.parse(digest, what=f"{what}: digest")
    with provider.open_blob(str(want), what) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit or Digest.of_bytes(raw) != want:
        raise SourceError(f"{what}: expected the blob to hash to {want} (at most {limit} bytes), found other bytes",
                          hint="the source's copy is corrupt; re-pull the image")
    return bytes(raw)


def pick_manifest_raw(provider: BlobProvider, desc: Dict[str, Any], platform: Any,
                      what: str, notes: Optional[List[str]] = None) -> Tuple[Any, bytes]:
    """:func:`pick_manifest` and the manifest's exact bytes. ``platform``: a Platform or an
    (os, architecture) pair. ``notes``: gets one line when an index of several platforms is
    resolved to one (the others are dropped: the user is told how to keep them)."""
    raw = read_blob_bytes(provider, str(desc["digest"]), MAX_CONFIG, f"{what}: manifest {str(desc['digest'])[:19]}")
    doc = parse_json(raw, f"{what}: manifest")
    if desc.get("mediaType") in INDEX_TYPES or (isinstance(doc, dict) and isinstance(doc.get("manifests"), list)):
        sub = _platform_entry(doc, platform, what)
        runs = sorted({str(p) for p in index_platforms(doc) if p.os != "unknown"})
        if notes is not None and len(runs) > 1:
            notes.append(f"note: {what}: a multi-platform image ({', '.join(runs)}); carrying "
                         f"{_entry_platform(sub)} only (pass --all-platforms to keep every platform)")
        return pick_manifest_raw(provider, sub, platform, what)
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list) or not isinstance(doc.get("config"), dict):
        raise SourceError(f"{what}: expected an image manifest with a config and layers, found something else")
    return doc, raw


def _platform_entry(doc: Any, platform: Any, what: str) -> Dict[str, Any]:
    want = platform if isinstance(platform, Platform) else Platform(*platform)
    sub = pick_entry(doc, want)
    if sub is not None:
        return sub
    found = [str(p) for p in index_platforms(doc)]
    raise PlatformNotFound(f"{what}: expected a manifest for {want} in the index, "
                           f"found {', '.join(found) or 'none'}",
                           hint="pick one of those with --platform OS/ARCH[/VARIANT], or pull that platform first")


def pick_manifest(provider: BlobProvider, desc: Dict[str, Any], platform: Any, what: str, *,
                  strict: bool = False, notes: Optional[List[str]] = None) -> Any:
    """The image manifest of ``desc`` (an index resolves to the manifest for ``platform``).
    ``strict`` (``--platform`` given): a single-platform image must be for ``platform`` too, as its
    config says; without it a single manifest is carried whatever it runs on."""
    manifest = pick_manifest_raw(provider, desc, platform, what, None if strict else notes)[0]
    if strict:
        require_platform(provider, manifest, platform, what)
    return manifest


def require_platform(provider: BlobProvider, manifest: Any, platform: Any, what: str) -> None:
    """PlatformNotFound unless the image's config names ``platform`` (or names none)."""
    want = platform if isinstance(platform, Platform) else Platform(*platform)
    config_digest = str((manifest.get("config") or {}).get("digest"))
    config = parse_json(read_blob_bytes(provider, config_digest, MAX_CONFIG, f"{what}: config"), f"{what}: config")
    found = of_dict(config) if isinstance(config, dict) else None
    if found is not None and not want.matches(found):
        raise PlatformNotFound(f"{what}: expected an image for {want} (--platform), found a single-platform "
                               f"image for {found}",
                               hint=f"drop --platform to carry the {found} image, or export a build for {want}")


def copy_image(provider: BlobProvider, manifest: Any, refs: Tuple[str, ...], store: BlobStore, *,
               compression: str, level: Optional[int], what: str, on_bytes: Optional[ProgressFn] = None,
               have: Optional[HaveLayers] = None, copied: Optional[Dict[str, LayerRecord]] = None,
               raw_manifest: Optional[bytes] = None) -> SourceImage:
    """One image: its config byte for byte, each layer copied (or left out when ``have`` holds it).
    ``raw_manifest`` (the bytes of ``manifest``) is kept in the bundle when every layer is carried
    as that manifest describes it (:func:`keep_manifest`), so the manifest digest does not change."""
    config_desc = manifest["config"]
    config_digest = Digest.parse(config_desc.get("digest"), what=f"{what}: config digest")
    with provider.open_blob(str(config_digest), f"{what}: config") as f:
        raw_config = f.read(MAX_CONFIG + 1)
    if len(raw_config) > MAX_CONFIG or Digest.of_bytes(raw_config) != config_digest:
        raise SourceError(f"{what}: expected the config to hash to {config_digest}, found other bytes",
                          hint="the source's copy of the config is corrupt; re-pull the image")
    config = parse_json(raw_config, f"{what}: config")
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    listed = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    diff_ids = [str(d) for d in listed] if isinstance(listed, list) else []  # another type: no layer matches
    descs = [d for d in manifest["layers"] if isinstance(d, dict)]
    if len(descs) != len(diff_ids):
        raise SourceError(f"{what}: expected as many layers as the config's diff_ids ({len(diff_ids)}), "
                          f"found {len(descs)}")
    copied = {} if copied is None else copied
    measured: Dict[str, Tuple[Digest, int]] = {}
    labels: List[str] = []
    jobs: Dict[str, Tuple[str, Dict[str, Any], bool]] = {}  # blob digest -> (label, descriptor, external)
    for i, (desc, diff_id) in enumerate(zip(descs, diff_ids)):
        label = f"{what}: layer {i + 1}/{len(descs)} {str(desc.get('digest'))[:19]}"
        labels.append(label)
        media_type = str(desc.get("mediaType"))
        if media_type not in LAYER_COMPRESSION:
            raise SourceError(f"{label}: expected a tar, tar+gzip or tar+zstd layer, found {media_type!r}",
                              hint="foreign or non-distributable layers cannot be carried; rebuild the image")
        if not is_digest(diff_id):
            raise SourceError(f"{label}: expected a sha256 diff_id in the config, found {diff_id!r}")
        key = str(desc.get("digest"))
        external = have is not None and Digest.parse(diff_id) in have
        if key not in copied and (key not in jobs or (jobs[key][2] and not external)):
            jobs[key] = (label, desc, external)  # a blob one image both leaves out and carries is carried
    # every blob read at most once, a few at a time (each streamed), results kept in the image's order
    done = read_layers(list(jobs.items()), lambda job, guard: _read_one(
        provider, store, job, guard, compression=compression, level=level, on_bytes=on_bytes))
    for (key, (_, _, external)), result in zip(jobs.items(), done):
        if external:
            measured[key] = result
        else:
            copied[key] = result
    layers: List[LayerRecord] = []
    for label, desc, diff_id in zip(labels, descs, diff_ids):
        key = str(desc.get("digest"))
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
    kept = keep_manifest(raw_manifest, raw_config, layers) if raw_manifest is not None else None
    if kept is not None:
        return SourceImage(refs=refs, raw_config=raw_config, layers=kept[0], platform=platform_of(config),
                           raw_manifest=raw_manifest, manifest_media_type=kept[1], config_media_type=kept[2])
    return SourceImage(refs=refs, raw_config=raw_config, layers=tuple(layers), platform=platform_of(config))


def copy_target(provider: BlobProvider, target: Dict[str, Any], refs: Tuple[str, ...], store: BlobStore, *,
                platform: Any, choice: Optional[PlatformChoice], what: str, **copy: Any) -> SourceImage:
    """The image ``target`` names (a manifest, or an index). Without ``choice``: the manifest for
    ``platform`` (:func:`pick_manifest_raw`). With one (``--all-platforms`` or several
    ``--platform``) and an index: every platform chosen, the primary (``platform``, this host's,
    when chosen; else the first) carrying the refs and the others beside it; with every platform,
    the index itself byte for byte. A single-manifest image is carried as it is."""
    raw = read_blob_bytes(provider, str(target["digest"]), MAX_CONFIG, f"{what}: manifest {str(target['digest'])[:19]}")
    doc = parse_json(raw, f"{what}: manifest")
    is_index = target.get("mediaType") in INDEX_TYPES or (
        isinstance(doc, dict) and isinstance(doc.get("manifests"), list))
    if choice is None or not is_index:
        manifest, raw_manifest = pick_manifest_raw(provider, target, platform, what)
        image = copy_image(provider, manifest, refs, store, what=what, raw_manifest=raw_manifest, **copy)
        if is_index:
            _check_index_platform(image, platform if isinstance(platform, Platform) else Platform(*platform), what)
        return image
    entries = choice.entries(doc, what)
    primary = next((e for e in entries if _entry_platform(e).matches(platform)), entries[0])
    images = []
    for entry in [primary, *[e for e in entries if e is not primary]]:
        sub_what = f"{what} ({_entry_platform(entry)})"
        manifest, raw_manifest = pick_manifest_raw(provider, entry, platform, sub_what)
        images.append(copy_image(provider, manifest, refs if entry is primary else (), store, what=sub_what,
                                 raw_manifest=raw_manifest, **copy))
        _check_index_platform(images[-1], _entry_platform(entry), sub_what)
    return dataclasses.replace(images[0], others=tuple(images[1:]),
                               raw_index=raw if choice.every else None,
                               index_media_type=str(target.get("mediaType") or doc.get("mediaType") or ""))


def _check_index_platform(image: SourceImage, listed: Platform, what: str) -> None:
    """The config of the manifest an index lists for ``listed`` is for that platform: a reader
    picking its platform from the index must get its own image (issue 24 class 4)."""
    got = of_dict(image.platform)
    if got is not None and not got.matches(listed):
        raise SourceError(f"{what}: expected the manifest the index lists for {listed} to be an image for "
                          f"{listed}, found a config for {got}",
                          hint="the source's index contradicts its images; rebuild or re-push the image index")


def manifests_for(provider: BlobProvider, target: Dict[str, Any], platform: Any, choice: Optional[PlatformChoice],
                  what: str, *, strict: bool = False, notes: Optional[List[str]] = None) -> List[Any]:
    """The image manifests :func:`copy_target` will carry for ``target`` (every platform chosen,
    not one), checked before any layer is read."""
    if choice is None:
        return [pick_manifest(provider, target, platform, what, strict=strict, notes=notes)]
    raw = read_blob_bytes(provider, str(target["digest"]), MAX_CONFIG, f"{what}: manifest {str(target['digest'])[:19]}")
    doc = parse_json(raw, f"{what}: manifest")
    is_index = isinstance(doc, dict) and isinstance(doc.get("manifests"), list)
    if not (target.get("mediaType") in INDEX_TYPES or is_index):
        return [pick_manifest_raw(provider, target, platform, what)[0]]
    return [pick_manifest_raw(provider, e, platform, what)[0] for e in choice.entries(doc, what)]


def add_layer_sizes(manifests: Sequence[Any], sizes: Dict[str, int]) -> None:
    """Each layer blob's size into ``sizes`` (digest -> size): a blob two images share is read once,
    so the export's progress total counts it once."""
    for manifest in manifests:
        for d in manifest.get("layers") or []:
            if isinstance(d, dict):
                sizes[str(d.get("digest"))] = int(d.get("size") or 0)


def _entry_platform(entry: Dict[str, Any]) -> Platform:
    return of_dict(entry.get("platform")) or Platform("unknown", "unknown")


@dataclasses.dataclass(frozen=True)
class PlatformChoice:
    """Several platforms of a multi-platform image: ``every`` (``--all-platforms``: the whole
    index, kept byte for byte) or those ``wanted`` (several ``--platform``)."""

    every: bool = False
    wanted: Tuple[Platform, ...] = ()

    def entries(self, index: Any, what: str) -> List[Dict[str, Any]]:
        listed = [e for e in index.get("manifests") or [] if isinstance(e, dict)]
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
            entry = pick_entry(index, want)
            if entry is None:
                found = [str(p) for p in index_platforms(index)]
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


def read_layers(jobs: List[Any], fn: Callable[[Any, Callable[[Readable], Readable]], Any]) -> List[Any]:
    """``fn(job, guard)`` for every job on a small pool (``guard`` wraps the blob ``fn`` reads so it
    stops early once another job failed or a stop signal arrived), results in the jobs' order.
    The first real failure is raised, never a job that merely stopped because of it."""
    workers = min(len(jobs), MAX_LAYER_WORKERS, os.cpu_count() or 1)
    if workers <= 1:
        return [fn(job, lambda f: f) for job in jobs]
    stop = threading.Event()
    failures: List[BaseException] = []

    def one(job: Any) -> Any:
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


def _read_one(provider: BlobProvider, store: BlobStore, job: Tuple[str, Tuple[str, Dict[str, Any], bool]],
              guard: Callable[[Readable], Readable], *, compression: str, level: Optional[int],
              on_bytes: Optional[ProgressFn]) -> Any:
    """One layer blob, streamed: left out (``external``: (diff_id, size) measured, nothing written)
    or copied into ``store`` (its LayerRecord)."""
    key, (label, desc, external) = job
    plain = LAYER_COMPRESSION[str(desc.get("mediaType"))][0] == "none"
    with provider.open_blob(key, label) as raw:
        f = guard(raw)
        if external:
            if plain:
                counted = HashingReader(f)
                counted.drain()
                return counted.digest(), counted.count
            scan = CudaScan()  # measured anyway: what it shows of CUDA is seen in that pass
            got, usize, _ = _read_layer(f, _NullWriter(), desc, label, on_bytes, scan)
            store.noted(got, scan)
            return got, usize
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
