"""Delta bundles on the importing side: check that the engine holds every layer the bundle
left out, and re-export those layers from the engine so they can be spliced into the load."""

from __future__ import annotations

import hashlib
import tarfile
from typing import Any, BinaryIO, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from importer.errors import DeltaBaseMissing, DiffIDMismatch
from importer.format.digest import CHUNK, Digest, is_digest
from importer.format.manifest import BundleManifest, LayerRecord
from importer.streams.commands import command_stdout

ProgressFn = Any


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


def splice_engine_layers(tar: tarfile.TarFile, docker_argv: List[str], holders: Dict[Digest, str],
                         on_bytes: Optional[ProgressFn] = None) -> Dict[Digest, str]:
    """Re-export the images holding the needed layers (``docker save ID``, ``podman save ID``)
    and copy their layer members (``<id>/layer.tar``, ``<hex>.tar``, ``blobs/sha256/<hex>``) into
    ``tar`` as ``ext/<n>/layer.tar``, hashing each as it passes.

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
    info = tarfile.TarInfo(path)
    info.size = size
    info.mode = 0o644
    assert tar.fileobj is not None
    header = info.tobuf(tar.format, tar.encoding, tar.errors)
    tar.fileobj.write(header)
    tar.offset += len(header)
    h = hashlib.sha256()
    left = size
    while left:
        data = src.read(min(CHUNK, left))
        if not data:
            raise DiffIDMismatch(f"re-exporting base layers: {path} ended after {size - left} of {size} bytes")
        h.update(data)
        tar.fileobj.write(data)
        left -= len(data)
        if on_bytes is not None:
            on_bytes(len(data))
    blocks, rem = divmod(size, tarfile.BLOCKSIZE)
    if rem:
        tar.fileobj.write(tarfile.NUL * (tarfile.BLOCKSIZE - rem))
        blocks += 1
    tar.offset += blocks * tarfile.BLOCKSIZE
    return Digest("sha256", h.hexdigest())
