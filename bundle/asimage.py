"""``bundle export --files DIR --artifact-ref NAME:TAG --as-image``: the files as a runnable-format
image (issue 42 point 5), for what mounts only images (containerd/CRI-O ``ImageVolume``, a pod's
``image`` volume) and for ``docker load``.

The image is ``FROM scratch`` with one uncompressed tar layer per file (in title order): the file
at its title below the image's root (``model.safetensors``, ``tokenizer/tokenizer.json``), the
folders on its way (0755, owner 0:0, no time), its mode as the file's; so an ``ImageVolume``
mounted at ``/models`` shows ``/models/<title>``. The config names the platform, ``rootfs.diff_ids``
(each layer's digest: it is uncompressed) and labels (``org.opencontainers.image.title`` the ref's
name, ``dev.sneakernet.files.as-image`` ``1``); no command (nothing runs in it) and no clock, so
the same files give the same image ID. The manifest is an OCI image manifest, each layer annotated
with its title.

:class:`FilesImageSource` gives that image to the one export loop (bundle/exportloop.py) as a
stream of layers (protocol.py's ``stream``, as a ``docker save`` archive is read): the loop reads
each file once, writing its layer tar into the bundle's blob store under a temp name while hashing
it, and renames it to its digest; the config and the manifest are made from those records. Nothing
is staged, so the export needs no disk beyond the bundle. From there it is an ordinary image of the
bundle (``--have`` leaves out layers the far side holds, every engine imports it)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import tarfile
from typing import Any, ContextManager, Dict, Generator, List, Optional, Sequence, Tuple

from bundle.fileartifact import FileSet, SourceFile
from bundle.sources import SourceImage, SourceInfo, platform_of
from bundle.sources.blobcopy import keep_manifest
from bundle.sources.protocol import (
    CheckedRefs,
    LayerFeed,
    LayerMismatch,
    Resolved,
    Selection,
    SourceBase,
    StreamedImages,
    StreamedLayer,
)
from importer.errors import UsageError
from importer.format.digest import CHUNK, BlobRef, Digest, Readable
from importer.format.fileartifacts import TITLE_ANNOTATION
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import OCI_CONFIG, OCI_LAYER_TAR, OCI_MANIFEST
from importer.format.platform import Platform, host, parse_platform
from importer.format.reference import split_reference

AS_IMAGE_LABEL = "dev.sneakernet.files.as-image"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_BLOCK = tarfile.BLOCKSIZE


def _member(name: str, *, folder: bool, mode: int, size: int = 0) -> bytes:
    info = tarfile.TarInfo(name + ("/" if folder else ""))
    info.type = tarfile.DIRTYPE if folder else tarfile.REGTYPE
    info.mode, info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = mode, size, 0, 0, 0, "", ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _folders(title: str) -> List[bytes]:
    parts = title.split("/")
    return [_member("/".join(parts[:n]), folder=True, mode=0o755) for n in range(1, len(parts))]


def _padding(size: int) -> bytes:
    return b"\0" * ((_BLOCK - size % _BLOCK) % _BLOCK)


def layer_size(f: SourceFile) -> int:
    """The bytes of ``f``'s layer tar (its folders, its header, its bytes padded, the end of the
    archive), known from its scanned size before it is read."""
    head = sum(map(len, _folders(f.title))) + len(_member(f.title, folder=False, mode=f.mode, size=f.size))
    return head + f.size + len(_padding(f.size)) + 2 * _BLOCK


def _changed(f: SourceFile, found: str) -> UsageError:
    return UsageError(f"exporting --as-image {f.path}: expected the file as scanned ({f.size} bytes, unchanged "
                      f"while read), found {found}", hint="export again when it no longer changes; nothing was written")


class LayerReader:
    """The uncompressed tar of one file at its title (its folders first), read from the file as the
    export loop reads it: nothing is staged. The file must stay as scanned while it is read (same
    size, same modification time before and after), else the read fails with a UsageError."""

    def __init__(self, f: SourceFile) -> None:
        self.file = f
        self._parts = self._generate()
        self._pending = b""

    def _generate(self) -> Generator[bytes, None, None]:
        f = self.file
        yield from _folders(f.title)
        fd = os.open(f.path, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "rb") as src:
            st = os.fstat(src.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"exporting --as-image {f.path}: expected a regular file, found something else",
                                 hint="nothing was written")
            if st.st_size != f.size:
                raise _changed(f, f"{st.st_size} bytes (it changed since it was scanned)")
            yield _member(f.title, folder=False, mode=f.mode, size=f.size)
            copied = 0
            for chunk in iter(lambda: src.read(CHUNK), b""):
                copied += len(chunk)
                if copied > f.size:
                    break
                yield chunk
            after = os.fstat(src.fileno())
            if copied != f.size:
                raise _changed(f, f"{'more than ' if copied > f.size else ''}{copied} bytes (it changed while "
                               "it was read)")
            if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                raise _changed(f, "its modification time changed while it was read")
        yield _padding(f.size) + b"\0" * (2 * _BLOCK)  # the last block filled, then the end of the archive

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            rest, self._pending = self._pending + b"".join(self._parts), b""
            return rest
        while not self._pending:
            part = next(self._parts, None)
            if part is None:
                return b""
            self._pending = part
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def close(self) -> None:
        """The file closed, read to its end or not."""
        self._parts.close()


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")


def image_documents(fs: FileSet, layers: List[BlobRef], platform: Platform) -> Tuple[bytes, Dict[str, object]]:
    """(the config's bytes, the manifest without its config descriptor: FilesImageSource.stream fills it in)."""
    name, _, _ = split_reference(fs.ref)
    config: Dict[str, object] = {
        "architecture": platform.architecture, "os": platform.os,
        "config": {"Labels": {TITLE_ANNOTATION: name, AS_IMAGE_LABEL: "1"}},
        "rootfs": {"type": "layers", "diff_ids": [str(b.digest) for b in layers]},
        "history": [{"created_by": f"sneakernet --as-image: {f.title}"} for f in fs.files],
    }
    if platform.variant:
        config["variant"] = platform.variant
    manifest: Dict[str, object] = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "layers": [{"mediaType": OCI_LAYER_TAR, "digest": str(b.digest), "size": b.size,
                    "annotations": {TITLE_ANNOTATION: f.title}} for f, b in zip(fs.files, layers)],
    }
    return _json(config), manifest


