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

:func:`write_layout` writes that image into an OCI image layout, which the export then reads as
any ``oci:DIR`` source: it is an ordinary image of the bundle from there on (its layers copied as
stored, ``--have`` leaves out layers the far side holds, every engine imports it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from bundle.fileartifact import FileSet, SourceFile
from importer.errors import UsageError
from importer.format.digest import CHUNK, BlobRef, Digest
from importer.format.fileartifacts import TITLE_ANNOTATION
from importer.format.mediatypes import OCI_CONFIG, OCI_INDEX, OCI_LAYER_TAR, OCI_MANIFEST
from importer.format.platform import Platform, host, parse_platform
from importer.format.reference import split_reference
from importer.streams.fsutil import fsync_dir

AS_IMAGE_LABEL = "dev.sneakernet.files.as-image"
CONTAINERD_NAME = "io.containerd.image.name"  # the name the oci: source gives the image in the bundle
REF_NAME = "org.opencontainers.image.ref.name"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_BLOCK = tarfile.BLOCKSIZE


def _member(name: str, *, folder: bool, mode: int, size: int = 0) -> bytes:
    info = tarfile.TarInfo(name + ("/" if folder else ""))
    info.type = tarfile.DIRTYPE if folder else tarfile.REGTYPE
    info.mode, info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = mode, size, 0, 0, 0, "", ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


class _Blob:
    """A blob being written into the layout: hashed as written, renamed to its digest when whole."""

    def __init__(self, layout: str) -> None:
        self.folder = os.path.join(layout, "blobs", "sha256")
        self.tmp = os.path.join(self.folder, f".tmp-{os.getpid()}-{id(self)}")
        self.out = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish()
        self.hasher, self.size = hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.hasher.update(data)
        self.size += len(data)

    def finish(self) -> BlobRef:
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        digest = Digest("sha256", self.hasher.hexdigest())
        os.replace(self.tmp, os.path.join(self.folder, digest.hex))
        return BlobRef("", digest, self.size)


def _layer(layout: str, f: SourceFile) -> BlobRef:
    """The uncompressed tar of one file at its title (its folders first), read once."""
    blob = _Blob(layout)
    parts = f.title.split("/")
    for n in range(1, len(parts)):
        blob.write(_member("/".join(parts[:n]), folder=True, mode=0o755))
    fd = os.open(f.path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"exporting --as-image {f.path}: expected a regular file, found something else",
                             hint="nothing was written")
        blob.write(_member(f.title, folder=False, mode=f.mode, size=st.st_size))
        copied = 0
        for chunk in iter(lambda: src.read(CHUNK), b""):
            copied += len(chunk)
            if copied > st.st_size:
                break
            blob.write(chunk)
        if copied != st.st_size:
            raise UsageError(f"exporting --as-image {f.path}: expected {st.st_size} bytes, found {copied} (the file "
                             "changed while it was read)", hint="export again when it no longer changes; nothing "
                             "was written")
    if st.st_size % _BLOCK:
        blob.write(b"\0" * (_BLOCK - st.st_size % _BLOCK))
    blob.write(b"\0" * (2 * _BLOCK))  # the end of the archive
    return blob.finish()


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _small(layout: str, data: bytes) -> BlobRef:
    blob = _Blob(layout)
    blob.write(data)
    return blob.finish()


def image_documents(fs: FileSet, layers: List[BlobRef], platform: Platform) -> Tuple[bytes, Dict[str, object]]:
    """(the config's bytes, the manifest without its config descriptor's digest filled in: see write_layout)."""
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


def write_layout(fs: FileSet, layout: str, platform: Optional[Platform] = None) -> str:
    """The image of ``fs`` as the one image of a new OCI layout at ``layout``; returns its name
    (``fs.ref``), which ``index.json`` gives it (``io.containerd.image.name``)."""
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    layers = [_layer(layout, f) for f in fs.files]
    raw_config, manifest = image_documents(fs, layers, platform or host())
    config = _small(layout, raw_config)
    manifest["config"] = {"mediaType": OCI_CONFIG, "digest": str(config.digest), "size": config.size}
    raw_manifest = json.dumps(manifest, separators=(",", ":")).encode("utf-8")
    top = _small(layout, raw_manifest)
    _, tag, _ = split_reference(fs.ref)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [{"mediaType": OCI_MANIFEST, "digest": str(top.digest), "size": top.size,
                            "annotations": {CONTAINERD_NAME: fs.ref, REF_NAME: tag}}]}
    with open(os.path.join(layout, "index.json"), "wb") as out:
        out.write(json.dumps(index).encode("utf-8"))
    with open(os.path.join(layout, "oci-layout"), "wb") as out:
        out.write(b'{"imageLayoutVersion":"1.0.0"}')
    fsync_dir(os.path.join(layout, "blobs", "sha256"))
    return fs.ref


class AsImage:
    """The OCI layout ``--as-image`` wrote (beside the output, on its file system), removed after the export."""

    def __init__(self) -> None:
        self.layout: Optional[str] = None

    def cleanup(self) -> None:
        if self.layout is not None:
            shutil.rmtree(self.layout, ignore_errors=True)
            self.layout = None


def files_as_image(args: Any, images: List[str], files: Optional[FileSet], out_dir: str
                   ) -> Tuple[List[str], Optional[FileSet], AsImage]:
    """``--as-image``: (the images to export, the files to carry as an artifact, the layout to remove):
    the files' image in a layout beside ``out_dir``, exported as ``oci:LAYOUT``, and no artifact.
    Without it, what was given."""
    made = AsImage()
    if not getattr(args, "as_image", False):
        return images, files, made
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
    made.layout = tempfile.mkdtemp(prefix=".sneakernet-as-image-", dir=os.path.dirname(os.path.abspath(out_dir)))
    try:
        write_layout(files, os.path.join(made.layout, "layout"), platform)
    except BaseException:
        made.cleanup()
        raise
    return [f"oci:{os.path.join(made.layout, 'layout')}"], None, made
