"""``bundle export --files DIR`` / ``--file PATH[=NAME]`` ``--artifact-ref NAME:TAG`` [``--model``]:
files carried as one OCI artifact (schema 3.6; importer/format/fileartifacts.py, docs/files.md).

:func:`scan_files` finds the files before anything is written: every regular file below each DIR
(its path relative to DIR kept as its title), each ``--file``; a symbolic link, device, FIFO or
socket, a title that could not be written safely on the far side, two files with one title:
refused in one error naming the path, nothing written. :func:`write_artifact` then copies each
file once into the blob store (hashed while copied, :meth:`BlobStore.write_raw`), one raw layer
per file, and writes the config and the manifest."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from typing import BinaryIO, Callable, Dict, List, Optional, Sequence, Tuple

from bundle.blobstore import BlobStore
from bundle.sources import SourceInfo
from bundle.sources.protocol import CheckedRefs, Selection, SourceBase
from importer.errors import UsageError
from importer.format.digest import CHUNK, BlobRef, Digest
from importer.format.fileartifacts import (
    EMPTY_JSON,
    FILES_ARTIFACT_TYPE,
    MODE_ANNOTATION,
    MODEL_ARTIFACT_TYPE,
    MODEL_CONFIG,
    MODEL_FILEPATH_ANNOTATION,
    MODEL_WEIGHT,
    OCI_EMPTY,
    OCTET_STREAM,
    TITLE_ANNOTATION,
    CarriedFile,
    FileArtifact,
    mode_text,
    model_media_type,
    title_issue,
)
from importer.format.manifest import valid_ref
from importer.format.mediatypes import OCI_MANIFEST
from importer.format.reference import split_reference
from importer.inventory.have import HeldFiles, merge_held_files
from importer.streams.fsutil import describe_mode

ProgressFn = Callable[[int], None]
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_WEIGHT_FORMATS = {".safetensors": "safetensors", ".gguf": "gguf", ".onnx": "onnx", ".pt": "pytorch",
                   ".pth": "pytorch", ".bin": "pytorch", ".h5": "keras"}


@dataclass(frozen=True)
class SourceFile:
    """One file to carry: where it is read from, its title (path below the far side's DIR), mode, size."""

    path: str
    title: str
    mode: int
    size: int


@dataclass(frozen=True)
class FileSet:
    """What ``--files``/``--file`` name, scanned: the files in title order, the ref, ``--model``."""

    ref: str
    files: Tuple[SourceFile, ...]
    model: bool = False
    #: ``--have``: what the far side holds; such a file is left out (a file delta, schema 3.8)
    held: Optional[HeldFiles] = None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def _refuse(what: str, path: str, found: str, hint: str) -> UsageError:
    return UsageError(f"exporting {what} {path}: expected regular files only, found {found}", hint=hint)


def _walk(top: str) -> List[Tuple[str, str]]:
    """(path, title) of every entry below ``top`` that is not a folder, never following a link."""
    out: List[Tuple[str, str]] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        here = os.path.join(top, rel) if rel else top
        with os.scandir(here) as entries:
            for entry in entries:
                title = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=False):
                    pending.append(title)
                else:
                    out.append((entry.path, title))
    return out


