"""Write a docker-archive (the classic ``docker save`` layout) on the fly from bundle blobs.

Every Docker engine since 1.10 loads this layout, whatever its storage driver or image store.
Layers are decompressed once, straight into the tar stream; each layer's diff_id and size are
checked as it passes, and a mismatch aborts the stream before the archive is complete, so the
engine loads nothing.
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from importer.errors import DigestMismatch
from importer.format.digest import Digest
from importer.format.limits import MAX_CONFIG
from importer.format.manifest import ImageRecord, LayerRecord
from importer.input.layers import copy_stream, open_layer
from importer.input.opened import BundleRoot, read_bundle_file
from importer.streams.tarout import begin_member, end_member, member_info, writing_tar

ProgressFn = Callable[[int], None]


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
) -> None:
    """Stream a docker-archive of ``images`` into ``out`` (e.g. the stdin of ``docker load``).

    Raises an IntegrityError if a layer is not what bundle.json pins; the caller must then
    abort the consumer rather than close the stream normally. ``splice`` (delta bundles) adds
    the layers the bundle leaves out and returns where it put them."""
    with writing_tar(out) as tar:
        # === the configs first: small
        written: Dict[Digest, bool] = {}
        for image in images:
            if image.config.digest in written:
                continue
            raw = read_bundle_file(root, image.config.digest.blob_path, MAX_CONFIG, "config")
            if Digest.of_bytes(raw) != image.config.digest:
                raise DigestMismatch(
                    f"loading the config of {image.name}: expected {image.config.digest}, "
                    f"found {Digest.of_bytes(raw)}",
                    hint="the bundle changed after verification; re-copy it and import again",
                )
            tar.addfile(member_info(f"{image.config.digest.hex}.json", len(raw)), io.BytesIO(raw))
            written[image.config.digest] = True
        # === layers: decompress once into the stream, checking diff_id and size
        for i, image, layer in archive_layers(images):
            what = f"layer {i + 1}/{len(image.layers)} of {image.name}"
            with open_layer(root, layer, what, read_ahead=True) as reader:
                begin_member(tar, f"{layer.diff_id.hex}/layer.tar", layer.uncompressed_size)
                # the member's last chunk goes out only once the layer matched (reader.finish)
                copy_stream(_Counting(reader, on_bytes), tar.fileobj, layer.uncompressed_size,  # type: ignore[arg-type]
                            before_last=reader.finish)
                end_member(tar, layer.uncompressed_size)
        # === layers the delta leaves out, re-exported from the engine
        paths = splice(tar) if splice is not None else {}
        # === manifest.json last: `docker load` reads the whole archive before it
        raw_manifest = json.dumps(archive_manifest(images, with_tags=with_tags, paths=paths),
                                  separators=(",", ":")).encode()
        tar.addfile(member_info("manifest.json", len(raw_manifest)), io.BytesIO(raw_manifest))


class _Counting:
    def __init__(self, raw: object, on_bytes: Optional[ProgressFn]) -> None:
        self._raw = raw
        self._on = on_bytes

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._raw.read(n)  # type: ignore[attr-defined]
        if data and self._on is not None:
            self._on(len(data))
        return data
