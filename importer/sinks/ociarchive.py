"""Write an OCI image-layout archive (``oci-layout``, ``index.json``, ``blobs/sha256/``) on the
fly from bundle blobs, for engines that import OCI archives (containerd's ``ctr images import``).

Blobs are copied as they are in the bundle (manifests, configs and compressed layers), so the
engine ends up with the very manifest digest the bundle pins. Each blob's digest and size are
checked as it passes; a mismatch raises before the archive is complete, and the caller then
aborts the consumer so nothing is imported. The index names each image with the full
reference in both ``org.opencontainers.image.ref.name`` and ``io.containerd.image.name``:
containerd imports nothing (and exits 0) for an entry without a usable name.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import BinaryIO, Callable, Dict, List, Optional, Sequence, Tuple

from importer.errors import DigestMismatch, SizeMismatch
from importer.format.digest import CHUNK, Digest
from importer.format.manifest import ImageRecord, LayerRecord
from importer.format.mediatypes import OCI_INDEX, REF_NAME_ANNOTATION, compression_of
from importer.input.layercheck import LayerCheck, checking
from importer.input.opened import BundleRoot, open_bundle_file
from importer.streams.tarout import begin_member, end_member, member_info, writing_tar

ProgressFn = Callable[[int], None]
CONTAINERD_NAME_ANNOTATION = "io.containerd.image.name"
_HINT = "the bundle changed after verification; re-copy it and import again"




def index_document(named: Sequence[Tuple[ImageRecord, str]]) -> Dict[str, object]:
    """index.json naming each (image, full reference) pair."""
    manifests: List[Dict[str, object]] = []
    for image, name in named:
        entry: Dict[str, object] = {
            "mediaType": image.manifest.media_type,
            "digest": str(image.manifest.digest),
            "size": image.manifest.size,
        }
        if name:  # unnamed: an image Docker's containerd store loads untagged (found by its digest)
            entry["annotations"] = {REF_NAME_ANNOTATION: name, CONTAINERD_NAME_ANNOTATION: name}
        if image.platform.get("os") and image.platform.get("architecture"):
            entry["platform"] = dict(image.platform)
        manifests.append(entry)
    return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}


def archive_blobs(images: Sequence[ImageRecord]) -> List[Tuple[Digest, int, str, Optional[LayerRecord]]]:
    """(digest, size, what, the layer record of a layer) of every blob the archive carries, small
    ones first, each once, in the order they are written (the unpack check names layers alike)."""
    seen: Dict[Digest, Tuple[Digest, int, str, Optional[LayerRecord]]] = {}
    for image in images:
        for blob, what in ((image.manifest, "manifest"), (image.config, "config")):
            seen.setdefault(blob.digest, (blob.digest, blob.size, f"{what} of {image.name}", None))
    for image in images:
        for i, layer in enumerate(image.layers):
            what = f"layer {i + 1}/{len(image.layers)} of {image.name}"
            seen.setdefault(layer.digest, (layer.digest, layer.size, what, layer))
    return list(seen.values())


def write_oci_archive(
    out: BinaryIO,
    root: BundleRoot,
    named: Sequence[Tuple[ImageRecord, str]],
    *,
    on_bytes: Optional[ProgressFn] = None,
    external: Optional[Dict[Digest, Optional[Callable[[tarfile.TarFile], None]]]] = None,
    index_last: bool = False,
    check_layers: bool = False,
    before_index: Optional[Callable[[], None]] = None,
) -> None:
    """Stream an OCI archive of the (image, full reference) pairs into ``out``. ``external``
    (delta bundles): blobs the bundle does not hold, each left out (None: the engine holds it)
    or written by the given function in its place. ``index_last``: ``index.json`` after every
    blob (``docker load``: a stream cut or aborted before its end names no image).
    ``check_layers``: each layer blob is also decompressed, beside the stream and from the same
    read, and its diff_id and uncompressed size checked before the next member is written
    (importer/input/layercheck.py), so ``index.json`` follows only layers that all matched.
    ``before_index``: called once every blob was written, before ``index.json`` (``index_last``):
    the Docker sink starts the check beside the engine's unpack there (importer/input/unpackcheck.py)."""
    images = [image for image, _ in named]
    index = json.dumps(index_document(named), separators=(",", ":")).encode()
    with writing_tar(out) as tar:
        head = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')]
        if not index_last:
            head.append(("index.json", index))
        for name, data in head:
            tar.addfile(member_info(name, len(data)), io.BytesIO(data))
        for digest, size, what, layer in archive_blobs(images):
            if external is not None and digest in external:
                write = external[digest]
                if write is not None:
                    write(tar)
                continue
            copy_blob(tar, root, digest, size, what, on_bytes, layer=layer if check_layers else None)
        if index_last:
            if before_index is not None:
                before_index()
            tar.addfile(member_info("index.json", len(index)), io.BytesIO(index))


def copy_blob(tar: tarfile.TarFile, root: BundleRoot, digest: Digest, size: int, what: str,
              on_bytes: Optional[ProgressFn], *, layer: Optional[LayerRecord] = None) -> None:
    """Append ``blobs/sha256/<hex>`` read from the bundle, checking digest and size as it passes;
    ``layer``: also its diff_id, decompressed beside the stream from the same read (a layer stored
    uncompressed is its own diff_id, bundle.json's parser holds digest = diffId for it: the one
    hash serves both). The member's last chunk is sent only
    after every check passed, so an engine that commits each blob once it is complete (containerd)
    never commits one that failed."""
    assert tar.fileobj is not None
    begin_member(tar, digest.blob_path, size)
    stored = layer is not None and compression_of(layer.media_type) == "none"
    with checking(None if stored else layer, what) as check:
        last = _copy_checked(tar, root, digest, size, what, on_bytes, check)
        if check is not None:
            check.finish()
    tar.fileobj.write(last)
    end_member(tar, size)


def _copy_checked(tar: tarfile.TarFile, root: BundleRoot, digest: Digest, size: int, what: str,
                  on_bytes: Optional[ProgressFn], check: Optional[LayerCheck]) -> bytes:
    """Write all but the last chunk of the blob into the member; return that chunk once the whole
    blob was read, its size and digest matched."""
    assert tar.fileobj is not None
    h = hashlib.sha256()
    left = size
    pending = b""
    with open_bundle_file(root, digest.blob_path) as f:
        while left > 0:
            data = f.read(min(CHUNK, left))
            if not data:
                raise SizeMismatch(f"streaming {what} ({digest}): expected {size} bytes, found {size - left}",
                                   hint=_HINT)
            h.update(data)
            if check is not None:
                check.feed(data)
            if pending:
                tar.fileobj.write(pending)
            pending = data
            left -= len(data)
            if on_bytes is not None:
                on_bytes(len(data))
        if f.read(1):
            raise SizeMismatch(f"streaming {what} ({digest}): expected {size} bytes, found more", hint=_HINT)
    found = Digest("sha256", h.hexdigest())
    if found != digest:
        raise DigestMismatch(f"streaming {what}: expected {digest}, found {found}", hint=_HINT)
    return pending
