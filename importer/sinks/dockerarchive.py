"""Write a docker-archive (the classic ``docker save`` layout) on the fly from bundle blobs.

Every Docker engine since 1.10 loads this layout, whatever its storage driver or image store.
Layers are decompressed once, straight into the tar stream; each layer's diff_id and size are
checked as it passes, and a mismatch aborts the stream before the archive is complete, so the
engine loads nothing. The next layer is read, hashed and decompressed (:class:`_LayerAhead`, on a
pool of :data:`LAYERS_AHEAD` threads) while the one before it is sent: an image of many small
layers does not wait at every layer's start for its first chunk nor at its end for its checks
(issue 44: a 100-layer image streamed in 1.37 s where the stream of its own engine's ``docker save``
archive, the same bytes read from a file, took 0.58 s; 1.16 s with the next layer prepared).
"""

from __future__ import annotations

import io
import json
import queue
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable, Collection, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from importer.errors import DigestMismatch
from importer.format.digest import CHUNK, Digest
from importer.format.limits import MAX_CONFIG
from importer.format.manifest import ImageRecord, LayerRecord
from importer.input.layers import ChunkCursor, copy_stream, open_layer
from importer.input.opened import BundleRoot, read_bundle_file
from importer.streams.tarout import begin_member, end_member, member_info, writing_tar

ProgressFn = Callable[[int], None]

#: layers read, checked and decompressed at once: the one being sent and the next
LAYERS_AHEAD = 2
#: decompressed chunks a layer may hold ahead of the stream (LAYERS_AHEAD x this x CHUNK in memory)
CHUNKS_AHEAD = 4
#: a layer blob larger than this also has its reading and hashing on a thread of its own, beside
#: its decompression (importer/input/layers.py ReadAhead); a smaller one is read by its pool thread
READ_AHEAD_ABOVE = 4 * CHUNK
_END = None


def archive_manifest(images: Sequence[ImageRecord], *, with_tags: bool,
                     paths: Optional[Dict[Digest, str]] = None) -> List[Dict[str, object]]:
    """The ``manifest.json`` entries: config file, tags, layer files (by diff_id, or as
    ``paths`` says for layers spliced in from elsewhere)."""
    where = paths or {}
    return [
        {
            "Config": f"{image.config.digest.hex}.json",
            "RepoTags": list(image.refs) if with_tags else None,
            "Layers": [where.get(layer.diff_id, f"{layer.diff_id.hex}/layer.tar") for layer in image.layers],
        }
        for image in images
    ]


def archive_layers(images: Sequence[ImageRecord]) -> Iterator[Tuple[int, ImageRecord, LayerRecord]]:
    """(index in its image, image, layer) of each layer blob the archive carries: the first stored
    blob of each diff_id (layers a delta leaves out are spliced in from the engine)."""
    done: Set[Digest] = set()
    for image in images:
        for i, layer in enumerate(image.layers):
            if layer.diff_id in done or layer.external:
                continue
            done.add(layer.diff_id)
            yield i, image, layer


def write_docker_archive(
    out: BinaryIO,
    root: BundleRoot,
    images: Sequence[ImageRecord],
    *,
    with_tags: bool = False,
    on_bytes: Optional[ProgressFn] = None,
    splice: Optional[Callable[[tarfile.TarFile], Dict[Digest, str]]] = None,
    sent: Collection[Digest] = (),
    before_manifest: Optional[Callable[[], None]] = None,
) -> None:
    """Stream a docker-archive of ``images`` into ``out`` (e.g. the stdin of ``docker load``).

    Raises an IntegrityError if a layer is not what bundle.json pins; the caller must then
    abort the consumer rather than close the stream normally. ``splice`` (delta bundles) adds
    the layers the bundle leaves out and returns where it put them. ``sent``: diff_ids the engine
    was given by an earlier load (importer/sinks/dockersplit.py): the manifest names them, no member
    holds them (Docker 20.10 takes a layer it holds by its chain ID and reads no file for it).
    ``before_manifest`` runs before the member that makes the engine create the images."""
    with writing_tar(out) as tar:
        # === the configs first: small
        written: Dict[Digest, bool] = {}
        for image in images:
            if image.config.digest in written:
                continue
            raw = _read_config(root, image)
            tar.addfile(member_info(f"{image.config.digest.hex}.json", len(raw)), io.BytesIO(raw))
            written[image.config.digest] = True
        # === layers: decompress once into the stream, checking diff_id and size
        _write_layers(tar, root, [x for x in archive_layers(images) if x[2].diff_id not in sent], on_bytes)
        # === layers the delta leaves out, re-exported from the engine
        paths = splice(tar) if splice is not None else {}
        if before_manifest is not None:
            before_manifest()
        # === manifest.json last: `docker load` reads the whole archive before it
        raw_manifest = json.dumps(archive_manifest(images, with_tags=with_tags, paths=paths),
                                  separators=(",", ":")).encode()
        tar.addfile(member_info("manifest.json", len(raw_manifest)), io.BytesIO(raw_manifest))


