"""bundle.json: the bundle manifest, its models and its stdlib structural checks.

``schemas/bundle/v3.schema.json`` is normative; :func:`check_structure` is the stdlib mirror of
it used on the offline host (the tests run both on the same golden files).
Readers accept the same major with any minor and ignore unknown fields; a newer major is
refused with guidance.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from importer import SCHEMA_MAJOR
from importer.errors import ManifestError, UnsupportedSchemaVersion
from importer.format.artifacts import ArtifactRecord, check_artifacts, derived_tag
from importer.format.digest import BlobRef as BlobRef  # the descriptor type: defined beside Digest
from importer.format.digest import Digest, is_digest
from importer.format.fileartifacts import FileArtifact, check_file_artifacts
from importer.format.limits import parse_json
from importer.format.mediatypes import LAYER_TYPES, OCI_LAYER_TAR
from importer.format.reference import split_reference

BUNDLE_MEDIA_TYPE = "application/vnd.sneakernet.bundle.v3+json"
BUNDLE_JSON = "bundle.json"
SUMS_FILE = "SHA256SUMS"
SIGNATURE_FILE = "bundle.json.sig"
IMPORTER_PYZ = "bundle-import.pyz"

_VERSION_RE = re.compile(r"(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})")
# OCI ref.name grammar (image-spec annotations.md), plus a bound on the length.
_REF_RE = re.compile(r"[A-Za-z0-9]+(?:(?:[-._:@+]|--)[A-Za-z0-9]+)*(?:/[A-Za-z0-9]+(?:(?:[-._:@+]|--)[A-Za-z0-9]+)*)*")
MAX_REF = 1024


@dataclass(frozen=True)
class LayerRecord:
    media_type: str
    digest: Digest
    size: int
    diff_id: Digest
    uncompressed_size: int
    #: Not stored in this (delta) bundle: the offline host must already hold it. Described either
    #: uncompressed (digest = diff_id, mediaType tar) or as the compressed blob the host holds.
    external: bool = False

    @property
    def names_compressed_blob(self) -> bool:
        """True when the descriptor names a compressed blob (not the uncompressed tar by diff_id)."""
        return self.digest != self.diff_id

    def to_dict(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": str(self.digest),
            "size": self.size,
            "diffId": str(self.diff_id),
            "uncompressedSize": self.uncompressed_size,
        }
        if self.external:
            doc["external"] = True
        return doc


@dataclass(frozen=True)
class ImageRecord:
    refs: Tuple[str, ...]
    manifest: BlobRef
    config: BlobRef
    layers: Tuple[LayerRecord, ...]
    platform: Dict[str, str] = field(default_factory=dict)
    #: what messages call the image when ``refs`` are stand-ins (the importer's staging tags)
    label: str = field(default="", compare=False)
    #: schema 3.2, a multi-platform image: the source's image index, byte for byte (its digest
    #: survives), and the other platforms carried beside this one (the primary: the exporting
    #: host's platform when carried). Each other record has no refs of its own.
    index: Optional[BlobRef] = None
    others: Tuple[ImageRecord, ...] = ()
    #: schema 3.4: the image's CUDA needs (importer/format/cudafit.py ImageNeeds.to_dict;
    #: docs/gpu-fit.md); None when the image declares none or the bundle is older
    cuda: Optional[Dict[str, Any]] = field(default=None, compare=False)
    #: schema 3.5: what the source registry attached to the image (signatures, attestations,
    #: SBOMs, referrers), carried byte for byte (importer/format/artifacts.py)
    artifacts: Tuple[ArtifactRecord, ...] = ()

    @property
    def name(self) -> str:
        """How to call this image in messages: its label or first ref, else its config digest."""
        return self.label or (self.refs[0] if self.refs else self.config.digest.short)

    @property
    def variants(self) -> Tuple[ImageRecord, ...]:
        """This record and every other platform carried with it."""
        return (self, *self.others)

    def platform_text(self) -> str:
        return "/".join(self.platform[k] for k in ("os", "architecture", "variant") if self.platform.get(k)) or "?"

    def to_dict(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {
            "refs": list(self.refs),
            "platform": dict(self.platform),
            "manifest": self.manifest.to_dict(),
            "config": self.config.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
        }
        if self.index is not None:
            doc["index"] = self.index.to_dict()
        if self.others:
            doc["platforms"] = [{k: v for k, v in other.to_dict().items() if k != "refs"} for other in self.others]
        if self.cuda is not None:
            doc["cuda"] = dict(self.cuda)
        if self.artifacts:
            doc["artifacts"] = [a.to_dict() for a in self.artifacts]
        return doc


@dataclass(frozen=True)
class FileRecord:
    path: str
    digest: Digest
    size: int

    def to_dict(self) -> Dict[str, Any]:
        return {"path": self.path, "digest": str(self.digest), "size": self.size}


@dataclass(frozen=True)
class BundleManifest:
    schema_version: str
    created: str
    tool_version: str
    source: Dict[str, Any]
    importer: Optional[FileRecord]
    images: Tuple[ImageRecord, ...]
    files: Tuple[FileRecord, ...]
    extra: Dict[str, Any] = field(default_factory=dict)
    #: schema 3.6: files carried as OCI artifacts (importer/format/fileartifacts.py; docs/files.md)
    file_artifacts: Tuple[FileArtifact, ...] = ()

    @property
    def major(self) -> int:
        return int(self.schema_version.split(".")[0])

    @property
    def minor(self) -> int:
        return int(self.schema_version.split(".")[1])

    @property
    def may_be_delta(self) -> bool:
        """Schema 3.1 and later may leave layers out (``external``); 3.0 is always a full bundle."""
        return (self.major, self.minor) >= (3, 1)

    def records(self) -> List[ImageRecord]:
        """Every image record, the other platforms of multi-platform images (3.2) included."""
        return [variant for image in self.images for variant in image.variants]

    @property
    def multi_platform(self) -> bool:
        return any(image.others or image.index is not None for image in self.images)

    def unique_layers(self) -> List[LayerRecord]:
        """Every distinct layer, stored or external (of every carried platform)."""
        seen: Dict[Digest, LayerRecord] = {}
        for image in self.records():
            for layer in image.layers:
                seen.setdefault(layer.digest, layer)
        return list(seen.values())

    def stored_layers(self) -> List[LayerRecord]:
        return [x for x in self.unique_layers() if not x.external]

    def stored_layer_paths(self) -> Set[str]:
        """The bundle paths of the layer blobs it holds: what a verification that leaves the
        layers to the load stream (``defer_layers``) does not read, and does not count."""
        return {x.digest.blob_path for x in self.stored_layers()}

    def external_layers(self) -> List[LayerRecord]:
        """Layers a delta bundle leaves out: the host must hold them (by diff_id)."""
        return [x for x in self.unique_layers() if x.external]

    @property
    def is_delta(self) -> bool:
        return any(x.external for x in self.unique_layers())

    @property
    def holds_file_deltas(self) -> bool:
        """3.8: an artifact of files leaves out a file the far side holds."""
        return any(a.held_files() for a in self.file_artifacts)

    def compressed_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def uncompressed_bytes(self) -> int:
        return sum(layer.uncompressed_size for layer in self.unique_layers())

    def to_dict(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {
            "schemaVersion": self.schema_version,
            "mediaType": BUNDLE_MEDIA_TYPE,
            "created": self.created,
            "tool": {"name": "sneakernet", "version": self.tool_version},
            "source": self.source,
        }
        if self.importer is not None:
            doc["importer"] = self.importer.to_dict()
        doc["images"] = [image.to_dict() for image in self.images]
        if self.file_artifacts:
            doc["artifacts"] = [a.to_dict() for a in self.file_artifacts]
        doc["files"] = [f.to_dict() for f in self.files]
        for key, value in self.extra.items():
            doc.setdefault(key, value)
        return doc


def parse_schema_version(doc: Any) -> Tuple[int, int]:
    value = doc.get("schemaVersion") if isinstance(doc, dict) else None
    if not isinstance(value, str) or _VERSION_RE.fullmatch(value) is None:
        raise ManifestError(
            f"reading bundle.json: expected schemaVersion 'MAJOR.MINOR', found {value!r}",
            hint="this is not a sneakernet bundle, or its bundle.json was damaged",
        )
    major, minor = value.split(".")
    return int(major), int(minor)


def safe_relpath(path: Any) -> bool:
    """True for a normalized relative POSIX path inside the bundle (no '..', no absolute)."""
    if not isinstance(path, str) or not path or len(path) > 4096:
        return False
    if path.startswith("/") or "\\" in path or "\x00" in path or "\n" in path:
        return False
    if posixpath.normpath(path) != path:
        return False
    return not any(part in ("..", ".", "") for part in path.split("/"))


def valid_ref(ref: Any) -> bool:
    return isinstance(ref, str) and len(ref) <= MAX_REF and _REF_RE.fullmatch(ref) is not None


class _Checker:
    def __init__(self) -> None:
        self.issues: List[str] = []

    def fail(self, where: str, msg: str) -> None:
        self.issues.append(f"{where}: {msg}")

    def obj(self, value: Any, where: str) -> Dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, f"expected an object, found {type(value).__name__}")
            return {}
        return value

    def lst(self, value: Any, where: str) -> List[Any]:
        if not isinstance(value, list):
            self.fail(where, f"expected an array, found {type(value).__name__}")
            return []
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            self.fail(where, f"expected a string, found {type(value).__name__}")
            return ""
        return value

    def size(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(where, f"expected a non-negative integer, found {value!r}"[:200])
            return 0
        return value

    def digest(self, value: Any, where: str) -> Optional[Digest]:
        if not is_digest(value):
            self.fail(where, f"expected 'sha256:' + 64 lowercase hex, found {value!r}"[:200])
            return None
        return Digest.parse(value)

    def blobref(self, value: Any, where: str) -> Optional[BlobRef]:
        d = self.obj(value, where)
        mt = self.string(d.get("mediaType"), f"{where}.mediaType")
        dg = self.digest(d.get("digest"), f"{where}.digest")
        sz = self.size(d.get("size"), f"{where}.size")
        return BlobRef(mt, dg, sz) if dg is not None else None

    def filerecord(self, value: Any, where: str) -> Optional[FileRecord]:
        d = self.obj(value, where)
        path = d.get("path")
        if not safe_relpath(path):
            self.fail(f"{where}.path", f"expected a relative path inside the bundle, found {path!r}"[:300])
            path = None
        dg = self.digest(d.get("digest"), f"{where}.digest")
        sz = self.size(d.get("size"), f"{where}.size")
        if path is None or dg is None:
            return None
        return FileRecord(path, dg, sz)


def check_structure(doc: Any) -> Tuple[Optional[BundleManifest], List[str]]:
    """Check a schema-3 bundle.json document; returns (model or None, every issue found)."""
    c = _Checker()
    top = c.obj(doc, "bundle.json")
    version = c.string(top.get("schemaVersion"), "schemaVersion")
    if top.get("mediaType") != BUNDLE_MEDIA_TYPE:
        c.fail("mediaType", f"expected {BUNDLE_MEDIA_TYPE!r}, found {top.get('mediaType')!r}"[:200])
    created = c.string(top.get("created"), "created")
    tool = c.obj(top.get("tool"), "tool")
    c.string(tool.get("name"), "tool.name")
    tool_version = c.string(tool.get("version"), "tool.version")
    source = c.obj(top.get("source"), "source")
    importer_rec = None
    if "importer" in top:
        importer_rec = c.filerecord(top.get("importer"), "importer")
    images: List[ImageRecord] = []
    all_refs: Set[str] = set()
    raw_images = c.lst(top.get("images"), "images")
    file_artifacts = check_file_artifacts(c.fail, top["artifacts"]) if "artifacts" in top else ()
    listed_artifacts = top.get("artifacts")  # as the schema's anyOf: a non-empty list, valid or not (its own
    # problems are reported apart)
    if "images" in top and not raw_images and not (isinstance(listed_artifacts, list) and listed_artifacts):
        c.fail("images", "expected at least one image (or, 3.6, an artifact of files), found none")
    for i, raw in enumerate(raw_images):
        image = _check_image(c, raw, f"images[{i}]", all_refs)
        if image is not None:
            images.append(image)
    _check_artifact_refs(c, file_artifacts, all_refs)
    files = _check_files(c, c.lst(top.get("files"), "files"))
    _check_listed(c, images, files, importer_rec, file_artifacts)
    _check_artifact_tags(c, images, file_artifacts)
    _check_held_files(c, version, files, file_artifacts)
    if c.issues:
        return None, c.issues
    model = BundleManifest(
        schema_version=version,
        created=created,
        tool_version=tool_version,
        source=dict(source),
        importer=importer_rec,
        images=tuple(images),
        files=tuple(files),
        extra={k: v for k, v in top.items() if k not in _KNOWN_KEYS},
        file_artifacts=file_artifacts,
    )
    return model, []


def _check_artifact_refs(c: _Checker, artifacts: Tuple[FileArtifact, ...], all_refs: Set[str]) -> None:
    """3.6: an artifact of files is named NAME:TAG, like an image, and no image or other artifact of the
    bundle has that name (index.json names each once)."""
    for i, art in enumerate(artifacts):
        _, tag, digest = split_reference(art.ref)
        if not valid_ref(art.ref) or not tag or digest:
            c.fail(f"artifacts[{i}].ref", f"expected NAME:TAG such as models/llama:3.1, found {art.ref!r}"[:300])
        elif art.ref in all_refs:
            c.fail(f"artifacts[{i}].ref", f"expected each ref once in the bundle, found {art.ref!r} again")
        all_refs.add(art.ref)


def _check_image(c: _Checker, raw: Any, where: str, all_refs: Set[str]) -> Optional[ImageRecord]:
    """One entry of ``images``; ``all_refs`` collects the refs so far (each ref once per bundle)."""
    img = c.obj(raw, where)
    refs = c.lst(img.get("refs"), f"{where}.refs")
    for j, ref in enumerate(refs):
        if not valid_ref(ref):
            c.fail(f"{where}.refs[{j}]", f"expected an image reference, found {ref!r}"[:300])
    platform_raw = c.obj(img.get("platform", {}), f"{where}.platform")
    for key, value in platform_raw.items():
        if not isinstance(value, str):
            c.fail(f"{where}.platform.{key}", f"expected a string, found {type(value).__name__}")
    platform = {str(k): v for k, v in platform_raw.items() if isinstance(v, str)}
    manifest = c.blobref(img.get("manifest"), f"{where}.manifest")
    config = c.blobref(img.get("config"), f"{where}.config")
    layers: List[LayerRecord] = []
    for k, raw_layer in enumerate(c.lst(img.get("layers"), f"{where}.layers")):
        layer = _check_layer(c, raw_layer, f"{where}.layers[{k}]")
        if layer is not None:
            layers.append(layer)
    for j, ref in enumerate(refs):
        if not isinstance(ref, str):
            continue
        if ref in all_refs:
            c.fail(f"{where}.refs[{j}]", f"expected each ref once in the bundle, found {ref!r} again")
        all_refs.add(ref)
    if manifest is None or config is None:
        return None
    index = c.blobref(img["index"], f"{where}.index") if "index" in img else None
    others: List[ImageRecord] = []
    for k, raw_other in enumerate(c.lst(img.get("platforms", []), f"{where}.platforms")):
        entry = c.obj(raw_other, f"{where}.platforms[{k}]")
        if "refs" in entry:  # the image's refs name its index; a platform has none of its own
            c.fail(f"{where}.platforms[{k}].refs", "expected no refs in one platform's entry (the image's refs "
                   "name them all), found some")
        other = _check_image(c, {**entry, "refs": []}, f"{where}.platforms[{k}]", set())
        if other is not None:
            if not (other.platform.get("os") and other.platform.get("architecture")):
                c.fail(f"{where}.platforms[{k}].platform", "expected os and architecture (which platform this is), "
                       f"found {other.platform!r}"[:300])
            if other.index is not None or other.others:
                c.fail(f"{where}.platforms[{k}]", "expected one platform's manifest, config and layers, "
                       "found an index or platforms inside it")
            others.append(other)
    cuda = _check_cuda(c, img["cuda"], f"{where}.cuda") if "cuda" in img else None
    artifacts = check_artifacts(c.fail, img["artifacts"], f"{where}.artifacts") if "artifacts" in img else ()
    _check_subjects(c, artifacts, [manifest, *(o.manifest for o in others)] + ([index] if index else []),
                    f"{where}.artifacts")
    return ImageRecord(tuple(refs), manifest, config, tuple(layers), platform, index=index, others=tuple(others),
                       cuda=cuda, artifacts=artifacts)


def _check_subjects(c: _Checker, artifacts: Tuple[ArtifactRecord, ...], manifests: List[BlobRef],
                    where: str) -> None:
    """Each artifact is about this image: its subject is one of the image's manifests, its index, or
    the index one platform was picked from (a record of kind ``index``, subject itself)."""
    own = {m.digest for m in manifests} | {a.manifest.digest for a in artifacts
                                            if a.kind == "index" and a.subject == a.manifest.digest}
    for k, art in enumerate(artifacts):
        if art.subject not in own:
            c.fail(f"{where}[{k}].subject", f"expected a manifest or index of this image, found {art.subject}")


def _check_held_files(c: _Checker, version: str, files: List[FileRecord],
                      artifacts: Tuple[FileArtifact, ...]) -> None:
    """3.8: a file marked ``external`` (a file delta) is in a 3.8 or later bundle and is not listed in
    ``files`` (it is not stored: its bytes are on the far side, checked there when it is written)."""
    listed = {f.path for f in files}
    found = _VERSION_RE.fullmatch(version or "")
    old = found is not None and (int(found.group(1)), int(found.group(2))) < (3, 8)
    for i, art in enumerate(artifacts):
        for k, f in enumerate(art.files):
            if not f.external:
                continue
            if old:
                c.fail(f"artifacts[{i}].files[{k}].external", f"expected schemaVersion 3.8 or later for a file left "
                       f"out (a file delta), found {version}")
            if f.blob.digest.blob_path in listed:
                c.fail(f"artifacts[{i}].files[{k}].external", f"expected a held file not listed in files, found "
                       f"{f.blob.digest.blob_path} listed")


def _check_artifact_tags(c: _Checker, images: List[ImageRecord], files: Tuple[FileArtifact, ...] = ()) -> None:
    """No image (nor, 3.6, artifact of files) is tagged with a name an attached artifact is handed on
    under (``sha256-<hex>.sig``...): handing the attached artifact on would move that tag."""
    derived = {derived_tag(a.kind, a.subject) for img in images for a in img.artifacts if a.tag}
    derived |= {derived_tag(s.kind, s.subject) for art in files for s in art.signatures}  # 3.7
    named = [(f"images[{i}].refs[{j}]", ref) for i, img in enumerate(images) for j, ref in enumerate(img.refs)]
    named += [(f"artifacts[{i}].ref", art.ref) for i, art in enumerate(files)]
    for where, ref in named:
        if isinstance(ref, str) and split_reference(ref)[1] in derived:
            c.fail(where, f"expected an image tag, found {ref!r}, the name an artifact "
                   "of the bundle is handed on under"[:300])


_CUDA_FIELDS = {"cudaVersion": (str, type(None)), "torchCuda": (str, type(None)), "disableRequire": (bool,),
                "require": (dict,), "compatLibs": (list,)}


def _check_cuda(c: _Checker, raw: Any, where: str) -> Optional[Dict[str, Any]]:
    """Schema 3.4 ``cuda``: an image's CUDA needs (docs/gpu-fit.md); unknown keys are ignored."""
    doc = c.obj(raw, where)
    ok = True
    for key, types in _CUDA_FIELDS.items():
        if key in doc and not isinstance(doc[key], types):
            c.fail(f"{where}.{key}", f"expected {' or '.join(t.__name__ for t in types)}, "
                   f"found {type(doc[key]).__name__}")
            ok = False
    for key, value in (doc.get("require") or {}).items() if isinstance(doc.get("require"), dict) else ():
        if not (isinstance(key, str) and key.startswith("NVIDIA_REQUIRE_") and isinstance(value, str)):
            c.fail(f"{where}.require", f"expected NVIDIA_REQUIRE_* names with string values, found {key!r}"[:300])
            ok = False
    libs = doc.get("compatLibs")
    if isinstance(libs, list) and not all(isinstance(x, str) for x in libs):
        c.fail(f"{where}.compatLibs", "expected a list of driver version strings")
        ok = False
    return dict(doc) if ok and isinstance(raw, dict) else None


