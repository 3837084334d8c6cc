"""bundle.json's top-level ``artifacts`` (schema 3.6): files carried as OCI artifacts.

``bundle export --files DIR`` / ``--file PATH[=NAME]`` packs files (model weights, datasets, any
file) as one OCI artifact, the way oras, hauler and CNCF ModelPack do: an OCI image manifest with
an ``artifactType``, one raw layer per file (no tar, no compression: the layer digest is what
``sha256sum FILE`` prints), each layer named by its ``org.opencontainers.image.title`` annotation
(the file's path relative to DIR) and its mode in ``dev.sneakernet.file.mode``. Plain files get
the empty config (``application/vnd.oci.empty.v1+json``, ``{}``); ``--model`` the ModelPack config
and layer types (:func:`model_media_type`). The artifact is named in ``index.json`` under its ref
like an image; bundle.json records, per artifact, its ref, type, manifest, config and every
file (title, media type, digest, size, mode), and lists every blob in ``files`` (so SHA256SUMS
and the importer's verification cover every byte).

``bundle-import BUNDLE --files-to DIR`` writes the files below DIR. A title is a path the
importer joins to DIR, so it is checked here, when bundle.json is parsed, before anything is
written (:func:`title_issue`): relative, normalized, no ``..``/``.``/empty segment, no NUL,
control character or backslash, at most :data:`MAX_TITLE` characters (:data:`MAX_SEGMENT` a
name), not the importer's staging folder, each title once in the bundle and none the folder
of another. No field here is evidence of anything: the bytes are pinned by their digests.

Schema 3.8 (file deltas, ``bundle export --have``): a file whose digest the far side holds is
``external``: in the artifact's manifest like every file (the artifact's digest does not change),
but not stored in the bundle nor listed in ``files``; ``--files-to DIR`` finds it at its title
with its digest (read to check) or refuses before writing (exit 9)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from importer.format.artifacts import ArtifactRecord, check_blob_ref, check_file_signatures
from importer.format.digest import BlobRef

OCI_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
FILES_ARTIFACT_TYPE = "application/vnd.sneakernet.files.v1"  # plain files (--files/--file without --model)
OCTET_STREAM = "application/octet-stream"  # a plain file's layer
MODEL_ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODEL_WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
MODEL_WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
MODEL_DOC = "application/vnd.cncf.model.doc.v1.raw"
MODEL_CODE = "application/vnd.cncf.model.code.v1.raw"
MODEL_DATASET = "application/vnd.cncf.model.dataset.v1.raw"
TITLE_ANNOTATION = "org.opencontainers.image.title"
MODEL_FILEPATH_ANNOTATION = "org.cncf.model.filepath"
MODE_ANNOTATION = "dev.sneakernet.file.mode"
#: the folder of DIR the importer stages files in (a title may not start with it)
STAGING_PREFIX = ".sneakernet-staging-"

MAX_ARTIFACTS = 64  # per bundle
MAX_FILES = 100_000  # per artifact
MAX_TITLE = 4096
MAX_SEGMENT = 255  # NAME_MAX of Linux file systems
MAX_TEXT = 1024
_MODE_RE = re.compile(r"0[0-7]{3}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: ``--model``: what a file is, by its name (first match wins; everything else is code)
_WEIGHT_EXT = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ggml", ".onnx", ".h5", ".msgpack",
               ".tflite", ".mlmodel", ".pb", ".npz", ".npy", ".pkl", ".model", ".nemo", ".engine", ".plan")
_CONFIG_NAMES = ("config.json", "generation_config.json", "preprocessor_config.json", "special_tokens_map.json",
                 "vocab.json", "vocab.txt", "merges.txt", "added_tokens.json", "chat_template.json",
                 "chat_template.jinja", "params.json", "adapter_config.json")
_DOC_EXT = (".md", ".rst", ".txt", ".pdf", ".html")
_DATASET_EXT = (".parquet", ".arrow", ".jsonl", ".csv", ".tsv")


def model_media_type(title: str) -> str:
    """The ModelPack layer type of a file (``--model``), by its name: weights by extension
    (``.safetensors .bin .pt .pth .ckpt .gguf .ggml .onnx .h5 .msgpack ...``, and
    ``*.safetensors.index.json``), the weights' config (``config.json``, ``generation_config.json``,
    ``tokenizer*``, ``vocab*``, ``merges.txt``, ...), docs (``README*``, ``LICENSE*``, ``NOTICE*``,
    ``*.md``, ``*.txt``, ...), datasets (``.parquet .arrow .jsonl .csv .tsv``), else code."""
    name = posixpath.basename(title).lower()
    if name.endswith(".index.json") and (".safetensors" in name or ".bin" in name):
        return MODEL_WEIGHT_CONFIG  # the weight map of sharded weights
    if name.endswith(_WEIGHT_EXT):
        return MODEL_WEIGHT
    if name in _CONFIG_NAMES or name.startswith(("tokenizer", "vocab")):
        return MODEL_WEIGHT_CONFIG
    if name.startswith(("readme", "license", "licence", "notice", "copying", "model_card", "modelcard")) \
            or name.endswith(_DOC_EXT):
        return MODEL_DOC
    if name.endswith(_DATASET_EXT):
        return MODEL_DATASET
    return MODEL_CODE


def title_issue(title: Any) -> Optional[str]:
    """Why ``title`` cannot be a file's path below the target folder; None when it can."""
    if not isinstance(title, str) or not title:
        return "expected a non-empty string"
    if len(title) > MAX_TITLE:
        return f"expected at most {MAX_TITLE} characters, found {len(title)}"
    if title.startswith("/"):
        return "expected a relative path, found an absolute one"
    if "\\" in title or _CONTROL.search(title):
        return "expected no backslash, NUL or control character"
    segments = title.split("/")
    if any(s in ("", ".", "..") for s in segments) or posixpath.normpath(title) != title:
        return "expected a normalized path (no '..', '.' or empty segment)"
    if any(len(s) > MAX_SEGMENT for s in segments):
        return f"expected each name at most {MAX_SEGMENT} characters"
    if segments[0].startswith(STAGING_PREFIX):
        return f"expected a name that is not the importer's staging folder ({STAGING_PREFIX}*)"
    return None


