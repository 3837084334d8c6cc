"""The OCI layout sink: unpack a bundle's images into an OCI image-layout directory
(``oci-layout``, ``index.json``, ``blobs/sha256/``), the reference sink the tests compare every
engine with, and a way to hand images to tools that read layouts (skopeo ``oci:DIR:REF``,
``podman pull oci:...``, buildkit).

Blobs are copied byte for byte (checked as they are copied, written temp-then-rename), so the
layout holds the bundle's manifest digest. ``index.json`` names each image with
``org.opencontainers.image.ref.name`` = the bundle ref, as the bundle itself does; it is
rewritten atomically. One writer at a time: the importer does not lock the directory."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Set

from importer.engines import EngineBlob, EngineImage, EngineInfo
from importer.errors import (
    PLACE_ERRNOS,
    DigestMismatch,
    EngineUnavailable,
    ManifestError,
    SinkError,
    SizeMismatch,
    write_error,
)
from importer.format.artifacts import handed_on_reference
from importer.format.digest import CHUNK, Digest, hash_file, is_digest
from importer.format.fileartifacts import FileArtifact
from importer.format.identity import OCI
from importer.format.limits import MAX_CONFIG, MAX_INDEX, MAX_MANIFEST, parse_json, read_file_limited
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.mediatypes import OCI_INDEX, REF_NAME_ANNOTATION
from importer.format.platform import of_dict, pick_platform_manifest
from importer.input.opened import BundleRoot, bundle_folder
from importer.input.tarscan import ArchiveScan, layer_bound, scan_layout_blobs
from importer.sinks import DeltaBase, ProgressFn, SinkBase, SinkCapabilities
from importer.sinks.delta import base_missing, users_of
from importer.streams.fsutil import atomic_write_bytes, atomic_writer, fsync_dir

LAYOUT_VERSION = "1.0.0"
_INDEX_TYPES = (OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")
_HINT = "pass --oci-dir with an empty or missing folder, or one that already holds an OCI layout"


class OciLayoutSink(SinkBase):
    kind = "oci"
    capabilities = SinkCapabilities(counts_load_bytes=True, completes_deltas=True, lists_tags=True,
                                    lists_images=True, reexports=True, takes_file_artifacts=True)

    def __init__(self, directory: str) -> None:
        self.dir = os.path.abspath(directory)

    # === probe
    def probe(self) -> EngineInfo:
        layout = os.path.join(self.dir, "oci-layout")
        if os.path.exists(self.dir):
            if not os.path.isdir(self.dir):
                raise EngineUnavailable(f"opening the OCI layout {self.dir}: expected a folder, found a file",
                                        hint=_HINT)
            if os.path.isfile(layout):
                doc = parse_json(read_file_limited(layout, 4096, "oci-layout"), f"{layout}")
                version = doc.get("imageLayoutVersion") if isinstance(doc, dict) else None
                if version != LAYOUT_VERSION:
                    raise EngineUnavailable(
                        f"opening the OCI layout {self.dir}: expected imageLayoutVersion {LAYOUT_VERSION}, "
                        f"found {version!r}", hint=_HINT)
            elif os.listdir(self.dir):
                raise EngineUnavailable(
                    f"opening the OCI layout {self.dir}: expected an empty folder or an OCI layout, "
                    "found other files", hint=_HINT)
        elif not os.path.isdir(os.path.dirname(self.dir)):
            raise EngineUnavailable(f"creating the OCI layout {self.dir}: expected its parent folder to exist, "
                                    "found none", hint=_HINT)
        return EngineInfo(kind="oci", version=LAYOUT_VERSION, storage_driver="oci-layout", image_store=OCI,
                          address=self.dir, data_root=self.dir)

    # === index.json
    def _index(self) -> Dict[str, Any]:
        path = os.path.join(self.dir, "index.json")
        if not os.path.isfile(path):
            return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        doc = parse_json(read_file_limited(path, MAX_INDEX, path), path)
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            raise ManifestError(f"reading {path}: expected an OCI index with manifests, found something else",
                                hint="the layout is damaged; import into a new --oci-dir")
        return doc

    def _write_index(self, doc: Dict[str, Any]) -> None:
        atomic_write_bytes(os.path.join(self.dir, "index.json"),
                           json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        fsync_dir(self.dir)

    @staticmethod
    def _ref(entry: Any) -> Optional[str]:
        ann = entry.get("annotations") if isinstance(entry, dict) else None
        ref = ann.get(REF_NAME_ANNOTATION) if isinstance(ann, dict) else None
        return ref if isinstance(ref, str) else None

    def _blob(self, digest: str) -> str:
        return os.path.join(self.dir, Digest.parse(digest).blob_path)

    def _json_blob(self, digest: str, limit: int, what: str) -> Any:
        return parse_json(read_file_limited(self._blob(digest), limit, what), what)

    # === read back
    def lookup(self, name: str) -> Optional[EngineImage]:
        entries = [e for e in self._index()["manifests"] if isinstance(e, dict)]
        if is_digest(name):
            matches = [e for e in entries if e.get("digest") == name]
        else:
            matches = [e for e in entries if self._ref(e) == name]
        if not matches or not is_digest(matches[0].get("digest")):
            return None
        digest = str(matches[0]["digest"])
        tags = sorted({r for r in (self._ref(e) for e in entries if e.get("digest") == digest) if r})
        if matches[0].get("mediaType") in _INDEX_TYPES:  # a multi-platform image: the manifest it holds
            return self._describe_index(digest, tags)
        return self._describe(digest, tags)

    def _describe_index(self, digest: str, tags: List[str]) -> EngineImage:
        """An index the layout names: the image of its manifest for this host's platform (else its
        first), with the problems of every manifest the index lists (each must be whole)."""
        if not os.path.isfile(self._blob(digest)):
            return EngineImage(digest, [], tags, problems=[f"index blob {digest} missing"])
        doc = self._json_blob(digest, MAX_INDEX, f"index {digest}")
        listed = [e for e in (doc.get("manifests") or []) if isinstance(e, dict) and is_digest(e.get("digest"))]
        if not listed:
            return EngineImage(digest, [], tags, problems=[f"index {digest} lists no manifest"])
        images = [self._describe(str(e["digest"]), tags) for e in listed]
        mine = pick_platform_manifest(doc)  # this host's platform, else the first listed
        first = next((i for i in images if i.image_id == mine), images[0])
        problems = list(first.problems) + [p for i in images if i is not first for p in i.problems]
        problems += self._platform_problems(digest, listed, images)
        return EngineImage(first.image_id, first.diff_ids, tags, config_digest=first.config_digest,
                           manifest_digest=first.manifest_digest, blobs=first.blobs, problems=problems)

    def _platform_problems(self, digest: str, listed: List[Dict[str, Any]], images: List[EngineImage]) -> List[str]:
        """Each manifest the index lists for a platform has a config for that platform: a reader
        of one platform never gets another's image (issue 24 class 4)."""
        problems = []
        for entry, image in zip(listed, images):
            want, config = of_dict(entry.get("platform")), str(image.config_digest)
            if want is None or not is_digest(config) or not os.path.isfile(self._blob(config)):
                continue
            got = of_dict(self._json_blob(config, MAX_CONFIG, f"config {config}"))
            if got is None or not got.matches(want):
                problems.append(f"index {digest[:19]} lists {str(entry['digest'])[:19]} for {want}, "
                                f"its config is for {got or 'no platform'}")
        return problems

    def _entry_for(self, index: Dict[str, Any], image_id: str) -> Optional[Dict[str, Any]]:
        """The entry naming ``image_id``: a manifest itself, or an index holding it (multi-platform)."""
        entries = [e for e in index["manifests"] if isinstance(e, dict)]
        direct = next((e for e in entries if e.get("digest") == image_id), None)
        if direct is not None:
            return direct
        for e in entries:
            if e.get("mediaType") in _INDEX_TYPES and is_digest(e.get("digest")) and os.path.isfile(
                    self._blob(str(e["digest"]))):
                doc = self._json_blob(str(e["digest"]), MAX_INDEX, f"index {e['digest']}")
                if any(isinstance(m, dict) and m.get("digest") == image_id for m in doc.get("manifests") or []):
                    return e
        return None

    def _describe(self, digest: str, tags: List[str]) -> EngineImage:
        problems: List[str] = []
        if not os.path.isfile(self._blob(digest)):
            return EngineImage(digest, [], tags, manifest_digest=digest, problems=[f"manifest blob {digest} missing"])
        manifest = self._json_blob(digest, MAX_MANIFEST, f"manifest {digest}")
        config = manifest.get("config") if isinstance(manifest, dict) else None
        config_digest = config.get("digest") if isinstance(config, dict) else None
        if not is_digest(config_digest) or not os.path.isfile(self._blob(str(config_digest))):
            return EngineImage(digest, [], tags, manifest_digest=digest, problems=["config blob missing"])
        cfg = self._json_blob(str(config_digest), MAX_CONFIG, f"config {config_digest}")
        rootfs = cfg.get("rootfs") if isinstance(cfg, dict) else None
        diff_ids = [str(x) for x in (rootfs.get("diff_ids") or [])] if isinstance(rootfs, dict) else []
        blobs: List[EngineBlob] = []
        for i, layer in enumerate(manifest.get("layers") or []):
            if not isinstance(layer, dict) or not is_digest(layer.get("digest")):
                problems.append(f"layer {i + 1}: no digest in the manifest")
                continue
            blobs.append({"mediaType": layer.get("mediaType"), "digest": layer["digest"], "size": layer.get("size")})
            path = self._blob(layer["digest"])
            if not os.path.isfile(path):
                problems.append(f"layer {i + 1}: blob {layer['digest']} missing")
            elif os.path.getsize(path) != layer.get("size"):
                problems.append(f"layer {i + 1}: blob {layer['digest']} holds {os.path.getsize(path)} bytes, "
                                f"expected {layer.get('size')}")
        return EngineImage(digest, diff_ids, tags, config_digest=str(config_digest), manifest_digest=digest,
                           blobs=blobs, problems=problems)

    # === load
    def prepare_delta(self, manifest: BundleManifest) -> Dict[Digest, None]:
        """The blobs a delta leaves out, each already in the layout (checked by hashing it);
        DeltaBaseMissing (nothing written) if one is absent or damaged."""
        missing = []
        for layer in manifest.external_layers():
            path = os.path.join(self.dir, layer.digest.blob_path)
            if not (os.path.isfile(path) and os.path.getsize(path) == layer.size
                    and hash_file(path)[0] == layer.digest):
                missing.append(f"host lacks layer {layer.diff_id} required by "
                               f"{', '.join(users_of(manifest, layer))} (the layout holds no blob {layer.digest})")
        if missing:
            raise base_missing(manifest, missing, engine=f"the OCI layout {self.dir}")
        return {x.digest: None for x in manifest.external_layers()}

    def load_total(self, images: Sequence[ImageRecord], external: Optional[DeltaBase] = None) -> int:
        """The bytes :meth:`load` reports to its progress callback: every blob it copies, once."""
        sizes: Dict[Digest, int] = {}
        for image in images:
            blobs = [(image.index.digest, image.index.size)] if image.index is not None else []
            for v in image.variants:
                blobs += [(v.manifest.digest, v.manifest.size), (v.config.digest, v.config.size)]
                blobs += [(x.digest, x.size) for x in v.layers]
            for digest, size in blobs:
                if not (external and digest in external):
                    sizes[digest] = size
        return sum(sizes.values())

    def load(self, bundle_root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[DeltaBase] = None) -> None:
        """``external`` (delta bundles): blobs the layout already holds, from :meth:`prepare_delta`."""
        root = bundle_folder(bundle_root, f"loading into {self.kind}")
        os.makedirs(os.path.join(self.dir, "blobs", "sha256"), exist_ok=True)
        layout = os.path.join(self.dir, "oci-layout")
        if not os.path.isfile(layout):
            atomic_write_bytes(layout, json.dumps({"imageLayoutVersion": LAYOUT_VERSION}).encode())
        done: Dict[Digest, bool] = {}
        for image in images:
            # a multi-platform image (schema 3.2): every platform carried, and the index byte for byte
            blobs = [(image.index.digest, image.index.size, f"index of {image.name}")] if image.index else []
            for v in image.variants:
                name = f"{image.name} ({v.platform_text()})" if image.others else image.name
                blobs += [(v.manifest.digest, v.manifest.size, f"manifest of {name}"),
                          (v.config.digest, v.config.size, f"config of {name}")]
                blobs += [(x.digest, x.size, f"layer {i + 1}/{len(v.layers)} of {name}")
                          for i, x in enumerate(v.layers)]
            for digest, size, what in blobs:
                if digest not in done and not (external and digest in external):
                    self._copy_blob(root, digest, size, what, on_bytes)
                    done[digest] = True
        fsync_dir(os.path.join(self.dir, "blobs", "sha256"))
        index = self._index()
        self._load_artifacts(root, images, done, index)  # before the refs: an image's ref is put last
        for image in images:
            desc: Dict[str, Any] = {"mediaType": image.manifest.media_type, "digest": str(image.manifest.digest),
                                    "size": image.manifest.size}
            if image.index is not None:  # the whole index, its digest unchanged, is what the ref names
                desc = image.index.to_dict()
            elif image.platform.get("os") and image.platform.get("architecture"):
                desc["platform"] = dict(image.platform)
            for ref in image.refs:
                _put(index, desc, ref)
            if not image.refs and not any(e.get("digest") == desc["digest"] for e in index["manifests"]):
                index["manifests"].append(desc)
        self._write_index(index)

    def _load_artifacts(self, root: str, images: Sequence[ImageRecord], done: Dict[Digest, bool],
                        index: Dict[str, Any]) -> None:
        """Schema 3.5: what the source registry attached to the images, byte for byte: a cosign
        artifact named by its tag (``sha256-<hex>.sig``, as ``cosign save`` names it in a layout), a
        referrer listed unnamed (found by its ``subject``), the fallback index not listed."""
        for image in images:
            for art in (a for a in image.artifacts if a.kind != "index"):  # an index names platforms not here
                for blob in art.every_blob():
                    if blob.digest not in done:
                        self._copy_blob(root, blob.digest, blob.size, f"{art.kind} of {image.name}", None)
                        done[blob.digest] = True
                desc = art.manifest.to_dict()
                if art.artifact_type:
                    desc["artifactType"] = art.artifact_type
                if art.kind in ("signature", "attestation", "sbom") and art.tag:
                    _put(index, desc, handed_on_reference(art))  # derived from its subject, never bundle.json's tag
                elif art.kind == "referrer" and not any(e.get("digest") == desc["digest"] for e in index["manifests"]):
                    index["manifests"].append(desc)
        fsync_dir(os.path.join(self.dir, "blobs", "sha256"))

    # === schema 3.6: files carried as OCI artifacts
    def ref_digest(self, ref: str) -> Optional[str]:
        """The digest ``ref`` names in index.json now (None: free)."""
        for e in self._index()["manifests"]:
            if self._ref(e) == ref and isinstance(e.get("digest"), str):
                return str(e["digest"])
        return None

    def load_files(self, bundle_root: BundleRoot, artifacts: Sequence[FileArtifact],
                   on_bytes: Optional[ProgressFn]) -> List[str]:
        """Each file artifact byte for byte (every blob checked as it is copied), then named in
        index.json under its ref with its ``artifactType`` (``oras pull --oci-layout DIR:REF``,
        ``skopeo``): the blobs first, the names last, in one rewrite of index.json. Returns the
        problems of reading them back (each blob there with its size)."""
        root = bundle_folder(bundle_root, f"loading into {self.kind}")
        os.makedirs(os.path.join(self.dir, "blobs", "sha256"), exist_ok=True)
        layout = os.path.join(self.dir, "oci-layout")
        if not os.path.isfile(layout):
            atomic_write_bytes(layout, json.dumps({"imageLayoutVersion": LAYOUT_VERSION}).encode())
        done: Set[Digest] = set()
        for art in artifacts:
            for blob in art.every_blob():
                if blob.digest not in done:
                    self._copy_blob(root, blob.digest, blob.size, f"a blob of the artifact {art.ref}", on_bytes)
                    done.add(blob.digest)
        fsync_dir(os.path.join(self.dir, "blobs", "sha256"))
        index = self._index()
        for art in artifacts:
            for sig in art.signatures:  # 3.7: under cosign's sha256-<hex>.sig, as `cosign save` names it
                _put(index, sig.manifest.to_dict(), handed_on_reference(sig))
            _put(index, {**art.manifest.to_dict(), "artifactType": art.artifact_type}, art.ref)
        self._write_index(index)
        problems = []
        for art in artifacts:
            if self.ref_digest(art.ref) != str(art.manifest.digest):
                problems.append(f"{art.ref}: index.json does not name {art.manifest.digest}")
            for blob in art.every_blob():
                path = os.path.join(self.dir, blob.digest.blob_path)
                if not os.path.isfile(path) or os.path.getsize(path) != blob.size:
                    problems.append(f"{art.ref}: blob {blob.digest.short} missing or not {blob.size} bytes")
        return problems

    def _copy_blob(self, root: str, digest: Digest, size: int, what: str, on_bytes: Optional[ProgressFn]) -> None:
        dst = os.path.join(self.dir, digest.blob_path)
        if os.path.isfile(dst) and os.path.getsize(dst) == size and hash_file(dst)[0] == digest:
            return  # content-addressed and intact: already there
        try:
            self._write_blob(root, digest, size, what, on_bytes, dst)
        except OSError as e:
            if e.errno not in PLACE_ERRNOS or not isinstance(e.filename, str) or \
                    os.path.dirname(e.filename) != os.path.dirname(dst):  # the bundle's side: as it is
                raise  # (the blob, or its temp file beside it: no file could be made, out of inodes)
            raise write_error(e, f"copying {what} into the OCI layout {self.dir}", dst,
                              note="the layout's index.json was not changed: it names no image of this run") from e

    def _write_blob(self, root: str, digest: Digest, size: int, what: str, on_bytes: Optional[ProgressFn],
                    dst: str) -> None:
        h = hashlib.sha256()
        n = 0
        with open(os.path.join(root, digest.blob_path), "rb") as src, atomic_writer(dst, 0o444) as out:
            while True:
                data = src.read(CHUNK)
                if not data:
                    break
                h.update(data)
                n += len(data)
                out.write(data)
                if on_bytes is not None:
                    on_bytes(len(data))
            if n != size:
                raise SizeMismatch(f"copying {what} ({digest}): expected {size} bytes, found {n}",
                                   hint="the bundle changed after verification; re-copy it and import again")
            if Digest("sha256", h.hexdigest()) != digest:
                raise DigestMismatch(f"copying {what}: expected {digest}, found sha256:{h.hexdigest()}",
                                     hint="the bundle changed after verification; re-copy it and import again")

    def tag(self, image_id: str, ref: str) -> None:
        index = self._index()
        source = self._entry_for(index, image_id)
        if source is None:
            raise SinkError(f"tagging {image_id[:19]} as {ref}: expected it in {self.dir}/index.json, found none")
        desc = {k: v for k, v in source.items() if k != "annotations"}
        _put(index, desc, ref)
        self._write_index(index)

    def remove(self, image_id: str) -> None:
        index = self._index()
        if is_digest(image_id):
            entry = self._entry_for(index, image_id)
            named = entry.get("digest") if entry is not None else image_id
            keep = [e for e in index["manifests"] if not (isinstance(e, dict) and e.get("digest") == named)]
        else:
            keep = [e for e in index["manifests"] if self._ref(e) != image_id]
        index["manifests"] = keep
        self._write_index(index)

    def list_tags(self, like: str = "") -> List[str]:
        return sorted({r for r in (self._ref(e) for e in self._index()["manifests"]) if r})

    # === --deep and --inventory
    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> ArchiveScan:
        digests = [Digest.parse(found.image_id)]
        if found.config_digest and is_digest(found.config_digest):
            digests.append(Digest.parse(found.config_digest))
        digests += [Digest.parse(b["digest"]) for b in found.blobs]
        return scan_layout_blobs(self.dir, digests, f"blobs of {self.dir}", bound=layer_bound(image),
                                 on_bytes=on_bytes)

    def inventory(self) -> List[EngineImage]:
        entries = [e for e in self._index()["manifests"] if isinstance(e, dict) and is_digest(e.get("digest"))]
        digests = sorted({str(e["digest"]) for e in entries})
        return [self._describe(d, sorted({r for r in (self._ref(e) for e in entries if e["digest"] == d) if r}))
                for d in digests]


def _put(index: Dict[str, Any], desc: Dict[str, Any], ref: str) -> None:
    """Point ``ref`` at ``desc`` (replacing what it named before)."""
    manifests = [e for e in index["manifests"]
                 if not (isinstance(e, dict) and (e.get("annotations") or {}).get(REF_NAME_ANNOTATION) == ref)]
    manifests.append({**desc, "annotations": {REF_NAME_ANNOTATION: ref}})
    index["manifests"] = manifests