def _check_layer(c: _Checker, raw_layer: Any, lw: str) -> Optional[LayerRecord]:
    ld = c.obj(raw_layer, lw)
    mt = c.string(ld.get("mediaType"), f"{lw}.mediaType")
    if mt not in LAYER_TYPES:
        c.fail(f"{lw}.mediaType", f"expected one of {', '.join(LAYER_TYPES)}, found {mt!r}"[:300])
    dg = c.digest(ld.get("digest"), f"{lw}.digest")
    sz = c.size(ld.get("size"), f"{lw}.size")
    did = c.digest(ld.get("diffId"), f"{lw}.diffId")
    usz = c.size(ld.get("uncompressedSize"), f"{lw}.uncompressedSize")
    external = ld.get("external", False)
    if not isinstance(external, bool):
        c.fail(f"{lw}.external", f"expected true or false, found {external!r}"[:200])
        external = False
    if mt == OCI_LAYER_TAR and (dg != did or sz != usz):  # stored or external: its bytes are its diff_id's
        c.fail(lw, "a layer described uncompressed (mediaType tar) has digest = diffId "
               "and size = uncompressedSize")
    if dg is None or did is None:
        return None
    return LayerRecord(mt, dg, sz, did, usz, bool(external))


def _check_files(c: _Checker, raw_files: List[Any]) -> List[FileRecord]:
    """``files``: each path once; a blob path holds the blob of its name."""
    files: List[FileRecord] = []
    seen_paths = set()
    for i, raw in enumerate(raw_files):
        rec = c.filerecord(raw, f"files[{i}]")
        if rec is None:
            continue
        if rec.path.startswith("blobs/sha256/") and rec.path != rec.digest.blob_path:
            c.fail(f"files[{i}]", f"expected {rec.path!r} to hold the blob of its name, found digest {rec.digest}")
        if rec.path in seen_paths:
            c.fail(f"files[{i}].path", f"expected each path once, found {rec.path!r} again")
        seen_paths.add(rec.path)
        files.append(rec)
    return files


