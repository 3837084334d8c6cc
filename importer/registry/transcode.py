"""Layers recompressed for a destination that cannot read the bundle's (``serve --compression``,
``push --compression``): Docker before 23.0 reads no zstd layer (``archive/tar: invalid tar header``).

Each layer is decompressed from the verified bundle, its uncompressed bytes hashed and compared
with the layer's diff_id (and bounded by its recorded size), recompressed into a private folder
(temp then rename); the image's manifest is rewritten with the new layer descriptors (its config,
so its image ID and diff_ids, unchanged) and a multi-platform image's index with the new
manifests. gzip is written with no name and mtime 0, so the same bundle always gives the same
digests. Layers already in the wanted compression, uncompressed tars and layers a delta bundle
leaves out are kept as they are."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import importlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from importer.errors import (
    WRITE_ERRNOS,
    DigestMismatch,
    EngineUnavailable,
    FileAccessError,
    UsageError,
    write_error,
)
from importer.format.artifacts import HANDED_ON
from importer.format.digest import CHUNK, Digest
from importer.format.limits import MAX_INDEX, MAX_MANIFEST
from importer.format.manifest import BlobRef, BundleManifest, ImageRecord, LayerRecord
from importer.format.mediatypes import OCI_LAYER_GZIP, OCI_LAYER_ZSTD, OCI_MANIFEST, compression_of
from importer.input.opened import BundleRoot, open_bundle_file, read_bundle_file
from importer.streams.commands import child_stdout
from importer.streams.compression import open_decompressed
from importer.streams.readers import HashingReader, HashingWriter

CHOICES = ("keep", "gzip", "zstd")
#: the engines that read zstd layers (help texts, warnings, docs/fleet.md)
ZSTD_READERS = "Docker >= 23.0, containerd >= 1.5, podman/skopeo; not Docker 20.10"
_TYPES = {"gzip": OCI_LAYER_GZIP, "zstd": OCI_LAYER_ZSTD}


@dataclass
class Transcoded:
    """The bundle's images as the destination gets them, and where the new blobs are."""

    images: Tuple[ImageRecord, ...]
    files: Dict[str, str] = field(default_factory=dict)  # digest of each written blob -> its path
    renamed: Dict[str, str] = field(default_factory=dict)  # old manifest/index digest -> new
    layers: int = 0  # layers recompressed

    def manifest(self, manifest: BundleManifest) -> BundleManifest:
        return dataclasses.replace(manifest, images=self.images)


def has_zstd(image: ImageRecord) -> bool:
    """True when any platform of ``image`` has a zstd layer."""
    return any(compression_of(x.media_type) == "zstd" for v in image.variants for x in v.layers)


def zstd_warning(what: str) -> str:
    return (f"{what}: this bundle's layers are zstd: Docker before 23.0 cannot pull them "
            f"(`archive/tar: invalid tar header`); zstd is read by {ZSTD_READERS}. For older Docker nodes "
            "use --compression gzip (the image IDs stay the same)")


def transcode(root: BundleRoot, manifest: BundleManifest, to: str, workdir: str,
              on_layer: Optional[Callable[[LayerRecord], None]] = None) -> Transcoded:
    """Every image of ``manifest`` with its layers in ``to`` (``gzip`` or ``zstd``), written
    under ``workdir``; ``keep`` returns the images unchanged."""
    if to not in CHOICES:
        raise UsageError(f"reading --compression: expected one of {', '.join(CHOICES)}, found {to!r}")
    out = Transcoded(manifest.images)
    if to == "keep":
        return out
    done: Dict[Digest, LayerRecord] = {}
    images: List[ImageRecord] = []
    for image in manifest.images:
        variants = [_variant(root, v, to, workdir, done, out, on_layer) for v in image.variants]
        index = image.index
        if index is not None and any(v.manifest != o.manifest for v, o in zip(variants, image.variants)):
            index = _rewrite_index(root, image, variants, workdir, out)
        images.append(dataclasses.replace(variants[0], refs=image.refs, index=index, others=tuple(variants[1:])))
    out.images = tuple(images)
    out.layers = len(done)
    return out


