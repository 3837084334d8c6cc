"""Delta bundles into containerd: complete the layers a delta leaves out from the content store.

An external layer that names a compressed blob (the delta was made with ``--have`` from an
earlier bundle.json or a containerd inventory) is complete when the content store holds that
digest: the OCI archive fed to ``ctr images import`` leaves it out, and containerd uses its own
copy (``ctr images check`` proves it is there after the import). An external layer described
uncompressed (digest = diff_id: the delta was made from a Docker inventory) is rebuilt: a stored
blob labelled ``containerd.io/uncompressed=<diff_id>`` (containerd labels every layer it
unpacked) is read back (``ctr content get``), decompressed, hashed and written into the archive
as the uncompressed tar, which must hash to the diff_id. containerd then keeps that uncompressed
copy as well; a delta made from the containerd host's own inventory avoids it."""

from __future__ import annotations

import contextlib
import hashlib
import tarfile
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional

from importer.errors import BundleError, DecompressFailed, DiffIDMismatch, SizeMismatch
from importer.format.digest import CHUNK, Digest, is_digest
from importer.format.manifest import BundleManifest, LayerRecord
from importer.input.layers import decompress_errors
from importer.sinks.delta import _Prefixed, base_missing, sniff_compression, users_of
from importer.streams.commands import command_stdout
from importer.streams.compression import open_decompressed
from importer.streams.tarout import begin_member, end_member

ProgressFn = Callable[[int], None]
_DECOMPRESS_ERRORS = decompress_errors()
UNCOMPRESSED_LABEL = "containerd.io/uncompressed"

#: external layer digest -> None (the content store holds it) or the stored compressed blob
#: to decompress into the archive as the uncompressed tar
ContainerdPlan = Dict[Digest, Optional[str]]


def parse_content_rows(out: str) -> Dict[str, Optional[str]]:
    """digest -> its ``containerd.io/uncompressed`` label (or None) from ``ctr content ls``."""
    rows: Dict[str, Optional[str]] = {}
    for line in out.splitlines()[1:]:
        parts = line.split()
        if not parts or not is_digest(parts[0]):
            continue
        uncompressed = None
        for label in parts[-1].split(","):
            key, _, value = label.partition("=")
            if key == UNCOMPRESSED_LABEL and is_digest(value):
                uncompressed = value
        rows[parts[0]] = uncompressed
    return rows


def plan_delta(manifest: BundleManifest, content: Dict[str, Optional[str]], where: str) -> ContainerdPlan:
    """How each external layer is completed; DeltaBaseMissing (nothing loaded) if one cannot be."""
    plan: ContainerdPlan = {}
    missing: List[str] = []
    for layer in manifest.external_layers():
        if str(layer.digest) in content:
            plan[layer.digest] = None
            continue
        source = None
        if not layer.names_compressed_blob:
            source = next((d for d, u in sorted(content.items()) if u == str(layer.diff_id)), None)
        if source is not None:
            plan[layer.digest] = source
            continue
        lacks = (f"no blob {layer.digest}" if layer.names_compressed_blob
                 else f"no blob that decompresses to {layer.diff_id}")
        missing.append(f"host lacks layer {layer.diff_id} required by {', '.join(users_of(manifest, layer))} "
                       f"({where} holds {lacks})")
    if missing:
        raise base_missing(manifest, missing, engine=where)
    return plan


@contextlib.contextmanager
def _uncompressed(stream: BinaryIO, layer: LayerRecord, what: str) -> Iterator[Any]:
    head = stream.read(4)
    with open_decompressed(_Prefixed(head, stream), sniff_compression(head),
                           bound=layer.uncompressed_size, what=what) as plain:
        yield plain


def _read(plain: Any, n: int, what: str) -> bytes:
    try:
        return bytes(plain.read(n))
    except BundleError:
        raise
    except _DECOMPRESS_ERRORS as e:
        raise DecompressFailed(f"{what}: expected a valid compressed stream, found damaged data ({e})",
                               hint="containerd's copy of the base layer is damaged; import the base bundle "
                               "again") from e


def write_unpacked_layer(tar: tarfile.TarFile, ctr_argv: List[str], source: str, layer: LayerRecord,
                         on_bytes: Optional[ProgressFn] = None) -> None:
    """Append ``blobs/sha256/<diff_id>``: the stored blob ``source`` decompressed, checked
    against the layer's diff_id and uncompressed size as it passes."""
    what = f"rebuilding layer {layer.diff_id} from containerd's blob {source[:19]}"
    assert tar.fileobj is not None
    h = hashlib.sha256()
    with command_stdout([*ctr_argv, "content", "get", source], what=what) as stream:
        with _uncompressed(stream, layer, what) as plain:
            begin_member(tar, layer.digest.blob_path, layer.uncompressed_size)
            left = layer.uncompressed_size
            while left:
                data = _read(plain, min(CHUNK, left), what)
                if not data:
                    raise SizeMismatch(f"{what}: expected {layer.uncompressed_size} bytes, "
                                       f"found {layer.uncompressed_size - left}",
                                       hint="the stored blob is damaged; import the base bundle again")
                h.update(data)
                tar.fileobj.write(data)
                left -= len(data)
                if on_bytes is not None:
                    on_bytes(len(data))
            if _read(plain, 1, what):
                raise SizeMismatch(f"{what}: expected {layer.uncompressed_size} bytes, found more",
                                   hint="the stored blob is damaged; import the base bundle again")
        while stream.read(CHUNK):
            pass
    found = Digest("sha256", h.hexdigest())
    if found != layer.diff_id:
        raise DiffIDMismatch(f"{what}: expected diff_id {layer.diff_id}, found {found}",
                             hint="containerd's copy of the base layer is damaged; import the base bundle again")
    end_member(tar, layer.uncompressed_size)
