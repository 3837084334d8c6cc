"""Delta bundles on the importing side: check that the engine holds every layer the bundle
left out, and re-export those layers from the engine so they can be spliced into the load."""

from __future__ import annotations

import hashlib
import tarfile
from typing import Any, BinaryIO, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from importer.errors import BundleError, DecompressFailed, DeltaBaseMissing, DiffIDMismatch
from importer.format.digest import CHUNK, Digest, is_digest
from importer.format.manifest import BundleManifest, LayerRecord
from importer.input.layers import decompress_errors
from importer.streams.commands import command_stdout
from importer.streams.compression import open_decompressed
from importer.streams.tarout import begin_member, end_member

ProgressFn = Any
_DECOMPRESS_ERRORS = decompress_errors()


def users_of(manifest: BundleManifest, layer: LayerRecord) -> List[str]:
    """The names of the bundle's images that need ``layer``."""
    return [img.name for img in manifest.images if any(x.diff_id == layer.diff_id for x in img.layers)]


def missing_base_layers(manifest: BundleManifest, held: Dict[Digest, str]) -> List[str]:
    """Lines naming every external layer the engine lacks and which images need it."""
    return [f"host lacks layer {layer.diff_id} required by {', '.join(users_of(manifest, layer))}"
            for layer in manifest.external_layers() if layer.diff_id not in held]


def base_missing(manifest: BundleManifest, lines: List[str], engine: str = "the engine") -> DeltaBaseMissing:
    """The error for a delta whose base is incomplete; ``lines``: one per missing layer."""
    return DeltaBaseMissing(
        f"checking the base of a delta bundle: expected {engine} to hold {len(manifest.external_layers())} "
        f"layer(s) the bundle leaves out, found {len(lines)} missing",
        context="\n".join(lines),
        hint="nothing was loaded; import the base bundle first, or re-export without --have "
        "(or with --have from this host's current inventory)",
    )


def require_base(manifest: BundleManifest, held: Dict[Digest, str]) -> Dict[Digest, str]:
    """The engine image holding each external layer; DeltaBaseMissing if any is absent."""
    missing = missing_base_layers(manifest, held)
    if missing:
        raise base_missing(manifest, missing)
    return {x.diff_id: held[x.diff_id] for x in manifest.external_layers()}


def image_holders(base: Optional[Mapping[Digest, Optional[str]]]) -> Dict[Digest, str]:
    """The images a delta's left-out layers are re-exported from, as :func:`require_base` found
    them (docker, podman: every layer names its holder)."""
    return {digest: image for digest, image in (base or {}).items() if image is not None}


def pick_holders(images: Iterable[Tuple[str, Sequence[str]]]) -> Dict[Digest, str]:
    """Every layer diff_id of ``(image name, diff_ids)`` pairs -> the image with the fewest
    layers holding it (the cheapest to re-export)."""
    held: Dict[Digest, str] = {}
    depth: Dict[Digest, int] = {}
    for name, layers in images:
        for d in layers:
            if is_digest(d):
                digest = Digest.parse(d)
                if digest not in held or len(layers) < depth[digest]:
                    held[digest], depth[digest] = name, len(layers)
    return held


class _Prefixed:
    """A reader that first returns ``head`` (bytes already read to sniff the format)."""

    def __init__(self, head: bytes, raw: BinaryIO) -> None:
        self._head = head
        self._raw = raw

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n < 0 or n >= len(self._head):
                head, self._head = self._head, b""
                rest = self._raw.read(-1 if n < 0 else n - len(head))
                return head + rest
            head, self._head = self._head[:n], self._head[n:]
            return head
        return self._raw.read(n)


def sniff_compression(head: bytes) -> str:
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    return "none"


def splice_engine_layers(tar: tarfile.TarFile, docker_argv: List[str], holders: Dict[Digest, str],
                         on_bytes: Optional[ProgressFn] = None) -> Dict[Digest, str]:
    """Re-export the images holding the needed layers (``docker save ID``, ``podman save ID``)
    and copy their layer members (``<id>/layer.tar``, ``<hex>.tar``, ``blobs/sha256/<hex>``) into
    ``tar`` as ``ext/<n>/layer.tar``, hashing each as it passes.

    Docker's containerd store saves each layer blob as it keeps it (gzip, zstd): such a member is
    copied as it is (``docker load`` decompresses it) and its diff_id is computed by decompressing
    the bytes as they pass, streamed, never held whole.

    Returns diff_id -> member path for every needed layer; raises if one did not come back."""
    needed: Set[Digest] = set(holders)
    paths: Dict[Digest, str] = {}
    n = 0
    for image_id in sorted(set(holders.values())):
        if needed <= set(paths):
            break
        with command_stdout([*docker_argv, "save", image_id],
                            what=f"re-exporting base layers from image {image_id[:19]}") as stream:
            with tarfile.open(fileobj=stream, mode="r|") as src:
                for member in src:
                    if not member.isfile() or not (member.name.endswith(".tar")
                                                   or member.name.startswith("blobs/sha256/")):
                        continue
                    f = src.extractfile(member)
                    if f is None:
                        continue
                    path = f"ext/{n}/layer.tar"
                    n += 1
                    diff_id = _copy_member(f, member.size, tar, path, on_bytes)  # type: ignore[arg-type]
                    if diff_id in needed and diff_id not in paths:
                        paths[diff_id] = path
            while stream.read(CHUNK):
                pass
    lost = needed - set(paths)
    if lost:
        raise DiffIDMismatch(
            "re-exporting base layers: expected the engine to return "
            + ", ".join(str(d) for d in sorted(lost)) + ", found other content",
            hint="the engine's copy of the base image changed; import the base bundle again",
        )
    return paths