def _recompresses(v: ImageRecord, layer: LayerRecord, to: str) -> bool:
    """Whether recompression to ``to`` rewrites ``layer`` of platform ``v`` (and so its manifest)."""
    if to not in _TYPES or (to == "zstd" and v.manifest.media_type != OCI_MANIFEST):
        return False  # keep; or a Docker schema 2 manifest, which names no zstd layer type
    return not layer.external and compression_of(layer.media_type) not in (to, "none")


def signed_and_rewritten(manifest: BundleManifest, to: str) -> List[str]:
    """The images whose carried signatures, attestations or referrers (bundle schema 3.5) name a
    manifest that recompression to ``to`` rewrites: the destination gets manifests no signature
    names (said before recompressing; refused under ``--require-signed`` unless allowed)."""
    return [image.name for image in manifest.images
            if any(a.kind in HANDED_ON for a in image.artifacts)
            and any(_recompresses(v, x, to) for v in image.variants for x in v.layers)]


def signatures_lost(what: str, to: str, names: List[str]) -> str:
    """The line said before ``what`` recompresses signed images."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{what}: --compression {to} gives {shown} new manifest digests that no signature names: "
            "their signatures and attestations are handed on as carried and name the bundle's digests, so "
            "`cosign verify` and admission policies refuse the recompressed images (keep the compression, "
            "or re-sign them in the destination)")


def _variant(root: BundleRoot, v: ImageRecord, to: str, workdir: str, done: Dict[Digest, LayerRecord],
             out: Transcoded, on_layer: Optional[Callable[[LayerRecord], None]]) -> ImageRecord:
    """One platform: its layers recompressed (each once), its manifest rewritten when one changed."""
    layers: List[LayerRecord] = []
    for layer in v.layers:
        if not _recompresses(v, layer, to):
            layers.append(layer)
            continue
        if layer.digest not in done:
            if on_layer is not None:
                on_layer(layer)
            done[layer.digest] = _layer(root, layer, to, workdir, out)
        layers.append(done[layer.digest])
    if all(a is b for a, b in zip(layers, v.layers)):
        return dataclasses.replace(v, others=(), index=None)
    raw = read_bundle_file(root, v.manifest.digest.blob_path, MAX_MANIFEST, f"the manifest of {v.name}")
    _same(raw, v.manifest.digest, f"the manifest of {v.name}")
    doc = json.loads(raw.decode("utf-8"))
    new = {str(old.digest): fresh for old, fresh in zip(v.layers, layers)}
    for desc in doc.get("layers") or []:
        fresh = new.get(str(desc.get("digest"))) if isinstance(desc, dict) else None
        if fresh is not None:
            desc.update({"mediaType": fresh.media_type, "digest": str(fresh.digest), "size": fresh.size})
    ref = _write_doc(doc, v.manifest.media_type, workdir, out)
    out.renamed[str(v.manifest.digest)] = str(ref.digest)
    return dataclasses.replace(v, manifest=ref, layers=tuple(layers), others=(), index=None)


def _rewrite_index(root: BundleRoot, image: ImageRecord, variants: List[ImageRecord], workdir: str,
                   out: Transcoded) -> BlobRef:
    assert image.index is not None
    raw = read_bundle_file(root, image.index.digest.blob_path, MAX_INDEX, f"the index of {image.name}")
    _same(raw, image.index.digest, f"the index of {image.name}")
    doc = json.loads(raw.decode("utf-8"))
    new = {str(o.manifest.digest): v.manifest for o, v in zip(image.variants, variants)}
    for desc in doc.get("manifests") or []:
        fresh = new.get(str(desc.get("digest"))) if isinstance(desc, dict) else None
        if fresh is not None:
            desc.update({"digest": str(fresh.digest), "size": fresh.size})
    ref = _write_doc(doc, image.index.media_type, workdir, out)
    out.renamed[str(image.index.digest)] = str(ref.digest)
    return ref


def _same(raw: bytes, digest: Digest, what: str) -> None:
    got = Digest.of_bytes(raw)
    if got != digest:
        raise DigestMismatch(f"reading {what}: expected {digest}, found {got}",
                             hint="the bundle changed after it was verified; re-copy it")


def _write_doc(doc: Any, media_type: str, workdir: str, out: Transcoded) -> BlobRef:
    data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    digest = Digest.of_bytes(data)
    path = os.path.join(workdir, digest.hex)
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(path + ".tmp")
        raise _workdir_error(e, path + ".tmp", workdir, "writing a rewritten manifest") from None
    out.files[str(digest)] = path
    return BlobRef(media_type, digest, len(data))


def _layer(root: BundleRoot, layer: LayerRecord, to: str, workdir: str, out: Transcoded) -> LayerRecord:
    """Decompress, check the diff_id, recompress; the new layer record (same diff_id)."""
    what = f"layer {layer.digest.short}"
    tmp = os.path.join(workdir, f"{layer.digest.hex}.part")
    try:
        with open_bundle_file(root, layer.digest.blob_path) as raw_file:
            raw = HashingReader(raw_file)
            with open_decompressed(raw, compression_of(layer.media_type), bound=layer.uncompressed_size,
                                   what=what) as plain:
                tar = HashingReader(plain)
                try:
                    with open(tmp, "wb") as f:
                        written = HashingWriter(f)
                        _compress(tar, to, written, what)
                except OSError as e:  # out of space, or the temp file itself: the temp folder's
                    if e.errno not in WRITE_ERRNOS and e.filename != tmp:  # a read of the bundle's
                        raise
                    raise _workdir_error(e, tmp, workdir, f"recompressing {what} to {to}") from None
                raw.drain()
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if raw.digest() != layer.digest:
        os.unlink(tmp)
        raise DigestMismatch(f"recompressing {what}: expected {layer.digest}, found {raw.digest()}",
                             hint="the bundle changed after it was verified; re-copy it")
    if tar.digest() != layer.diff_id or tar.count != layer.uncompressed_size:
        os.unlink(tmp)
        raise DigestMismatch(f"recompressing {what}: expected diff_id {layer.diff_id} "
                             f"({layer.uncompressed_size} bytes), found {tar.digest()} ({tar.count} bytes)",
                             hint="the layer is not what bundle.json records; re-copy the bundle")
    digest = written.digest()
    path = os.path.join(workdir, digest.hex)
    os.replace(tmp, path)
    out.files[str(digest)] = path
    return dataclasses.replace(layer, media_type=_TYPES[to], digest=digest, size=written.count)


def _workdir_error(err: OSError, path: str, workdir: str, doing: str) -> FileAccessError:
    """A write into the recompression's temp folder failed: the file, the folder, and where TMPDIR
    could point instead."""
    return write_error(err, doing, path, workdir,
                       note=f"the recompressed layers go to a private temp folder ({workdir}, removed) under "
                       "TMPDIR until they are sent",
                       hint=f"free space on the file system of {os.path.dirname(workdir) or workdir}, or point TMPDIR "
                       "at a folder with room for the recompressed layers (about the bundle's size), then run it "
                       "again; nothing was kept")


def _compress(src: HashingReader, to: str, dst: HashingWriter, what: str) -> None:
    if to == "gzip":
        with gzip.GzipFile(filename="", mode="wb", fileobj=cast(Any, dst), mtime=0, compresslevel=6) as gz:
            _pump(src, gz)
        return
    for name in ("zstandard", "compression.zstd"):  # else the zstd command
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if name == "zstandard":
            with mod.ZstdCompressor(level=3).stream_writer(dst, closefd=False) as w:
                _pump(src, w)
        else:
            with mod.ZstdFile(dst, "wb") as w:
                _pump(src, w)
        return
    if not shutil.which("zstd"):
        raise EngineUnavailable(f"recompressing {what} to zstd: expected the zstandard module, Python 3.14 or "
                                "the zstd command on this host, found none",
                                hint="install zstd, or use --compression gzip or keep")
    with child_stdout(["zstd", "-q", "-c", "-3"], what=f"recompressing {what}", stdin_from=src,
                      on_failure=lambda rc, tail: EngineUnavailable(
                          f"recompressing {what}: zstd exited with status {rc}", context=tail)) as out:
        _pump(out, dst)


def _pump(src: Any, dst: Any) -> None:
    while True:
        data = src.read(CHUNK)
        if not data:
            return
        dst.write(data)


def new_workdir(prefix: str) -> str:
    """A private folder (mode 0700) for the recompressed blobs; the caller removes it."""
    return tempfile.mkdtemp(prefix=prefix)


def remove_workdir(path: str) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)