def mode_text(mode: int) -> str:
    """A file's permission bits as bundle.json and the annotation write them: ``0644``."""
    return f"0{mode & 0o777:03o}"


@dataclass(frozen=True)
class CarriedFile:
    """One file of an artifact: its path below the target folder, its raw layer, its mode."""

    title: str
    blob: BlobRef
    mode: int = 0o644
    #: 3.8: not stored in this (delta) bundle: the far side holds it (``bundle export --have``)
    external: bool = False

    def to_dict(self) -> Dict[str, Any]:
        doc = {"title": self.title, **self.blob.to_dict(), "mode": mode_text(self.mode)}
        if self.external:
            doc["external"] = True
        return doc


@dataclass(frozen=True)
class FileArtifact:
    """One OCI artifact of files (schema 3.6): its ref in index.json, its type, manifest, config
    and files in the manifest's layer order."""

    ref: str
    artifact_type: str
    manifest: BlobRef
    config: BlobRef
    files: Tuple[CarriedFile, ...]
    #: 3.7: cosign signatures of the manifest (records as 3.5's, subject the manifest; docs/files.md)
    signatures: Tuple[ArtifactRecord, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        doc = {"ref": self.ref, "artifactType": self.artifact_type, "manifest": self.manifest.to_dict(),
               "config": self.config.to_dict(), "files": [f.to_dict() for f in self.files]}
        if self.signatures:
            doc["signatures"] = [s.to_dict() for s in self.signatures]
        return doc

    def every_blob(self) -> Tuple[BlobRef, ...]:
        return (self.manifest, self.config, *(f.blob for f in self.files), *self.signature_blobs())

    def signature_blobs(self) -> Tuple[BlobRef, ...]:
        """The blobs of its signatures (3.7): each signature manifest and what it holds."""
        return tuple(b for s in self.signatures for b in s.every_blob())

    def stored_blobs(self) -> Tuple[BlobRef, ...]:
        """The blobs this bundle holds: every blob but held (``external``, 3.8) files'."""
        return (self.manifest, self.config, *(f.blob for f in self.files if not f.external), *self.signature_blobs())

    def held_files(self) -> Tuple[CarriedFile, ...]:
        """The files a delta (3.8) leaves out: the far side holds them."""
        return tuple(f for f in self.files if f.external)

    @property
    def size(self) -> int:
        return sum(f.blob.size for f in self.files)


Fail = Callable[[str, str], None]


def _text(fail: Fail, value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        fail(where, f"expected a non-empty string (at most {MAX_TEXT} characters), found {value!r}"[:200])
        return ""
    return value


def _file(fail: Fail, raw: Any, where: str) -> Optional[CarriedFile]:
    blob = check_blob_ref(fail, raw, where)
    if not isinstance(raw, dict):
        return None
    issue = title_issue(raw.get("title"))
    if issue is not None:
        fail(f"{where}.title", f"{issue}, found {raw.get('title')!r}"[:300])
    mode = raw.get("mode")
    if not isinstance(mode, str) or _MODE_RE.fullmatch(mode) is None:
        fail(f"{where}.mode", f"expected permission bits such as '0644' (at most 0777), found {mode!r}"[:200])
        return None
    external = raw.get("external", False)
    if not isinstance(external, bool):
        fail(f"{where}.external", f"expected true or false, found {external!r}"[:200])
        return None
    if blob is None or issue is not None:
        return None
    return CarriedFile(raw["title"], blob, int(mode, 8), external)


def check_file_artifacts(fail: Fail, raw: Any, where: str = "artifacts") -> Tuple[FileArtifact, ...]:
    """bundle.json's top-level ``artifacts``; every problem goes to ``fail(where, message)``.
    Titles are checked across every artifact: each once, none the folder of another."""
    if not isinstance(raw, list):
        fail(where, f"expected an array, found {type(raw).__name__}")
        return ()
    if not raw or len(raw) > MAX_ARTIFACTS:
        fail(where, f"expected 1 to {MAX_ARTIFACTS} artifacts, found {len(raw)}")
        return ()
    out: List[FileArtifact] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            fail(at, f"expected an object, found {type(item).__name__}")
            continue
        ref = _text(fail, item.get("ref"), f"{at}.ref")
        artifact_type = _text(fail, item.get("artifactType"), f"{at}.artifactType")
        manifest = check_blob_ref(fail, item.get("manifest"), f"{at}.manifest")
        config = check_blob_ref(fail, item.get("config"), f"{at}.config")
        raw_files = item.get("files")
        if not isinstance(raw_files, list) or not raw_files or len(raw_files) > MAX_FILES:
            fail(f"{at}.files", f"expected an array of 1 to {MAX_FILES} files, found {type(raw_files).__name__}"
                 f"{' of ' + str(len(raw_files)) if isinstance(raw_files, list) else ''}")
            raw_files = []
        files = [_file(fail, f, f"{at}.files[{k}]") for k, f in enumerate(raw_files)]
        signatures = check_file_signatures(fail, item["signatures"], f"{at}.signatures",
                                           manifest.digest if manifest else None) if "signatures" in item else ()
        if ref and artifact_type and manifest is not None and config is not None and all(files):
            out.append(FileArtifact(ref, artifact_type, manifest, config, tuple(f for f in files if f), signatures))
    _check_titles(fail, out, where)
    return tuple(out)


def _check_titles(fail: Fail, artifacts: List[FileArtifact], where: str) -> None:
    """Each title once in the bundle (every artifact goes into the same folder), and no title the
    folder of another (``a`` and ``a/b``: a file and a folder of one name)."""
    seen: Dict[str, str] = {}
    for i, art in enumerate(artifacts):
        for k, f in enumerate(art.files):
            at = f"{where}[{i}].files[{k}].title"
            if f.title in seen:
                fail(at, f"expected each title once in the bundle, found {f.title!r} again (first at {seen[f.title]})"
                     [:300])
            seen.setdefault(f.title, at)
    folders: Set[str] = set()
    for title in seen:
        parts = title.split("/")
        folders.update("/".join(parts[:n]) for n in range(1, len(parts)))
    for title, at in seen.items():
        if title in folders:
            fail(at, f"expected a file, found {title!r} also the folder of another title"[:300])