class FilesImageSource(SourceBase):
    """``--as-image``'s source: the image of a :class:`FileSet`, streamed (protocol.py's
    ``stream``) into the one export loop (bundle/exportloop.py), which writes each layer once into
    the bundle's blob store, hashing it as it goes (its digest is its diff_id); the config and the
    manifest are made from what the loop stored. ``image_platform``: the platform the config names.

    ``hash_first`` (``--have``): each layer is hashed before the loop reads it, so that the loop
    leaves out a layer the far side holds without writing it (read twice, never written); a file
    that changed between the two reads is refused."""

    kind = "files"

    def __init__(self, fs: FileSet, image_platform: Optional[Platform] = None, *, hash_first: bool = False) -> None:
        self.fs = fs
        self.image_platform = image_platform or host()
        self.hash_first = hash_first

    def info(self) -> SourceInfo:
        return SourceInfo("files", {"asImage": True})

    def _check(self, refs: Sequence[str]) -> None:
        if list(refs) != [self.fs.ref]:
            raise UsageError(f"exporting --as-image: expected the image {self.fs.ref}, found {', '.join(refs)}")

    def check_refs(self, refs: Sequence[str], selection: Selection) -> CheckedRefs:
        self._check(refs)
        return CheckedRefs(sum(layer_size(f) for f in self.fs.files))

    def resolve(self, refs: Sequence[str], selection: Selection) -> List[Resolved]:
        self._check(refs)
        return [StreamedImages((self.fs.ref,))]

    def stream(self, images: StreamedImages) -> LayerFeed:
        """One layer per file, each read once by the loop; the image made from the records it sends back."""
        stored: List[LayerRecord] = []
        for f in self.fs.files:
            expected = _hashed(f) if self.hash_first else None
            got = yield StreamedLayer(f"--as-image {f.title}", functools.partial(_opened, f), expected=expected)
            if isinstance(got, LayerMismatch):  # it hashed to another digest the second time it was read
                raise _changed(f, "other bytes the second time it was read (it changed between the two reads: "
                               f"{expected}, then {got.found or got.reason})")
            if not isinstance(got, LayerRecord):  # never: one layer sent, one record back
                raise UsageError(f"exporting --as-image {f.path}: expected its layer stored, found {got}")
            stored.append(got)
        layers = [BlobRef(OCI_LAYER_TAR, r.diff_id, r.uncompressed_size) for r in stored]
        raw_config, manifest = image_documents(self.fs, layers, self.image_platform)
        manifest["config"] = {"mediaType": OCI_CONFIG, "digest": str(Digest.of_bytes(raw_config)),
                              "size": len(raw_config)}
        raw_manifest = json.dumps(manifest, separators=(",", ":")).encode("utf-8")
        platform = platform_of(json.loads(raw_config))
        kept = keep_manifest(raw_manifest, raw_config, stored)
        if kept is None:  # --compression zstd|gzip: the bundle's own manifest, as for any recompressed image
            return [SourceImage((self.fs.ref,), raw_config, tuple(stored), platform)]
        return [SourceImage((self.fs.ref,), raw_config, kept[0], platform, raw_manifest=raw_manifest,
                            manifest_media_type=kept[1], config_media_type=kept[2])]


