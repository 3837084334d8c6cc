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
from typing import BinaryIO, Callable, Dict, List, Optional, Sequence

from importer.digest import Digest
from importer.errors import DigestMismatch
from importer.layers import copy_stream, open_layer
from importer.limits import MAX_CONFIG, read_file_limited
from importer.manifest import ImageRecord

ProgressFn = Callable[[int], None]


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def archive_manifest(images: Sequence[ImageRecord], *, with_tags: bool) -> List[Dict[str, object]]:
    """The ``manifest.json`` entries: config file, tags, layer files (by diff_id)."""
    return [
        {
            "Config": f"{image.config.digest.hex}.json",
            "RepoTags": list(image.refs) if with_tags else None,
            "Layers": [f"{layer.diff_id.hex}/layer.tar" for layer in image.layers],
        }
        for image in images
    ]


def write_docker_archive(
    out: BinaryIO,
    root: str,
    images: Sequence[ImageRecord],
    *,
    with_tags: bool = False,
    on_bytes: Optional[ProgressFn] = None,
) -> None:
    """Stream a docker-archive of ``images`` into ``out`` (e.g. the stdin of ``docker load``).

    Raises an IntegrityError if a layer is not what bundle.json pins; the caller must then
    abort the consumer rather than close the stream normally."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1024 * 1024) as tar:
        # === manifest.json and the configs first: small, and the engine wants them anyway
        raw_manifest = json.dumps(archive_manifest(images, with_tags=with_tags), separators=(",", ":")).encode()
        tar.addfile(_member("manifest.json", len(raw_manifest)), io.BytesIO(raw_manifest))
        written: Dict[Digest, bool] = {}
        for image in images:
            if image.config.digest in written:
                continue
            raw = read_file_limited(f"{root}/{image.config.digest.blob_path}", MAX_CONFIG, "config")
            if Digest.of_bytes(raw) != image.config.digest:
                raise DigestMismatch(
                    f"loading the config of {image.name}: expected {image.config.digest}, "
                    f"found {Digest.of_bytes(raw)}",
                    hint="the bundle changed after verification; re-copy it and import again",
                )
            tar.addfile(_member(f"{image.config.digest.hex}.json", len(raw)), io.BytesIO(raw))
            written[image.config.digest] = True
        # === layers: decompress once into the stream, checking diff_id and size
        done: Dict[Digest, bool] = {}
        for image in images:
            for i, layer in enumerate(image.layers):
                if layer.diff_id in done:
                    continue
                what = f"layer {i + 1}/{len(image.layers)} of {image.name}"
                with open_layer(root, layer, what) as reader:
                    info = _member(f"{layer.diff_id.hex}/layer.tar", layer.uncompressed_size)
                    # header by hand: addfile() without a fileobj is refused on Python 3.13+
                    assert tar.fileobj is not None
                    header = info.tobuf(tar.format, tar.encoding, tar.errors)
                    tar.fileobj.write(header)
                    tar.offset += len(header)
                    copy_stream(_Counting(reader, on_bytes), tar.fileobj, layer.uncompressed_size)  # type: ignore[arg-type]
                    reader.finish()
                    # pad to a full block as tarfile.addfile would
                    blocks, remainder = divmod(layer.uncompressed_size, tarfile.BLOCKSIZE)
                    if remainder:
                        tar.fileobj.write(tarfile.NUL * (tarfile.BLOCKSIZE - remainder))
                        blocks += 1
                    tar.offset += blocks * tarfile.BLOCKSIZE
                done[layer.diff_id] = True


class _Counting:
    def __init__(self, raw: object, on_bytes: Optional[ProgressFn]) -> None:
        self._raw = raw
        self._on = on_bytes

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._raw.read(n)  # type: ignore[attr-defined]
        if data and self._on is not None:
            self._on(len(data))
        return data
