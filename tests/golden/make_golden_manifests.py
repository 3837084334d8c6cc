#!/usr/bin/env python3
"""Write the golden bundle.json documents under tests/golden/manifests/{valid,invalid}/.

Deterministic: digests are sha256 of fixed labels, no clocks, sorted output. Every invalid
document is one valid document broken in exactly one way. Run from anywhere:

    python3 tests/golden/make_golden_manifests.py          # (re)write the files
    python3 tests/golden/make_golden_manifests.py --check  # exit 1 if they are out of date

Constants are spelled out here on purpose (not imported from importer/): the golden files are
an oracle for both the JSON Schema and importer.format.manifest.check_structure. File-name prefixes of
invalid documents tell tests/test_schemas.py who must reject them (see tests/golden/README.md).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
OUT = HERE / "manifests"

BUNDLE_MEDIA_TYPE = "application/vnd.sneakernet.bundle.v3+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

Doc = Dict[str, Any]


def hexof(label: str) -> str:
    return hashlib.sha256(label.encode("utf-8")).hexdigest()


def digest(label: str) -> str:
    return "sha256:" + hexof(label)


def blob_path(dg: str) -> str:
    return "blobs/sha256/" + dg.split(":", 1)[1]


def layer(label: str, media_type: str, size: int, usize: int) -> Doc:
    """A layer record; one stored uncompressed (tar) is its own diff_id (digest = diffId)."""
    stored = media_type == LAYER_TAR
    return {
        "mediaType": media_type,
        "digest": digest(f"{label} {'tar' if stored else 'blob'}"),
        "size": size,
        "diffId": digest(f"{label} tar"),
        "uncompressedSize": usize,
    }


def image(label: str, refs: List[str], layers: List[Doc], platform: Dict[str, str] | None = None) -> Doc:
    return {
        "refs": refs,
        "platform": {"os": "linux", "architecture": "amd64"} if platform is None else platform,
        "manifest": {"mediaType": OCI_MANIFEST, "digest": digest(f"{label} manifest"),
                     "size": 400 + 93 * len(layers)},
        "config": {"mediaType": OCI_CONFIG, "digest": digest(f"{label} config"), "size": 1469},
        "layers": layers,
    }


def bundle(images: List[Doc], *, with_importer: bool = True, version: str = "3.0",
           artifacts: List[Doc] | None = None) -> Doc:
    """A consistent document: every blob listed in files with its size, files sorted."""
    files: Dict[str, Doc] = {}

    def add(path: str, dg: str, size: int) -> None:
        files[path] = {"path": path, "digest": dg, "size": size}

    for img in images:
        for one in [img, *img.get("platforms", [])]:  # 3.2: every platform carried
            stored = [x for x in one["layers"] if not x.get("external")]  # delta: external layers have no file
            for blob in [one["manifest"], one["config"], *stored]:
                add(blob_path(blob["digest"]), blob["digest"], blob["size"])
        if "index" in img:
            add(blob_path(img["index"]["digest"]), img["index"]["digest"], img["index"]["size"])
        for art in img.get("artifacts", []):  # 3.5: every blob of every attached artifact
            for blob in [art["manifest"], *art["blobs"]]:
                add(blob_path(blob["digest"]), blob["digest"], blob["size"])
    for art in artifacts or []:  # 3.6: files carried as OCI artifacts
        for blob in [art["manifest"], art["config"], *art["files"]]:
            add(blob_path(blob["digest"]), blob["digest"], blob["size"])
    add("index.json", digest("index.json"), 311 * (len(images) + len(artifacts or [])))
    add("oci-layout", digest("oci-layout"), 30)
    importer = {"path": "bundle-import.pyz", "digest": digest("bundle-import.pyz"), "size": 81234}
    if with_importer:
        add(importer["path"], importer["digest"], importer["size"])
    doc: Doc = {
        "schemaVersion": version,
        "mediaType": BUNDLE_MEDIA_TYPE,
        "created": "2024-05-01T12:00:00Z",
        "tool": {"name": "sneakernet", "version": "0.1.0"},
        "source": {"kind": "docker-daemon", "engineVersion": "26.1.5", "storageDriver": "overlay2"},
    }
    if with_importer:
        doc["importer"] = importer
    doc["images"] = images
    if artifacts is not None:
        doc["artifacts"] = artifacts
    doc["files"] = [files[p] for p in sorted(files)]
    return doc


# ---------------------------------------------------------------------------- valid documents

def single_image() -> Doc:
    return bundle([image("app", ["registry.example/team/app:1.0"], [
        layer("app base", LAYER_ZSTD, 2_811_093, 7_372_800),
        layer("app code", LAYER_ZSTD, 10_455, 40_960),
    ])])


def two_images_sharing_a_layer() -> Doc:
    base = layer("shared base", LAYER_ZSTD, 2_811_093, 7_372_800)
    return bundle([
        image("base", ["registry.example/base:2024.05", "base:latest"], [base]),
        image("child", ["registry.example/child:1.0"], [
            copy.deepcopy(base),
            layer("child layer", LAYER_ZSTD, 1_337, 10_240),
        ], platform={"os": "linux", "architecture": "arm64", "variant": "v8"}),
    ])


def untagged_gzip() -> Doc:
    return bundle([image("untagged", [], [
        layer("untagged 1", LAYER_GZIP, 3_004_117, 7_372_800),
        layer("untagged 2", DOCKER_LAYER_GZIP, 120, 2_048),
        layer("untagged 3", LAYER_TAR, 10_240, 10_240),
    ])])


def unknown_extra_fields() -> Doc:
    """A later 3.x minor: unknown fields at every level are ignored by readers."""
    doc = single_image()
    doc["schemaVersion"] = "3.7"
    doc["signing"] = {"keyId": "ed25519:abcd", "required": False}
    doc["comment"] = "fields a later minor version may add"
    doc["tool"]["commit"] = "0123abcd"
    img = doc["images"][0]
    img["annotations"] = {"org.opencontainers.image.source": "https://example.invalid/app"}
    img["platform"]["os.version"] = "10.0.17763.1"
    img["layers"][0]["annotations"] = {"note": "unknown layer field"}
    doc["files"][0]["mode"] = 420
    return doc


def external_layer(label: str, usize: int) -> Doc:
    """A layer a delta bundle leaves out: described uncompressed (tar, digest = diffId)."""
    dg = digest(f"{label} tar")
    return {"mediaType": LAYER_TAR, "digest": dg, "size": usize, "diffId": dg,
            "uncompressedSize": usize, "external": True}


def delta() -> Doc:
    """Schema 3.1: the base layer is external (the offline host holds it), the new one stored."""
    return bundle([image("app v2", ["registry.example/team/app:2.0"], [
        external_layer("app base", 7_372_800),
        layer("app v2 code", LAYER_ZSTD, 11_002, 40_960),
    ])], version="3.1")


def delta_compressed() -> Doc:
    """Schema 3.1: the external layer names the compressed blob the host keeps (the --have file
    was an earlier bundle.json or a containerd/registry inventory)."""
    base = layer("app base", LAYER_ZSTD, 2_100_000, 7_372_800)
    base["external"] = True
    return bundle([image("app v2 compressed base", ["registry.example/team/app:2.1"], [
        base,
        layer("app v2.1 code", LAYER_ZSTD, 11_002, 40_960),
    ])], version="3.1")


def multi_platform() -> Doc:
    """Schema 3.3: an image carried for two platforms with its image index (the primary, amd64,
    in the image's own fields; arm64 in ``platforms``; 3.3: index.json names the index)."""
    arm = image("multi arm64", [], [layer("multi arm64 layer", LAYER_GZIP, 1_201, 10_240)],
                platform={"os": "linux", "architecture": "arm64", "variant": "v8"})
    del arm["refs"]
    img = image("multi amd64", ["registry.example/team/multi:1"], [layer("multi amd64 layer", LAYER_GZIP, 1_180,
                                                                          10_240)])
    img["index"] = {"mediaType": OCI_INDEX, "digest": digest("multi index"), "size": 734}
    img["platforms"] = [arm]
    return bundle([img], version="3.3")


def cuda_needs() -> Doc:
    """Schema 3.4: an image recording its CUDA needs (docs/gpu-fit.md), as nvidia/cuda:12.4.1's env
    and compat libraries give them, with torch's CUDA."""
    doc = single_image()
    doc["schemaVersion"] = "3.4"
    doc["images"][0]["cuda"] = {
        "cudaVersion": "12.4.1",
        "require": {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471 "
                                           "brand=nvidia,driver>=535,driver<536"},
        "disableRequire": False, "compatLibs": ["550.54.15"], "torchCuda": "12.4"}
    return doc


def _cuda_with(change: Callable[[Doc], None]) -> Callable[[Doc], Doc]:
    """Break a fresh cuda_needs() document (``change`` gets its ``cuda`` object)."""
    def apply(_: Doc) -> Doc:
        doc = cuda_needs()
        change(doc["images"][0]["cuda"])
        return doc
    return apply


def _multi_with(change: Callable[[Doc], None]) -> Callable[[Doc], Doc]:
    """Break a fresh multi_platform() document (``change`` gets its other platform)."""
    def apply(_: Doc) -> Doc:
        doc = multi_platform()
        change(doc["images"][0]["platforms"][0])
        return doc
    return apply


def _multi_unlisted(_: Doc) -> Doc:
    doc = multi_platform()
    gone = doc["images"][0]["platforms"][0]["layers"][0]["digest"]
    doc["files"] = [f for f in doc["files"] if f["digest"] != gone]
    return doc


def attached_artifacts() -> Doc:
    """Schema 3.5: an image with a cosign signature (tag scheme) and an SBOM referrer listed in
    the ``sha256-<hex>`` fallback index."""
    img = image("signed app", ["registry.example/team/app:1"], [layer("signed app layer", LAYER_GZIP, 900, 4_096)])
    subject = img["manifest"]["digest"]
    tag = "sha256-" + subject.split(":")[1]
    img["artifacts"] = [
        {"kind": "signature", "subject": subject, "tag": tag + ".sig", "repository": "registry.example/team/app",
         "manifest": {"mediaType": OCI_MANIFEST, "digest": digest("signature manifest"), "size": 556},
         "blobs": [{"mediaType": OCI_CONFIG, "digest": digest("signature config"), "size": 233},
                   {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                    "digest": digest("signature payload"), "size": 241}]},
        {"kind": "referrers-index", "subject": subject, "tag": tag, "repository": "registry.example/team/app",
         "manifest": {"mediaType": OCI_INDEX, "digest": digest("referrers index"), "size": 301}, "blobs": []},
        {"kind": "referrer", "subject": subject, "artifactType": "application/spdx+json",
         "repository": "registry.example/team/app",
         "manifest": {"mediaType": OCI_MANIFEST, "digest": digest("sbom manifest"), "size": 612},
         "blobs": [{"mediaType": "application/vnd.oci.empty.v1+json", "digest": digest("empty"), "size": 2},
                   {"mediaType": "application/spdx+json", "digest": digest("sbom"), "size": 5_120}]},
    ]
    return bundle([img], version="3.5")


def _artifacts_with(change: Callable[[Doc], None]) -> Callable[[Doc], Doc]:
    """Break a fresh attached_artifacts() document (``change`` gets its first artifact)."""
    def apply(_: Doc) -> Doc:
        doc = attached_artifacts()
        change(doc["images"][0]["artifacts"][0])
        return doc
    return apply


def _artifacts_unlisted(_: Doc) -> Doc:
    doc = attached_artifacts()
    gone = doc["images"][0]["artifacts"][2]["blobs"][1]["digest"]
    doc["files"] = [f for f in doc["files"] if f["digest"] != gone]
    return doc


def _artifacts_image_tagged_as_signature(_: Doc) -> Doc:
    """A second image tagged with the name the first image's signature is handed on under."""
    doc = attached_artifacts()
    sig_tag = doc["images"][0]["artifacts"][0]["tag"]
    other = image("impostor", [f"registry.example/team/app:{sig_tag}"], [layer("impostor layer", LAYER_GZIP, 10, 20)])
    return bundle([doc["images"][0], other], version="3.5")


def files_artifact(label: str, ref: str, titles: List[str], *, model: bool = False) -> Doc:
    """Schema 3.6: files carried as one OCI artifact (raw layers named by their titles)."""
    empty = {"mediaType": "application/vnd.oci.empty.v1+json",
             "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2}
    config = {"mediaType": "application/vnd.cncf.model.config.v1+json", "digest": digest(f"{label} config"),
              "size": 321} if model else empty
    kind = "application/vnd.cncf.model.weight.v1.raw" if model else "application/octet-stream"
    return {"ref": ref,
            "artifactType": "application/vnd.cncf.model.manifest.v1+json" if model
            else "application/vnd.sneakernet.files.v1",
            "manifest": {"mediaType": OCI_MANIFEST, "digest": digest(f"{label} manifest"), "size": 900},
            "config": config,
            "files": [{"title": t, "mediaType": kind, "digest": digest(f"{label} {t}"), "size": 1000 + n,
                       "mode": "0755" if t.endswith(".sh") else "0644"} for n, t in enumerate(titles)]}


def files_beside_images() -> Doc:
    """Schema 3.6: an image and a model carried beside it (ModelPack types)."""
    doc = single_image()
    model = files_artifact("llama", "models/llama:3.1", ["model.safetensors", "tokenizer/tokenizer.json",
                                                         "scripts/run.sh"], model=True)
    return bundle(doc["images"], version="3.6", artifacts=[model])


def files_only() -> Doc:
    """Schema 3.6: a bundle of files alone, no image."""
    return bundle([], version="3.6", artifacts=[files_artifact("data", "data/set:1", ["a.bin", "sub/b.bin"])])


def _files_with(change: Callable[[Doc], None]) -> Callable[[Doc], Doc]:
    """Break a fresh files_beside_images() document (``change`` gets its artifact)."""
    def apply(_: Doc) -> Doc:
        doc = files_beside_images()
        change(doc["artifacts"][0])
        return doc
    return apply


def _title(value: str, n: int = 0) -> Callable[[Doc], None]:
    def apply(art: Doc) -> None:
        art["files"][n]["title"] = value
    return apply


def _files_unlisted(_: Doc) -> Doc:
    doc = files_beside_images()
    gone = doc["artifacts"][0]["files"][1]["digest"]
    doc["files"] = [f for f in doc["files"] if f["digest"] != gone]
    return doc


def files_delta() -> Doc:
    """Schema 3.8: a file delta: a new version of a model whose far side holds two of its files
    (external: in the manifest, not stored, not listed in files)."""
    art = files_artifact("llama2", "models/llama:3.2", ["model-00001.safetensors", "model-00002.safetensors",
                                                        "config.json"], model=True)
    for held in (art["files"][0], art["files"][2]):
        held["external"] = True
    doc = bundle([], version="3.8", artifacts=[art])
    gone = {"blobs/sha256/" + f["digest"][7:] for f in art["files"] if f.get("external")}
    doc["files"] = [f for f in doc["files"] if f["path"] not in gone]
    return doc


def _files_external(version: str, listed: bool) -> Callable[[Doc], Doc]:
    """A file marked external in a bundle older than 3.8, or still listed in files."""
    def apply(_: Doc) -> Doc:
        doc = files_delta() if not listed else files_beside_images()
        doc["schemaVersion"] = version
        if listed:
            doc["artifacts"][0]["files"][0]["external"] = True
        return doc
    return apply


def minimal() -> Doc:
    """Only what readers require: no importer, no platform, an image without layers."""
    doc = bundle([image("minimal", ["minimal:1"], [])], with_importer=False)
    del doc["images"][0]["platform"]
    return doc


VALID: Dict[str, Callable[[], Doc]] = {
    "single-image": single_image,
    "two-images-sharing-a-layer": two_images_sharing_a_layer,
    "untagged-gzip-layers": untagged_gzip,
    "unknown-extra-fields": unknown_extra_fields,
    "minimal-no-importer": minimal,
    "delta-external-layer": delta,
    "delta-external-compressed-blob": delta_compressed,
    "multi-platform-index": multi_platform,
    "cuda-needs": cuda_needs,
    "attached-artifacts": attached_artifacts,
    "files-beside-images": files_beside_images,
    "files-only": files_only,
    "files-delta": files_delta,
}


# -------------------------------------------------------------------------- invalid documents
# name -> a function that breaks a fresh single_image() document in place (or returns a new one).

def _first_layer(doc: Doc) -> Doc:
    layers: List[Doc] = doc["images"][0]["layers"]
    return layers[0]


def _file(doc: Doc, path: str) -> Doc:
    for f in doc["files"]:
        if f["path"] == path:
            return f  # type: ignore[no-any-return]
    raise KeyError(path)


def _set(path: Tuple[Any, ...], value: Any) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return apply


def _delete(path: Tuple[Any, ...]) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return apply


def _set_file_path(old: str, new: str) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        _file(doc, old)["path"] = new
    return apply


def _layer_digest_everywhere(new: str) -> Callable[[Doc], None]:
    """Change the first layer's digest and its files entry alike (so only the digest is bad)."""
    def apply(doc: Doc) -> None:
        lay = _first_layer(doc)
        entry = _file(doc, blob_path(lay["digest"]))
        lay["digest"] = new
        entry["digest"] = new
    return apply


def _size_everywhere(value: Any) -> Callable[[Doc], None]:
    """Set the config size and its files entry alike."""
    def apply(doc: Doc) -> None:
        cfg = doc["images"][0]["config"]
        _file(doc, blob_path(cfg["digest"]))["size"] = value
        cfg["size"] = value
    return apply


def _duplicate_file(doc: Doc) -> None:
    entry = copy.deepcopy(_file(doc, "oci-layout"))
    entry["digest"] = digest("another oci-layout")
    doc["files"].append(entry)


def _unlist_blob(doc: Doc) -> None:
    gone = blob_path(_first_layer(doc)["digest"])
    doc["files"] = [f for f in doc["files"] if f["path"] != gone]


def _blob_size_differs(doc: Doc) -> None:
    _first_layer(doc)["size"] += 1


def _unlist_importer(doc: Doc) -> None:
    doc["files"] = [f for f in doc["files"] if f["path"] != "bundle-import.pyz"]


def _blob_file_digest_differs(doc: Doc) -> None:
    _file(doc, blob_path(_first_layer(doc)["digest"]))["digest"] = digest("something else")


def _importer_digest_differs(doc: Doc) -> None:
    doc["importer"]["digest"] = digest("another importer")


def _not_an_object(doc: Doc) -> Any:
    return [doc]


def _delta_with(change: Callable[[Doc], None]) -> Callable[[Doc], Doc]:
    """Break a fresh delta() document instead of the single-image one."""
    def apply(_: Doc) -> Doc:
        doc = delta()
        change(doc["images"][0]["layers"][0])  # the external layer
        return doc
    return apply


HEX_UPPER = hexof("app base blob").upper()

INVALID: Dict[str, Callable[[Doc], Any]] = {
    # both the schema and check_structure reject these
    "digest-uppercase-hex": _layer_digest_everywhere("sha256:" + HEX_UPPER),
    "digest-wrong-length": _layer_digest_everywhere("sha256:" + hexof("x")[:63]),
    "digest-sha512": _layer_digest_everywhere("sha512:" + hashlib.sha512(b"x").hexdigest()),
    "digest-no-algorithm": _layer_digest_everywhere(hexof("app base blob")),
    "digest-trailing-newline": _layer_digest_everywhere(digest("app base blob") + "\n"),
    "diffid-uppercase-hex": _set(("images", 0, "layers", 0, "diffId"), "sha256:" + HEX_UPPER),
    "size-negative": _size_everywhere(-1),
    "size-boolean": _size_everywhere(True),
    "size-string": _size_everywhere("1469"),
    "uncompressed-size-negative": _set(("images", 0, "layers", 0, "uncompressedSize"), -5),
    "files-path-traversal": _set_file_path("oci-layout", "../x"),
    "files-path-traversal-inner": _set_file_path("oci-layout", "blobs/../../x"),
    "files-path-absolute": _set_file_path("oci-layout", "/etc/passwd"),
    "files-path-dot-segment": _set_file_path("oci-layout", "./oci-layout"),
    "files-path-empty-segment": _set_file_path("oci-layout", "blobs//oci-layout"),
    "files-path-trailing-slash": _set_file_path("oci-layout", "oci-layout/"),
    "files-path-backslash": _set_file_path("oci-layout", "blobs\\oci-layout"),
    "files-path-empty": _set_file_path("oci-layout", ""),
    "files-path-nul": _set_file_path("oci-layout", "oci-layout\x00.txt"),
    "files-path-newline": _set_file_path("oci-layout", "oci-\nlayout"),
    "files-path-too-long": _set_file_path("oci-layout", "/".join(["d" * 99] * 41)),
    "importer-path-traversal": _set(("importer", "path"), "../bundle-import.pyz"),
    "importer-null": _set(("importer",), None),
    "layer-mediatype-unknown": _set(("images", 0, "layers", 0, "mediaType"),
                                    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"),
    "layer-mediatype-missing": _delete(("images", 0, "layers", 0, "mediaType")),
    "layer-diffid-missing": _delete(("images", 0, "layers", 0, "diffId")),
    "layer-uncompressed-size-missing": _delete(("images", 0, "layers", 0, "uncompressedSize")),
    "layer-not-an-object": _set(("images", 0, "layers", 0), "sha256:" + hexof("x")),
    "layer-external-not-a-boolean": _set(("images", 0, "layers", 0, "external"), "yes"),
    "manifest-mediatype-missing": _delete(("images", 0, "manifest", "mediaType")),
    "config-missing": _delete(("images", 0, "config")),
    "images-missing": _delete(("images",)),
    "images-empty": _set(("images",), []),
    "images-not-an-array": _set(("images",), {"app": {}}),
    "image-refs-missing": _delete(("images", 0, "refs")),
    "image-layers-missing": _delete(("images", 0, "layers")),
    "ref-with-space": _set(("images", 0, "refs", 0), "registry.example/team/app: 1.0"),
    "ref-empty": _set(("images", 0, "refs", 0), ""),
    "ref-trailing-newline": _set(("images", 0, "refs", 0), "registry.example/team/app:1.0\n"),
    "ref-too-long": _set(("images", 0, "refs", 0), "r/" + "a" * 1023),
    "platform-not-an-object": _set(("images", 0, "platform"), "linux/amd64"),
    "platform-os-not-a-string": _set(("images", 0, "platform", "os"), 5),
    "platform-value-not-a-string": _set(("images", 0, "platform", "os.features"), ["win32k"]),
    "layer-mediatype-empty": _set(("images", 0, "layers", 0, "mediaType"), ""),
    "tool-name-missing": _delete(("tool", "name")),
    "files-missing": _delete(("files",)),
    "file-digest-missing": lambda doc: _file(doc, "oci-layout").pop("digest"),
    "mediatype-wrong": _set(("mediaType",), "application/vnd.sneakernet.bundle.v2+json"),
    "mediatype-missing": _delete(("mediaType",)),
    "schema-version-not-a-string": _set(("schemaVersion",), 3.0),
    "schema-version-missing": _delete(("schemaVersion",)),
    "created-missing": _delete(("created",)),
    "created-not-a-string": _set(("created",), 1714564800),
    "tool-version-missing": _delete(("tool", "version")),
    "source-not-an-object": _set(("source",), "docker"),
    "not-an-object": _not_an_object,
    # the schema rejects these; check_structure does not look at the version string (only at
    # its type), load_bundle_manifest (parse_schema_version and the major check) rejects them
    "version-major-4": _set(("schemaVersion",), "4.0"),
    "version-major-2": _set(("schemaVersion",), "2.1"),
    "version-no-minor": _set(("schemaVersion",), "3"),
    "version-minor-too-long": _set(("schemaVersion",), "3.12345"),
    "version-trailing-newline": _set(("schemaVersion",), "3.0\n"),
    "version-semver": _set(("schemaVersion",), "3.0.0"),
    "version-leading-zero-major": _set(("schemaVersion",), "03.0"),
    "version-leading-zero-minor": _set(("schemaVersion",), "3.01"),
    "version-fullwidth-digits": _set(("schemaVersion",), "\uff13.\uff10"),
    # cross-references and uniqueness: JSON Schema cannot express them, so the schema accepts
    # and only check_structure rejects
    "xref-blob-not-listed": _unlist_blob,
    "xref-blob-size-differs": _blob_size_differs,
    "xref-duplicate-file-path": _duplicate_file,
    "xref-importer-not-listed": _unlist_importer,
    "xref-importer-differs-from-files": _importer_digest_differs,
    "xref-blob-digest-differs-from-path": _blob_file_digest_differs,
    "xref-layer-external-digest-not-diffid": _delta_with(lambda lay: lay.update(digest=digest("other"))),
    "xref-layer-external-tar-size-not-usize": _delta_with(lambda lay: lay.update(size=lay["size"] + 1)),
    "platforms-manifest-missing": _multi_with(lambda p: p.pop("manifest")),
    "platforms-platform-without-architecture": _multi_with(lambda p: p["platform"].pop("architecture")),
    "xref-platforms-layer-not-listed": _multi_unlisted,
    "cuda-compat-libs-not-strings": _cuda_with(lambda c: c.update(compatLibs=[550])),
    "cuda-require-not-nvidia-require": _cuda_with(lambda c: c["require"].update(LD_PRELOAD="x")),
    "cuda-disable-require-a-string": _cuda_with(lambda c: c.update(disableRequire="1")),
    "cuda-version-a-number": _cuda_with(lambda c: c.update(cudaVersion=12.4)),
    "artifacts-kind-unknown": _artifacts_with(lambda a: a.update(kind="notary")),
    "artifacts-subject-not-a-digest": _artifacts_with(lambda a: a.update(subject="sha256-abc.sig")),
    "artifacts-blob-without-size": _artifacts_with(lambda a: a["blobs"][0].pop("size")),
    "artifacts-not-a-list": _artifacts_with(lambda a: a.update(blobs={"a": 1})),
    "xref-artifacts-blob-not-listed": _artifacts_unlisted,
    # found by the fuzzer (issue 38): the stdlib reader took these, the schema refuses them
    "artifacts-blobs-missing": _artifacts_with(lambda a: a.pop("blobs")),
    "artifacts-tag-null": _artifacts_with(lambda a: a.update(tag=None)),
    "artifacts-tag-empty": _artifacts_with(lambda a: a.update(tag="")),
    "artifacts-repository-null": _artifacts_with(lambda a: a.update(repository=None)),
    # 3.5: a record's tag is only ever the name derived from its own subject, its subject is this
    # image's, and no image carries that name (handing the record on would move an image's tag)
    "artifacts-tag-an-image-tag": _artifacts_with(lambda a: a.update(tag="1")),
    "xref-artifacts-tag-of-another-subject": _artifacts_with(
        lambda a: a.update(tag="sha256-" + hexof("another image") + ".sig")),
    "xref-artifacts-tag-of-another-kind": _artifacts_with(lambda a: a.update(tag=a["tag"][:-4] + ".att")),
    "xref-artifacts-subject-not-this-image": _artifacts_with(
        lambda a: a.update(subject=digest("another image"), tag="sha256-" + hexof("another image") + ".sig")),
    "xref-artifacts-tag-names-an-image": _artifacts_image_tagged_as_signature,
    # 3.6, files carried as artifacts: a title is a path below the importer's --files-to DIR
    "files-title-traversal": _files_with(_title("../x")),
    "files-title-absolute": _files_with(_title("/etc/x")),
    "files-title-inner-traversal": _files_with(_title("a/../../x")),
    "files-title-dot": _files_with(_title(".")),
    "files-title-dotdot": _files_with(_title("..")),
    "files-title-nul": _files_with(_title("a\x00b")),
    "files-title-backslash": _files_with(_title("a\\..\\x")),
    "files-title-empty": _files_with(_title("")),
    "files-title-staging-folder": _files_with(_title(".sneakernet-staging-1/x")),
    "files-title-name-too-long": _files_with(_title("d/" + "n" * 256)),
    "files-mode-setuid": _files_with(lambda a: a["files"][0].update(mode="4755")),
    "files-mode-a-number": _files_with(lambda a: a["files"][0].update(mode=420)),
    "files-empty": _files_with(lambda a: a.update(files=[])),
    "files-ref-without-tag": _files_with(lambda a: a.update(ref="models/llama")),
    "files-ref-a-digest": _files_with(lambda a: a.update(ref="models/llama@sha256:" + hexof("x"))),
    "files-artifacts-empty": lambda _: {**files_beside_images(), "artifacts": []},
    "files-only-without-artifacts": lambda _: {k: v for k, v in files_only().items() if k != "artifacts"},
    "xref-files-title-duplicate": _files_with(_title("model.safetensors", 1)),
    "xref-files-title-file-and-folder": _files_with(_title("tokenizer", 0)),
    "xref-files-blob-not-listed": _files_unlisted,
    "xref-files-ref-of-an-image": _files_with(lambda a: a.update(ref="registry.example/team/app:1.0")),
    "files-external-not-a-boolean": _files_with(lambda a: a["files"][0].update(external="yes")),
    "xref-files-external-before-3-8": _files_external("3.6", listed=False),
    "xref-files-external-listed": _files_external("3.8", listed=True),
    # JSON Schema counts 1469.0 as an integer; the stdlib reader wants a JSON integer literal
    "stdlib-size-float": _size_everywhere(1469.0),
}


def build() -> Dict[str, bytes]:
    """Relative path -> file bytes for every golden document."""
    out: Dict[str, bytes] = {}

    def dump(doc: Any) -> bytes:
        return (json.dumps(doc, indent=2, ensure_ascii=True) + "\n").encode("ascii")

    for name, make in VALID.items():
        out[f"valid/{name}.json"] = dump(make())
    for name, breaks in INVALID.items():
        doc = single_image()
        result = breaks(doc)
        out[f"invalid/{name}.json"] = dump(result if isinstance(result, (list, dict)) else doc)
    return out


def main(argv: List[str]) -> int:
    check = "--check" in argv
    wanted = build()
    stale = sorted(
        str(p.relative_to(OUT)) for p in OUT.glob("*/*.json") if str(p.relative_to(OUT)) not in wanted
    )
    differ = sorted(
        rel for rel, data in wanted.items()
        if not (OUT / rel).is_file() or (OUT / rel).read_bytes() != data
    )
    if check:
        for rel in differ:
            print(f"out of date: {rel}", file=sys.stderr)
        for rel in stale:
            print(f"not produced by this script: {rel}", file=sys.stderr)
        return 1 if differ or stale else 0
    for rel in stale:
        (OUT / rel).unlink()
    for rel in differ:
        (OUT / rel).parent.mkdir(parents=True, exist_ok=True)
        (OUT / rel).write_bytes(wanted[rel])
    print(f"{len(wanted)} golden documents under {OUT} ({len(differ)} written, {len(stale)} removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