def _check_listed(c: _Checker, images: List[ImageRecord], files: List[FileRecord],
                  importer_rec: Optional[FileRecord], file_artifacts: Tuple[FileArtifact, ...] = ()) -> None:
    """Every blob an image or an artifact of files names (but external layers) and the importer
    are listed in ``files``, with the same size."""
    by_path = {f.path: f for f in files}
    for i, art in enumerate(file_artifacts):
        for ref in art.stored_blobs():  # 3.8: a held (external) file has no entry
            listed = by_path.get(ref.digest.blob_path)
            if listed is None:
                c.fail(f"artifacts[{i}]", f"blob {ref.digest} is not listed in files")
            elif listed.size != ref.size:
                c.fail(f"artifacts[{i}]", f"size {ref.size} of blob {ref.digest} differs from files entry "
                       f"({listed.size})")
    for i, img in enumerate(images):
        blobs = [("index", img.index)] if img.index is not None else []
        for n, img_rec in enumerate(img.variants):
            at = f"platforms[{n - 1}]." if n else ""
            blobs += [(f"{at}manifest", img_rec.manifest), (f"{at}config", img_rec.config)]
            blobs += [(f"{at}layers[{k}]", BlobRef(lr.media_type, lr.digest, lr.size))
                      for k, lr in enumerate(img_rec.layers) if not lr.external]
        blobs += [(f"artifacts[{k}]", BlobRef(b.media_type, b.digest, b.size))
                  for k, art in enumerate(img.artifacts) for b in art.every_blob()]
        for what, ref in blobs:
            listed = by_path.get(ref.digest.blob_path)
            if listed is None:
                c.fail(f"images[{i}].{what}", f"blob {ref.digest} is not listed in files")
            elif listed.size != ref.size:
                c.fail(f"images[{i}].{what}", f"size {ref.size} differs from files entry ({listed.size})")
    if importer_rec is not None and importer_rec.path not in by_path:
        c.fail("importer.path", f"{importer_rec.path!r} is not listed in files")
    elif importer_rec is not None and by_path[importer_rec.path] != importer_rec:
        c.fail("importer", "digest or size differs from its files entry")