def write_partial_archive(out: BinaryIO, root: BundleRoot, image: ImageRecord, count: int, ref: str,
                          on_bytes: Optional[ProgressFn] = None) -> None:
    """The first ``count`` layers of ``image`` as an image of their own named ``ref`` (a staging
    name): their members, checked as in :func:`write_docker_archive`, then a config of the
    image's platform fields and those layers' diff_ids only, then ``manifest.json``
    (importer/sinks/dockersplit.py loads the rest beside it)."""
    try:
        full = json.loads(_read_config(root, image))
    except ValueError:  # (checked when verified; the full image's own load reports it)
        full = None
    if not isinstance(full, dict):
        full = {}
    config = {k: full[k] for k in ("architecture", "os", "os.version", "variant") if isinstance(full.get(k), str)}
    config["rootfs"] = {"type": "layers", "diff_ids": [str(x.diff_id) for x in image.layers[:count]]}
    head = {x.diff_id for x in image.layers[:count]}
    with writing_tar(out) as tar:
        _write_layers(tar, root, [x for x in archive_layers([image]) if x[2].diff_id in head], on_bytes)
        partial = json.dumps(config, separators=(",", ":")).encode()
        name = f"{Digest.of_bytes(partial).hex}.json"
        tar.addfile(member_info(name, len(partial)), io.BytesIO(partial))
        manifest = json.dumps([{"Config": name, "RepoTags": [ref], "Layers": [
            f"{x.diff_id.hex}/layer.tar" for x in image.layers[:count]]}], separators=(",", ":")).encode()
        tar.addfile(member_info("manifest.json", len(manifest)), io.BytesIO(manifest))


def _read_config(root: BundleRoot, image: ImageRecord) -> bytes:
    raw = read_bundle_file(root, image.config.digest.blob_path, MAX_CONFIG, "config")
    if Digest.of_bytes(raw) != image.config.digest:
        raise DigestMismatch(
            f"loading the config of {image.name}: expected {image.config.digest}, "
            f"found {Digest.of_bytes(raw)}",
            hint="the bundle changed after verification; re-copy it and import again",
        )
    return raw


def _write_layers(tar: tarfile.TarFile, root: BundleRoot, layers: List[Tuple[int, ImageRecord, LayerRecord]],
                  on_bytes: Optional[ProgressFn]) -> None:
    """Each layer decompressed into its member, in order, the next one prepared while one is sent;
    a member's last chunk goes out only once its layer matched (:meth:`_LayerAhead.finish`)."""
    if not layers:
        return
    started: List[_LayerAhead] = []
    with ThreadPoolExecutor(max_workers=min(LAYERS_AHEAD, len(layers)), thread_name_prefix="layer ahead") as pool:
        try:
            for n, (_, _, layer) in enumerate(layers):
                while len(started) < min(n + LAYERS_AHEAD, len(layers)):
                    i, image, ahead_of = layers[len(started)]
                    started.append(_LayerAhead(root, ahead_of, f"layer {i + 1}/{len(image.layers)} of {image.name}"))
                    pool.submit(started[-1].run)
                reader = started[n]
                begin_member(tar, f"{layer.diff_id.hex}/layer.tar", layer.uncompressed_size)
                copy_stream(_Counting(reader, on_bytes), tar.fileobj, layer.uncompressed_size,  # type: ignore[arg-type]
                            before_last=reader.finish)
                end_member(tar, layer.uncompressed_size)
        except BaseException:
            for ahead in started:
                ahead.stopping.set()
            for ahead in started:
                ahead.stop()
            raise


class _LayerAhead(ChunkCursor):
    """One layer blob read, checked and decompressed by a pool thread (:meth:`run`), up to
    :data:`CHUNKS_AHEAD` chunks ahead of the stream (a bounded queue: flat memory). :meth:`read`
    hands its bytes out in order; :meth:`finish` drains the rest and raises what
    ``LayerReader.finish`` found (digest, size, diff_id), or any error of the read."""

    def __init__(self, root: BundleRoot, layer: LayerRecord, what: str) -> None:
        self.root, self.layer, self.what = root, layer, what
        self._queue: queue.Queue[Optional[bytes]] = queue.Queue(maxsize=CHUNKS_AHEAD)
        self.stopping = threading.Event()
        self._error: Optional[BaseException] = None
        self._ended = False
        self._item, self._pos = b"", 0

    def run(self) -> None:
        try:
            layer = self.layer
            with open_layer(self.root, layer, self.what, read_ahead=layer.size > READ_AHEAD_ABOVE) as reader:
                while not self.stopping.is_set():
                    data = reader.read(CHUNK)
                    if not data:
                        reader.finish()
                        break
                    self._queue.put(data)
        except BaseException as e:  # raised by the stream's read or finish
            self._error = e
        finally:
            self._queue.put(_END)

    def read(self, n: Optional[int] = -1) -> bytes:
        return self._read_queued(n)

    def finish(self) -> None:
        """Every byte was sent but the last chunk: the rest drained (more than the recorded size is
        the reader's SizeMismatch), the verdict raised."""
        while not self._ended:
            self._item, self._pos = b"", 0
            self.read(CHUNK)

    def stop(self) -> None:
        """The stream failed: the thread ends at its next chunk (what it queued is taken, so it
        never blocks); its own error is not raised."""
        self.stopping.set()
        while not self._ended:
            if self._queue.get() is _END:
                self._ended = True


class _Counting:
    def __init__(self, raw: object, on_bytes: Optional[ProgressFn]) -> None:
        self._raw = raw
        self._on = on_bytes

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._raw.read(n)  # type: ignore[attr-defined]
        if data and self._on is not None:
            self._on(len(data))
        return data