def _copy_member(src: BinaryIO, size: int, tar: tarfile.TarFile, path: str, on_bytes: Any) -> Digest:
    """Append ``src`` (``size`` bytes) to ``tar`` as ``path``; return the sha256 of the layer tar
    (of the decompressed bytes when the member is a gzip or zstd blob)."""
    info = tarfile.TarInfo(path)
    info.size = size
    info.mode = 0o644
    begin_member(tar, path, size, info=info)
    tee = _Tee(src, size, tar.fileobj, path, on_bytes)
    head = tee.read(4)
    kind = sniff_compression(head)
    h = hashlib.sha256()
    if kind == "none":
        h.update(head)
        while True:
            data = tee.read(CHUNK)
            if not data:
                break
            h.update(data)
    else:
        what = f"re-exporting base layers: decompressing {path}"
        try:
            with open_decompressed(_Prefixed(head, tee), kind, bound=1 << 50, what=what) as plain:  # type: ignore
                while True:
                    data = plain.read(CHUNK)
                    if not data:
                        break
                    h.update(data)
        except BundleError:
            raise
        except _DECOMPRESS_ERRORS as e:
            raise DecompressFailed(f"{what}: expected a valid {kind} stream, found damaged data ({e})",
                                   hint="the engine's copy of the base layer is damaged; import the base "
                                   "bundle again") from e
        while tee.read(CHUNK):  # trailing bytes after the compressed stream still belong to the member
            pass
    if tee.left:
        raise DiffIDMismatch(f"re-exporting base layers: {path} ended after {size - tee.left} of {size} bytes")
    end_member(tar, size)
    return Digest("sha256", h.hexdigest())


class _Tee:
    """Reads at most ``size`` bytes of ``src`` and writes each byte read to ``dst`` as it passes."""

    def __init__(self, src: Any, size: int, dst: Any, path: str, on_bytes: Any) -> None:
        self.src, self.left, self.dst, self.path, self.on_bytes = src, size, dst, path, on_bytes

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self.src.read(min(want, CHUNK * 4))
        if not data:
            raise DiffIDMismatch(f"re-exporting base layers: {self.path} ended after some bytes, "
                                 f"{self.left} short")
        self.left -= len(data)
        self.dst.write(data)
        if self.on_bytes is not None:
            self.on_bytes(len(data))
        return bytes(data)

    def readable(self) -> bool:
        return True


def copy_engine_blobs(tar: tarfile.TarFile, docker_argv: List[str], holders: Dict[Digest, str],
                      blobs: Dict[Digest, LayerRecord], on_bytes: Optional[ProgressFn] = None) -> None:
    """Docker's containerd store, a delta whose left-out layers name compressed blobs: copy each
    such blob byte for byte out of ``docker save`` of the image holding it into ``tar`` as
    ``blobs/sha256/<hex>`` (an OCI archive of the bundle's own manifest), checking digest and
    size as it passes. DeltaBaseMissing when the engine keeps the layer compressed otherwise (it
    holds the diff_id, not that blob); the caller aborts the load, so nothing is named."""
    wanted = {str(layer.digest.blob_path): layer for layer in blobs.values()}
    done: Set[str] = set()
    for image_id in sorted({holders[layer.diff_id] for layer in blobs.values()}):
        if len(done) == len(wanted):
            break
        with command_stdout([*docker_argv, "save", image_id],
                            what=f"re-exporting base layers from image {image_id[:19]}") as stream:
            with tarfile.open(fileobj=stream, mode="r|") as src:
                for member in src:
                    layer = wanted.get(member.name)
                    if layer is None or member.name in done or not member.isfile():
                        continue
                    f = src.extractfile(member)
                    if f is None or member.size != layer.size:
                        continue
                    tee = _Tee(f, member.size, tar.fileobj, member.name, on_bytes)
                    info = tarfile.TarInfo(member.name)
                    info.size, info.mode = member.size, 0o644
                    begin_member(tar, member.name, member.size, info=info)
                    h = hashlib.sha256()
                    while True:
                        data = tee.read(CHUNK)
                        if not data:
                            break
                        h.update(data)
                    if Digest("sha256", h.hexdigest()) != layer.digest:
                        raise DiffIDMismatch(f"re-exporting base layers from image {image_id[:19]}: expected "
                                             f"blob {layer.digest}, found other content",
                                             hint="the engine's copy of the base layer is damaged; import the "
                                             "base bundle again")
                    end_member(tar, member.size)
                    done.add(member.name)
            while stream.read(CHUNK):
                pass
    lost = [layer for name, layer in sorted(wanted.items()) if name not in done]
    if lost:
        raise DeltaBaseMissing(
            "completing a delta bundle from Docker's containerd store: expected the engine to keep "
            f"{len(lost)} left-out layer(s) as the blobs the bundle names, found them stored otherwise",
            context="\n".join(f"layer {x.diff_id}: no blob {x.digest}" for x in lost),
            hint="nothing was loaded; re-export the delta with --have from this host's inventory "
            "(bundle-import --inventory), or import the base bundle itself first",
        )