_KNOWN_KEYS = {"schemaVersion", "mediaType", "created", "tool", "source", "importer", "images", "files", "artifacts"}


def load_bundle_manifest(raw: bytes, *, where: str = BUNDLE_JSON) -> BundleManifest:
    """Parse bundle.json bytes (already read with a bound) into the latest model. A run of
    ``bundle-import`` reads them through importer/input/opened.py ``OpenedBundle.manifest``, which
    parses them once (:func:`bundle_manifest_of`)."""
    return bundle_manifest_of(parse_json(raw, where), where=where)


def bundle_manifest_of(doc: Any, *, where: str = BUNDLE_JSON) -> BundleManifest:
    """bundle.json's parsed JSON document into the latest model (its schema 3 rules checked)."""
    major, minor = parse_schema_version(doc)
    if major > SCHEMA_MAJOR:
        raise UnsupportedSchemaVersion(
            f"reading {where}: expected bundle schema {SCHEMA_MAJOR}.x or older, "
            f"found {major}.{minor}",
            hint=f"use the importer shipped inside that bundle: python3 <bundle>/{IMPORTER_PYZ} <bundle> --verify",
        )
    if major < SCHEMA_MAJOR:
        raise UnsupportedSchemaVersion(
            f"reading {where}: schema {major}.{minor} bundles are not readable by this importer yet",
            hint=f"use the importer shipped inside that bundle: python3 <bundle>/{IMPORTER_PYZ} <bundle>",
        )
    model, issues = check_structure(doc)
    if model is None:
        raise ManifestError(
            f"reading {where}: expected a valid schema-{major} bundle manifest, found {len(issues)} problem(s)",
            context="\n".join(issues[:50]),
            hint="the bundle was modified or damaged; re-copy it or re-export it",
        )
    return model
