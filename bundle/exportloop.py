"""The one export loop: every source's images into the bundle's blob store (issue 41 point 4).

A source says what an export carries (:meth:`ExportSource.resolve`: each image's target, platform
manifests, configs and layers, bundle/sources/protocol.py) and gives the bytes
(:meth:`ExportSource.blobs`, a blob opened by digest; :meth:`ExportSource.stream`, the layers of
an archive as it is read); :func:`carry_images` does the rest for all of them: each layer read
once (a blob two images share too), a few at a time, streamed (never a layer in memory), hashed
and compressed in one pass (or copied byte for byte where the source keeps it compressed, its
diff_id computed on the way), checked against the digest, size and diff_id resolved for it; the
layers the offline host holds (``--have``) left out; the source's manifest kept where it
describes what the bundle carries; the artifacts attached to each image carried beside it.
No source module writes into the blob store (tests/test_architecture.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import zlib
from typing import (
    IO,
    AbstractSet,
    Callable,
    ContextManager,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

import zstandard

from bundle.blobstore import BlobStore
from bundle.sources import SourceImage
from bundle.sources.attached import MAX_ARTIFACT_BLOB, ArtifactSource
from bundle.sources.blobcopy import LAYER_COMPRESSION, BlobProvider, ProgressFn, keep_manifest
from bundle.sources.docker_daemon import read_docker_save as save_feed
from bundle.sources.protocol import (
    ExportSource,
    LayerBlob,
    LayerFeed,
    LayerMismatch,
    LayerRefused,
    PlatformImage,
    ResolvedImage,
    Selection,
    Stored,
    StreamedImages,
    StreamedLayer,
)
from bundle.sources.records import Descriptor, JsonObject, as_object, list_of, load_json, text
from importer.errors import WRITE_ERRNOS, BundleError, SourceError
from importer.format.artifacts import MAX_ARTIFACTS, TAG_SUFFIXES, ArtifactRecord
from importer.format.digest import CHUNK, BlobRef, Digest, hash_stream, is_digest
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD
from importer.format.platform import Platform, of_dict
from importer.input.cudascan import CudaScan
from importer.inventory.have import HaveLayers
from importer.registry.referrers import FALLBACK_TAG, fallback_tag
from importer.streams.gzipread import GzipReader
from importer.streams.readers import HashingReader, Readable, Writable
from importer.streams.signals import stop_requested
from importer.streams.threads import each


@dataclasses.dataclass(frozen=True)
class Carry:
    """How the layers go into the store: ``compression`` and ``level`` for a layer the bundle
    compresses, ``on_bytes`` the progress, ``have`` the layers the offline host holds (left out)."""

    store: BlobStore
    compression: str
    level: Optional[int] = None
    on_bytes: Optional[ProgressFn] = None
    have: Optional[HaveLayers] = None


def carry_images(source: ExportSource, refs: Sequence[str], selection: Selection, carry: Carry) -> List[SourceImage]:
    """Every image ``refs`` name, as ``source`` resolves it, into ``carry.store``: the one loop
    every source runs through."""
    copied: Dict[str, LayerRecord] = {}  # a blob two images share is read once
    images: List[SourceImage] = []
    for resolved in source.resolve(refs, selection):
        if isinstance(resolved, StreamedImages):
            images += carry_stream(source, resolved, carry)
            continue
        image = carry_resolved(source.blobs(resolved), resolved, carry, copied)
        attached = source.attached(resolved) if selection.attached else None
        if attached is not None:
            subjects = [resolved.target.digest]
            subjects += [Digest.of_bytes(v.raw_manifest) for v in (image, *image.others) if v.raw_manifest is not None]
            picked = attached.picked_from if image.raw_index is None else None
            artifacts = collect_artifacts(attached.reader, subjects, carry.store, resolved.what, picked_from=picked)
            image = dataclasses.replace(image, artifacts=artifacts) if artifacts else image
        images.append(image)
    return images


def carry_resolved(provider: BlobProvider, resolved: ResolvedImage, carry: Carry,
                   copied: Dict[str, LayerRecord]) -> SourceImage:
    """One resolved image: each platform's layers (the primary first), its index kept where every
    platform was asked for. A platform an index lists must be what its config says (issue 24 class 4)."""
    carried: List[SourceImage] = []
    for platform_image in resolved.images:
        image = carry_platform(provider, platform_image, resolved.refs if not carried else (), carry, copied)
        if platform_image.listed is not None:
            _check_index_platform(image, platform_image.listed, platform_image.what)
        carried.append(image)
    if len(carried) == 1 and resolved.raw_index is None and not resolved.index_media_type:
        return dataclasses.replace(carried[0], read=resolved.read) if resolved.read else carried[0]
    return dataclasses.replace(carried[0], others=tuple(carried[1:]), raw_index=resolved.raw_index,
                               index_media_type=resolved.index_media_type, read=resolved.read)


def carry_platform(provider: BlobProvider, image: PlatformImage, refs: Tuple[str, ...], carry: Carry,
                   copied: Dict[str, LayerRecord]) -> SourceImage:
    """One image: its config byte for byte, each layer copied (or left out when ``carry.have``
    holds it). The manifest's bytes are kept in the bundle when every layer is carried as that
    manifest describes it (blobcopy.keep_manifest), so the manifest digest does not change."""
    have = carry.have
    measured: Dict[str, _Measured] = {}
    jobs: Dict[str, Tuple[LayerBlob, bool]] = {}  # blob digest -> (layer, external)
    for layer in image.layers:
        key = str(layer.descriptor.digest)
        external = have is not None and layer.diff_id in have
        if key not in copied and (key not in jobs or (jobs[key][1] and not external)):
            jobs[key] = (layer, external)  # a blob one image both leaves out and carries is carried
    # every blob read at most once, a few at a time (each streamed), results kept in the image's order
    done = read_layers(list(jobs.items()), lambda job, guard: _read_one(provider, carry, job, guard))
    for key, result in zip(jobs, done):
        if isinstance(result, LayerRecord):
            copied[key] = result
        else:
            measured[key] = result
    layers: List[LayerRecord] = []
    for layer in image.layers:
        key, diff_id = str(layer.descriptor.digest), str(layer.diff_id)
        if have is not None and layer.diff_id in have:
            got, usize = measured[key] if key in measured else (copied[key].diff_id, copied[key].uncompressed_size)
            if str(got) != diff_id:
                raise SourceError(f"{layer.label}: expected diff_id {diff_id} (the config's), found {got}",
                                  hint="the source holds an inconsistent image; re-pull it")
            layers.append(_external(layer.diff_id, usize, have))
            continue
        record = copied[key]
        if str(record.diff_id) != diff_id:
            raise SourceError(f"{layer.label}: expected diff_id {diff_id} (the config's), found {record.diff_id}",
                              hint="the source holds an inconsistent image; re-pull it")
        layers.append(record)
    kept = keep_manifest(image.manifest.raw, image.raw_config, layers)
    if kept is not None:
        return SourceImage(refs=refs, raw_config=image.raw_config, layers=kept[0], platform=image.platform,
                           raw_manifest=image.manifest.raw, manifest_media_type=kept[1], config_media_type=kept[2])
    return SourceImage(refs=refs, raw_config=image.raw_config, layers=tuple(layers), platform=image.platform)


class _Measured(NamedTuple):
    """A layer left out (the offline host holds it): read only to check its diff_id."""

    diff_id: Digest
    size: int


#: one layer blob to read: (its digest, (the layer, left out (``--have``) or carried))
_Job = Tuple[str, Tuple[LayerBlob, bool]]


def _read_one(provider: BlobProvider, carry: Carry, job: _Job,
              guard: Callable[[Readable], Readable]) -> Union[LayerRecord, _Measured]:
    """One layer blob, streamed: left out (``external``: (diff_id, size) measured, nothing written)
    or copied into the store (its LayerRecord)."""
    key, (layer, external) = job
    desc, label, store, on_bytes = layer.descriptor, layer.label, carry.store, carry.on_bytes
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
            record = store.write_layer(f, compression=carry.compression, level=carry.level, on_bytes=on_bytes)
            if str(record.diff_id) != key:
                raise SourceError(f"{label}: expected the uncompressed layer to hash to {key}, "
                                  f"found {record.diff_id}", hint="re-pull the image")
            return record
        return copy_layer(store, f, desc, label, on_bytes=on_bytes)


def carry_stream(source: ExportSource, streamed: StreamedImages, carry: Carry) -> List[SourceImage]:
    """Images whose layers the source reaches one by one (a ``docker save`` stream) or a batch at a
    time (Docker's classic store): :func:`run_feed` over its :meth:`ExportSource.stream`."""
    return run_feed(source.stream(streamed), carry)


def run_feed(feed: LayerFeed, carry: Carry) -> List[SourceImage]:
    """Each layer the feed sends stored here, its record sent back (a failure thrown back into the
    feed, which names it in its own terms: a ``docker save`` cut off); the layers the offline host
    holds left out once the images are known."""
    sent: Union[Stored, List[Stored], None] = None
    error: Optional[BaseException] = None
    try:
        while True:
            try:
                asked = feed.throw(error) if error is not None else feed.send(sent)  # type: ignore[arg-type]
            except StopIteration as done:
                images: List[SourceImage] = done.value
                break
            error = None
            try:
                sent = _store_batch(asked, carry) if isinstance(asked, list) else \
                    _store_streamed(asked, lambda f: f, carry, set())
            except BaseException as e:
                error = e
    finally:
        feed.close()
    have = carry.have
    return [_externalize(image, carry.store, have) for image in images] if have else images


def read_docker_save(stream: Readable, store: BlobStore, *, compression: str = "zstd", level: Optional[int] = None,
                     on_bytes: Optional[ProgressFn] = None, have: Optional[HaveLayers] = None) -> List[SourceImage]:
    """A ``docker save`` archive (bundle/sources/docker_daemon.py) read into ``store`` in one pass
    (the test kit's bundles are made so)."""
    return run_feed(save_feed(stream), Carry(store, compression, level, on_bytes, have))


def _store_batch(layers: List[StreamedLayer], carry: Carry) -> List[Stored]:
    """Layers read a few at a time (the results in their order)."""
    before = set(carry.store.written)
    return read_layers(layers, lambda layer, guard: _store_streamed(layer, guard, carry, before))


def _store_streamed(layer: StreamedLayer, guard: Callable[[Readable], Readable], carry: Carry,
                    before: AbstractSet[str]) -> Stored:
    """One streamed layer into the store: a compressed one as it is, a tar compressed here; a tar
    whose diff_id is known ahead is left out where the offline host holds it (hashed, not written)
    and given back as a LayerMismatch, nothing kept, where it hashes to another."""
    store, on_bytes = carry.store, carry.on_bytes if layer.counted else None
    try:
        with layer.open() as raw:
            f = guard(raw)
            if layer.form != "tar":
                return copy_stored_layer(store, f, layer.form, layer.label, on_bytes=on_bytes)
            expected, have = layer.expected, carry.have
            if expected is not None and have is not None and expected in have:
                got, size, scan = _hash_tar(f)
                if got != expected:
                    return LayerMismatch(got, measured=True)
                store.noted(got, scan)
                return _external(expected, size, have)
            record = store.write_layer(f, compression=carry.compression, level=carry.level, on_bytes=on_bytes)
    except LayerRefused as e:
        return LayerMismatch(None, str(e))
    if expected is not None and record.diff_id != expected:  # never carried: the blob goes, unless another wrote it
        if record.digest.blob_path not in before:
            store.discard(record.digest)
        return LayerMismatch(record.diff_id)
    return record


def _hash_tar(src: Readable) -> Tuple[Digest, int, CudaScan]:
    """A tar left out (``--have``): hashed and scanned as a carried one is, not written."""
    scan = CudaScan()
    counted = HashingReader(_Scanned(src, scan))
    counted.drain()
    return counted.digest(), counted.count, scan


def _externalize(image: SourceImage, store: BlobStore, have: HaveLayers) -> SourceImage:
    """A streamed image with the layers the offline host holds left out (their blobs, written as the
    stream passed, discarded); its manifest kept where the host keeps those layers as the engine does."""
    if not any(not layer.external and layer.diff_id in have for layer in image.layers):
        return image
    layers = []
    for layer in image.layers:
        if not layer.external and layer.diff_id in have:
            store.discard(layer.digest)
            layer = _external(layer.diff_id, layer.uncompressed_size, have)
        layers.append(layer)
    kept = keep_manifest(image.raw_manifest, image.raw_config, layers) if image.raw_manifest is not None else None
    if kept is not None:
        return SourceImage(refs=image.refs, raw_config=image.raw_config, layers=kept[0], platform=image.platform,
                           raw_manifest=image.raw_manifest, manifest_media_type=kept[1], config_media_type=kept[2],
                           read=image.read)
    return SourceImage(image.refs, image.raw_config, tuple(layers), image.platform, read=image.read)


def _decompressed(tee: HashingReader, compression: str) -> ContextManager[Readable]:
    # a forward read calls read() alone (never seek): the stream is a file to zstandard
    if compression == "gzip":
        return GzipReader(tee)  # zlib over 1 MiB reads, GzipFile's semantics (issue 44)
    src = cast(IO[bytes], tee)
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



def _check_index_platform(image: SourceImage, listed: Platform, what: str) -> None:
    """The config of the manifest an index lists for ``listed`` is for that platform: a reader
    picking its platform from the index must get its own image (issue 24 class 4)."""
    got = of_dict(image.platform)
    if got is not None and not got.matches(listed):
        raise SourceError(f"{what}: expected the manifest the index lists for {listed} to be an image for "
                          f"{listed}, found a config for {got}",
                          hint="the source's index contradicts its images; rebuild or re-push the image index")



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



def _external(diff_id: Digest, usize: int, have: HaveLayers) -> LayerRecord:
    """A layer the offline host holds: named by the blob it keeps, else uncompressed by diff_id
    (the same two forms a ``docker save`` export writes)."""
    blob = have[diff_id]
    if blob is not None:
        return LayerRecord(blob.media_type, blob.digest, blob.size, diff_id, usize, external=True)
    return LayerRecord(OCI_LAYER_TAR, diff_id, usize, diff_id, usize, external=True)


# --- the artifacts attached to an image (bundle/sources/attached.py reads them)

class _Collector:
    def __init__(self, src: ArtifactSource, store: BlobStore, doing: str) -> None:
        self.src, self.store, self.doing = src, store, doing
        self.repository = src.repository
        self.records: List[ArtifactRecord] = []
        self.seen: Dict[str, None] = {}

    def _add(self, record: ArtifactRecord) -> None:
        if str(record.manifest.digest) in self.seen:
            return
        if len(self.records) >= MAX_ARTIFACTS:
            raise SourceError(f"{self.doing}: expected at most {MAX_ARTIFACTS} artifacts attached to the image, "
                              "found more", hint="export with --no-referrers, or clean up the registry's artifacts")
        self.seen[str(record.manifest.digest)] = None
        self.records.append(record)

    def blob(self, value: object, what: str) -> BlobRef:
        """One blob a manifest names, streamed into the store, digest and size checked."""
        desc = Descriptor.of(value)
        if desc is None or desc.size is None or desc.size > MAX_ARTIFACT_BLOB:
            raise SourceError(f"{what}: expected a descriptor with a sha256 digest and a size of at most "
                              f"{MAX_ARTIFACT_BLOB} bytes, found {str(value)[:200]!r}",
                              hint="the registry holds a damaged artifact; export with --no-referrers")
        if desc.digest.blob_path not in self.store.written:
            self._copy(desc.digest, desc.size, f"{what}, blob {desc.digest.short}")
        return BlobRef(desc.media_type, desc.digest, desc.size)

    def _copy(self, digest: Digest, size: int, what: str) -> None:
        f, start = self.src.open_blob(digest, what)
        hasher = hashlib.sha256()
        n = 0
        try:
            with self.store.temp() as (out, tmp):
                while True:
                    chunk = f.read(CHUNK)
                    if not chunk:
                        break
                    n += len(chunk)
                    if n > size:
                        break
                    hasher.update(chunk)
                    out.write(chunk)
                found = Digest("sha256", hasher.hexdigest())
                if n != size or found != digest or start != 0:
                    raise SourceError(f"{what}: expected {size} bytes hashing to {digest}, found "
                                      f"{'more than ' if n > size else ''}{n} bytes hashing to {found}",
                                      hint="the registry answered with other bytes; do not trust this registry")
        finally:
            f.close()
        self.store.commit(tmp, digest, size)

    def manifest(self, reference: str, what: str) -> Optional[Tuple[bytes, JsonObject]]:
        raw = self.src.manifest(reference)
        if raw is None:
            return None
        if is_digest(reference) and str(Digest.of_bytes(raw)) != reference:
            raise SourceError(f"{what}: expected the manifest to hash to {reference}, found {Digest.of_bytes(raw)}",
                              hint="the registry answered with other bytes; do not trust this registry")
        value = load_json(raw, what)
        doc = as_object(value)
        if doc is None:
            raise SourceError(f"{what}: expected a JSON object (an OCI manifest or index), found "
                              f"{type(value).__name__}", hint="export with --no-referrers to leave it out")
        return raw, doc

    def carry(self, kind: str, subject: Digest, raw: bytes, doc: JsonObject, what: str, *, tag: str = "",
              artifact_type: str = "", depth: int = 0) -> None:
        """A manifest (its config and layers) or an index (each manifest it lists, a record of its own)."""
        stored = self.store.write_bytes(raw)
        blobs: List[BlobRef] = []
        listed = doc.get("manifests")
        if isinstance(listed, list):
            for n, entry in enumerate(listed[:MAX_ARTIFACTS]):
                desc = Descriptor.of(entry)
                if depth > 0 or desc is None:
                    continue
                got = self.manifest(str(desc.digest), f"{what}, manifest {n}")
                if got is not None:
                    sub_type = desc.artifact_type or text(got[1], "artifactType")
                    sub_kind = "referrer" if kind == "referrers-index" else kind
                    self.carry(sub_kind, subject, got[0], got[1], f"{what}, manifest {n}", artifact_type=sub_type,
                               depth=depth + 1)
        else:
            hint = "the registry holds a damaged artifact; export with --no-referrers"
            for value in [doc.get("config"), *list_of(doc, "layers", what, hint=hint)]:
                if value is not None:
                    blobs.append(self.blob(value, what))
        self._add(ArtifactRecord(kind, subject, BlobRef(text(doc, "mediaType"), stored.digest, stored.size),
                                 tuple(blobs), tag, artifact_type or text(doc, "artifactType"), self.repository))

    def collect(self, subject: Digest) -> None:
        for kind, suffix in TAG_SUFFIXES.items():
            tag = fallback_tag(subject) + suffix
            got = self.manifest(tag, f"{self.doing}: the {kind} {tag}")
            if got is not None:
                self.carry(kind, subject, got[0], got[1], f"{self.doing}: the {kind} {tag}", tag=tag)
        found = self.src.referrers(subject)
        if found is None:
            return
        raw, via = found
        what = f"{self.doing}: the referrers of {subject.short}"
        doc = as_object(load_json(raw, what))
        listed = doc.get("manifests") if doc is not None else None
        if doc is None or not isinstance(listed, list):
            return  # a tag of that name that is no index: not a referrers list
        if via == FALLBACK_TAG:  # the index itself is a tagged manifest of the registry: carried
            self.carry("referrers-index", subject, raw, doc, what, tag=fallback_tag(subject))
            return
        for n, entry in enumerate(listed[:MAX_ARTIFACTS + 1]):
            desc = Descriptor.of(entry)
            if desc is not None:
                got = self.manifest(str(desc.digest), f"{what}, manifest {n}")
                if got is not None:
                    self.carry("referrer", subject, got[0], got[1], f"{what}, manifest {n}",
                               artifact_type=desc.artifact_type)


def collect_artifacts(src: ArtifactSource, subjects: Sequence[Digest], store: BlobStore,
                      doing: str, *, picked_from: Optional[Tuple[bytes, str]] = None) -> Tuple[ArtifactRecord, ...]:
    """Every artifact attached to one of ``subjects`` (an image's manifests and index) in ``src``.
    ``picked_from``: (bytes, media type) of the image index one platform was picked from (the
    first subject); carried as kind ``index`` when something is attached to it, so that a
    signature on the index can be checked offline against the carried platform's manifest."""
    collector = _Collector(src, store, doing)
    for subject in dict.fromkeys(subjects):
        collector.collect(subject)
    records = collector.records
    if picked_from is not None and any(r.subject == subjects[0] for r in records):
        stored = store.write_bytes(picked_from[0])
        records.append(ArtifactRecord("index", stored.digest, BlobRef(picked_from[1], stored.digest, stored.size),
                                      repository=collector.repository))
    return tuple(records)