def _source_file(path: str, title: str, what: str) -> SourceFile:
    """A regular file (lstat: a link, even to a file, is refused), its title checked."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(what, path, describe_mode(st.st_mode),
                      "carry the file a link points to (--file TARGET=NAME), or remove the link, device or FIFO "
                      "from the folder; nothing was written")
    issue = title_issue(title)
    if issue is not None:
        raise UsageError(f"exporting {what} {path}: its name {title!r} cannot be written on the far side: {issue}",
                         hint="rename the file, or give it a name with --file PATH=NAME; nothing was written")
    return SourceFile(path, title, st.st_mode & 0o777, st.st_size)


def _file_arg(value: str) -> Tuple[str, str]:
    """``--file PATH[=NAME]``: a PATH that exists as given is the whole value (a name with '=')."""
    if os.path.lexists(value) or "=" not in value:
        return value, os.path.basename(value.rstrip("/"))
    path, _, name = value.rpartition("=")
    return path, name


def scan_files(dirs: Sequence[str], files: Sequence[str], ref: Optional[str], *,
               model: bool = False, schema: int = 3, have: Sequence[str] = ()) -> Optional[FileSet]:
    """The files ``--files DIR`` (repeatable) and ``--file PATH[=NAME]`` (repeatable) name, or None
    when neither is given. Refuses (UsageError, nothing written) a missing ``--artifact-ref``, a
    link, device, FIFO or socket, an unsafe title, two files with one title, an empty selection."""
    if not dirs and not files:
        if ref or model:
            raise UsageError("exporting with --artifact-ref/--model: expected files to carry (--files DIR or "
                             "--file PATH), found none",
                             hint="bundle export --files DIR --artifact-ref NAME:TAG -o OUT")
        return None
    if schema < 3:
        raise UsageError(f"exporting files with --schema {schema}: files are carried by schema 3 bundles (3.6)",
                         hint="drop --schema or use --schema 3")
    ref = _check_ref(ref)
    found: Dict[str, SourceFile] = {}
    picked: List[SourceFile] = []
    for top in dirs:
        if not os.path.isdir(top):
            raise UsageError(f"exporting --files {top}: expected a folder, found "
                             f"{'nothing' if not os.path.lexists(top) else 'something else'}",
                             hint="give the folder whose files to carry; nothing was written")
        picked += [_source_file(path, title, "--files") for path, title in _walk(top)]
    for value in files:
        path, name = _file_arg(value)
        if not os.path.lexists(path):
            raise UsageError(f"exporting --file {path}: expected a file, found nothing", hint="nothing was written")
        picked.append(_source_file(path, name, "--file"))
    for f in picked:
        if f.title in found:
            raise UsageError(f"exporting files: expected each name once, found {f.title!r} from {found[f.title].path} "
                             f"and {f.path}", hint="give one of them another name with --file PATH=NAME; nothing "
                             "was written")
        found[f.title] = f
    folders = {"/".join(t.split("/")[:n]) for t in found for n in range(1, t.count("/") + 1)}
    clash = sorted(set(found) & folders)
    if clash:
        raise UsageError(f"exporting files: expected {clash[0]!r} to be a file or a folder, found both",
                         hint="rename one of them with --file PATH=NAME; nothing was written")
    if not found:
        raise UsageError(f"exporting --files {', '.join(dirs)}: expected at least one regular file, found none",
                         hint="nothing was written")
    held = merge_held_files(have) if have else None  # --have: a file delta (3.8) leaves out what is held
    return FileSet(ref, tuple(sorted(found.values(), key=lambda f: f.title)), model, held)


def _check_ref(ref: Optional[str]) -> str:
    if not ref:
        raise UsageError("exporting files: expected --artifact-ref NAME:TAG (the name the files carry in the bundle, "
                         "like an image's), found none", hint="e.g. --artifact-ref models/llama:3.1")
    _, tag, digest = split_reference(ref)
    if not valid_ref(ref) or not tag or digest:
        raise UsageError(f"exporting with --artifact-ref {ref!r}: expected NAME:TAG such as models/llama:3.1",
                         hint="a name and a tag, no digest (the digest is the artifact's own)")
    return ref


def _layer(f: SourceFile, blob: BlobRef, model: bool) -> Dict[str, object]:
    notes = {TITLE_ANNOTATION: f.title, MODE_ANNOTATION: mode_text(f.mode)}
    if model:
        notes[MODEL_FILEPATH_ANNOTATION] = f.title
    return {**blob.to_dict(), "annotations": notes}


def _model_config(fs: FileSet, layers: Sequence[BlobRef]) -> bytes:
    """The ModelPack config: name and version from the ref, the weights' format when they share one,
    ``modelfs`` the raw layers' digests (a raw layer is its own diff_id). No clock: the same files
    give the same artifact digest."""
    name, tag, _ = split_reference(fs.ref)
    formats = {_WEIGHT_FORMATS.get(os.path.splitext(f.title)[1].lower(), "") for f in fs.files
               if model_media_type(f.title) == MODEL_WEIGHT}
    config: Dict[str, object] = {"format": formats.pop()} if len(formats) == 1 and "" not in formats else {}
    doc = {"descriptor": {"name": name, "version": tag}, "config": config,
           "modelfs": {"type": "layers", "diff_ids": [str(b.digest) for b in layers]}}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _hash(src: BinaryIO) -> Tuple[Digest, int]:
    hasher, size = hashlib.sha256(), 0
    for chunk in iter(lambda: src.read(CHUNK), b""):
        hasher.update(chunk)
        size += len(chunk)
    return Digest("sha256", hasher.hexdigest()), size


def carry_files(store: BlobStore, fs: Optional[FileSet], on_bytes: Optional[ProgressFn] = None
                ) -> Tuple[FileArtifact, ...]:
    """The artifact of ``fs`` written into ``store`` (none without files)."""
    return (write_artifact(store, fs, on_bytes=on_bytes),) if fs is not None else ()


def write_artifact(store: BlobStore, fs: FileSet, *, on_bytes: Optional[ProgressFn] = None) -> FileArtifact:
    """Every file of ``fs`` into ``store`` as a raw layer, then the config and the manifest."""
    carried: List[CarriedFile] = []
    sizes = fs.held.sizes() if fs.held is not None else set()
    for f in fs.files:
        media_type = model_media_type(f.title) if fs.model else OCTET_STREAM
        fd = os.open(f.path, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):  # changed into something else since the scan
                raise _refuse("--files", f.path, "something that is no longer a regular file", "nothing was written")
            if fs.held is not None and f.size in sizes:  # only a file of a held size can be held: hash it first
                digest, size = _hash(src)
                if fs.held.holds(f.title, digest, size):  # the far side has it: named, not stored (3.8)
                    if on_bytes is not None:
                        on_bytes(size)
                    carried.append(CarriedFile(f.title, BlobRef(media_type, digest, size), f.mode, external=True))
                    continue
                src.seek(0)
            written = store.write_raw(src, on_bytes=on_bytes)
        carried.append(CarriedFile(f.title, BlobRef(media_type, written.digest, written.size), f.mode))
    blobs = [c.blob for c in carried]
    raw_config = _model_config(fs, blobs) if fs.model else EMPTY_JSON
    cfg = store.write_bytes(raw_config)
    config = BlobRef(MODEL_CONFIG if fs.model else OCI_EMPTY, cfg.digest, cfg.size)
    artifact_type = MODEL_ARTIFACT_TYPE if fs.model else FILES_ARTIFACT_TYPE
    manifest_doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                    "config": config.to_dict(),
                    "layers": [_layer(f, c.blob, fs.model) for f, c in zip(fs.files, carried)]}
    raw_manifest = json.dumps(manifest_doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    written_manifest = store.write_bytes(raw_manifest)
    # a held file whose bytes the bundle stores anyway (under another title, an image's blob): not left out
    carried = [CarriedFile(c.title, c.blob, c.mode) if c.external and c.blob.digest.blob_path in store.written
               else c for c in carried]
    return FileArtifact(fs.ref, artifact_type, BlobRef(OCI_MANIFEST, written_manifest.digest, written_manifest.size),
                        config, tuple(carried))



class NoImages(SourceBase):
    """The source of an export of files alone (no IMAGE): it answers and resolves no image."""

    kind = "files"

    def info(self) -> SourceInfo:
        return SourceInfo("files", {})

    def check_refs(self, refs: Sequence[str], selection: Selection) -> CheckedRefs:
        return CheckedRefs(0)  # resolve() (SourceBase's): no image, so the export loop carries none