def _hashed(f: SourceFile) -> Digest:
    """The digest of ``f``'s layer tar, read and hashed, nothing written."""
    hasher = hashlib.sha256()
    with contextlib.closing(LayerReader(f)) as reader:
        for chunk in iter(lambda: reader.read(CHUNK), b""):
            hasher.update(chunk)
    return Digest("sha256", hasher.hexdigest())


def _opened(f: SourceFile) -> ContextManager[Readable]:
    return contextlib.closing(LayerReader(f))


def files_as_image(args: Any, images: List[str], files: Optional[FileSet]
                   ) -> Tuple[List[str], Optional[FileSet], Optional[FilesImageSource]]:
    """``--as-image``: (the images to export, the files to carry as an artifact, the source to read
    them from): the files' image (its one name, ``--artifact-ref``) from a :class:`FilesImageSource`,
    and no artifact. Without it, what was given and no source of its own."""
    if not getattr(args, "as_image", False):
        return images, files, None
    if files is None:
        raise UsageError("exporting with --as-image: expected files to package (--files DIR or --file PATH, with "
                         "--artifact-ref NAME:TAG), found none", hint="bundle export --files DIR --artifact-ref "
                         "models/llama:3.1 --as-image -o OUT")
    if files.model:
        raise UsageError("exporting with --as-image: expected plain files, found --model (a runnable image has no "
                         "ModelPack layer types)", hint="drop --model, or --as-image to carry a ModelPack artifact")
    if images:
        raise UsageError(f"exporting with --as-image: expected the files alone, found images too ({images[0]})",
                         hint="export the images in another bundle, or carry the files beside them as an artifact "
                         "(drop --as-image)")
    platforms = [v for given in getattr(args, "platform", None) or [] for v in given.split(",") if v]
    if len(platforms) > 1 or getattr(args, "all_platforms", False):
        raise UsageError("exporting with --as-image: expected one platform, found several",
                         hint="the files are the same on every platform: give one --platform (default: this host's)")
    platform = parse_platform(platforms[0]) if platforms else None
    return [files.ref], None, FilesImageSource(files, platform, hash_first=bool(getattr(args, "have", None)))
