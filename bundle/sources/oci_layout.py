"""``oci:DIR[:REF]`` source: images from an OCI image layout (skopeo ``oci:``, buildkit
``type=oci``, ``bundle-import --engine oci``).

The layout's blobs are copied byte for byte and only decompressed to compute diff_ids. ``REF``
is matched against ``org.opencontainers.image.ref.name``; without it the layout must hold exactly
one image. The bundle names the image by ``io.containerd.image.name`` when present, else by the
ref name when it names a repository (``app:1``, ``reg/app``); a bare tag or word (``1``,
``latest``, ``app``) leaves the image untagged in the bundle unless ``bundle export --tag REF``
names it (it imports by ID otherwise)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Sequence, Tuple

from bundle.blobstore import BlobStore
from bundle.sources import SourceImage, SourceInfo
from bundle.sources.attached import collect_artifacts
from bundle.sources.blobcopy import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    PlatformChoice,
    add_layer_sizes,
    copy_target,
    manifests_for,
)
from bundle.sources.oci_attached import LayoutArtifacts
from importer.errors import ImageNotFound, SourceError
from importer.format.digest import Digest
from importer.format.limits import MAX_INDEX, parse_json, read_file_limited
from importer.format.manifest import LayerRecord
from importer.format.mediatypes import REF_NAME_ANNOTATION
from importer.format.platform import Platform, host
from importer.inventory.have import HaveLayers

ProgressFn = Any
CONTAINERD_NAME = "io.containerd.image.name"


def split_oci_ref(text: str) -> Tuple[str, Optional[str]]:
    """``DIR[:REF]`` -> (DIR, REF or None), split at the first colon as skopeo does (a layout
    path holds no colon; the ref may: ``oci:/srv/layout:app:1``)."""
    directory, sep, ref = text.partition(":")
    return directory, (ref if sep and ref else None)


class OciLayoutSource:
    kind = "oci"

    def __init__(self, directory: str) -> None:
        self.dir = os.path.abspath(directory)
        self.where = f"the OCI layout {self.dir}"
        self._index: Optional[List[Dict[str, Any]]] = None
        #: the platform picked from an image index (bundle export --platform; default: this host's)
        self.platform: Platform = host()
        #: --platform was given: a single-platform image must be for it too
        self.platform_given = False
        #: lines for the user (platforms a default export leaves out)
        self.notes: List[str] = []
        #: several platforms of a multi-platform image (--all-platforms, several --platform)
        self.choice: Optional[PlatformChoice] = None
        #: carry what the layout holds attached to each image (bundle/sources/oci_attached.py); --no-referrers
        self.attached = True

    def _entries(self) -> List[Dict[str, Any]]:
        if self._index is None:
            path = os.path.join(self.dir, "index.json")
            if not os.path.isfile(path):
                raise ImageNotFound(f"reading {self.where}: expected index.json, found none",
                                    hint="point oci: at a folder that holds an OCI image layout")
            doc = parse_json(read_file_limited(path, MAX_INDEX, "index.json"), path)
            entries = doc.get("manifests") if isinstance(doc, dict) else None
            if not isinstance(entries, list):
                raise SourceError(f"reading {path}: expected a manifests list, found none")
            self._index = [e for e in entries if isinstance(e, dict)]
        return self._index

    def info(self) -> SourceInfo:
        self._entries()
        return SourceInfo("oci", {"path": self.dir})

    def _target(self, ref: Optional[str]) -> Dict[str, Any]:
        entries = [e for e in self._entries() if e.get("mediaType") in MANIFEST_TYPES + INDEX_TYPES]
        names = [str((e.get("annotations") or {}).get(REF_NAME_ANNOTATION, "")) for e in entries]
        if ref is None:
            if len(entries) != 1:
                raise ImageNotFound(f"exporting from {self.where}: expected one image when no :REF is given, "
                                    f"found {len(entries)} ({', '.join(n or '<unnamed>' for n in names)})",
                                    hint="name one: oci:DIR:REF")
            return entries[0]
        for entry, name in zip(entries, names):
            if name == ref:
                return entry
        raise ImageNotFound(f"exporting {ref} from {self.where}: expected an image named {ref!r}, found "
                            f"{', '.join(n or '<unnamed>' for n in names) or 'none'}",
                            hint="the names are index.json's org.opencontainers.image.ref.name")

    def check_refs(self, refs: Sequence[Optional[str]]) -> int:
        sizes: Dict[str, int] = {}
        for ref in refs:
            add_layer_sizes(manifests_for(self, self._target(ref), self.platform, self.choice,
                                          f"exporting from {self.where}", strict=self.platform_given,
                                          notes=self.notes), sizes)
        return sum(sizes.values())

    # === BlobProvider
    def _path(self, digest: str, what: str) -> str:
        d = Digest.parse(digest, what=f"{what}: digest")
        path = os.path.join(self.dir, d.blob_path)
        if not os.path.isfile(path):
            raise SourceError(f"{what}: expected the blob {d} in {self.where}, found none",
                              hint="the layout is incomplete; copy it again")
        return path

    def read_json(self, digest: str, limit: int, what: str) -> Any:
        path = self._path(digest, what)
        raw = read_file_limited(path, limit, what)
        if Digest.of_bytes(raw) != Digest.parse(digest):
            raise SourceError(f"{what}: expected the blob to hash to {digest}, found other bytes",
                              hint="the layout is damaged; copy it again")
        return parse_json(raw, what)

    @contextlib.contextmanager
    def open_blob(self, digest: str, what: str) -> Iterator[BinaryIO]:
        with open(self._path(digest, what), "rb") as f:
            yield f

    @staticmethod
    def image_refs(entry: Dict[str, Any]) -> Tuple[str, ...]:
        ann = entry.get("annotations") or {}
        full = ann.get(CONTAINERD_NAME)
        if isinstance(full, str) and full:
            return (full,)
        name = ann.get(REF_NAME_ANNOTATION)
        if isinstance(name, str) and (":" in name or "/" in name):
            return (name,)
        return ()

    def export(self, refs: Sequence[Optional[str]], store: BlobStore, *, compression: str,
               level: Optional[int], on_bytes: Optional[ProgressFn] = None,
               have: Optional[HaveLayers] = None) -> List[SourceImage]:
        copied: Dict[str, LayerRecord] = {}
        images = []
        for ref in refs:
            entry = self._target(ref)
            what = f"exporting {ref or 'the image'} from {self.where}"
            image = copy_target(self, entry, self.image_refs(entry), store, platform=self.platform,
                                choice=self.choice, compression=compression, level=level, what=what,
                                on_bytes=on_bytes, have=have, copied=copied)
            images.append(self._with_artifacts(entry, image, store, what) if self.attached else image)
        return images

    def _with_artifacts(self, entry: Dict[str, Any], image: SourceImage, store: BlobStore, what: str) -> SourceImage:
        subjects = [Digest.parse(entry.get("digest"), what=f"{what}: digest")]
        subjects += [Digest.of_bytes(v.raw_manifest) for v in (image, *image.others) if v.raw_manifest is not None]
        layout = LayoutArtifacts(self.dir, self._entries(), self.where)
        raw_target = layout.manifest(str(subjects[0])) if entry.get("mediaType") in INDEX_TYPES else None
        picked = (raw_target, str(entry["mediaType"])) if raw_target and image.raw_index is None else None
        artifacts = collect_artifacts(layout, subjects, store, what, picked_from=picked)
        return dataclasses.replace(image, artifacts=artifacts) if artifacts else image
