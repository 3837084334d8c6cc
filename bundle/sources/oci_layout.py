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
import os
from typing import BinaryIO, Dict, Iterator, List, Optional, Sequence, Tuple

from bundle.sources import ResolvedImage, SourceInfo
from bundle.sources.blobcopy import BlobProvider, add_layer_sizes, manifests_for, resolve_target
from bundle.sources.oci_attached import LayoutArtifacts
from bundle.sources.protocol import Attached, CheckedRefs, Resolved, Selection, SourceBase
from bundle.sources.records import INDEX_TYPES, MANIFEST_TYPES, Descriptor, json_object, list_of, load_json
from importer.errors import ImageNotFound, SourceError
from importer.format.digest import Digest
from importer.format.limits import MAX_INDEX, read_file_limited

CONTAINERD_NAME = "io.containerd.image.name"


def split_oci_ref(text: str) -> Tuple[str, str]:
    """``DIR[:REF]`` -> (DIR, REF or "": the layout's one image), split at the first colon as
    skopeo does (a layout path holds no colon; the ref may: ``oci:/srv/layout:app:1``)."""
    directory, _, ref = text.partition(":")
    return directory, ref


class OciLayoutSource(SourceBase):
    """An OCI image layout; a reference is a ref name of its index.json, "" its one image."""

    kind = "oci"
    carries_attached = True  # cosign-tagged entries, manifests whose subject is the image

    def __init__(self, directory: str) -> None:
        self.dir = os.path.abspath(directory)
        self.where = f"the OCI layout {self.dir}"
        self._index: Optional[List[Descriptor]] = None

    def _entries(self) -> List[Descriptor]:
        """index.json's entries, each read as a descriptor once (a damaged one is named)."""
        if self._index is None:
            path = os.path.join(self.dir, "index.json")
            if not os.path.isfile(path):
                raise ImageNotFound(f"reading {self.where}: expected index.json, found none",
                                    hint="point oci: at a folder that holds an OCI image layout")
            hint = "the layout is damaged; copy it again"
            doc = json_object(load_json(read_file_limited(path, MAX_INDEX, "index.json"), path), f"reading {path}",
                              hint=hint)
            if not isinstance(doc.get("manifests"), list):
                raise SourceError(f"reading {path}: expected a manifests list, found none", hint=hint)
            self._index = [Descriptor.parse(e, f"reading {path}: manifest {n}", hint=hint)
                           for n, e in enumerate(list_of(doc, "manifests", f"reading {path}"))]
        return self._index

    def info(self) -> SourceInfo:
        self._entries()
        return SourceInfo("oci", {"path": self.dir})

    def _target(self, ref: str) -> Descriptor:
        entries = [e for e in self._entries() if e.media_type in MANIFEST_TYPES + INDEX_TYPES]
        names = [e.ref_name for e in entries]
        if not ref:
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

    def check_refs(self, refs: Sequence[str], selection: Selection) -> CheckedRefs:
        sizes: Dict[str, int] = {}
        notes: List[str] = []
        for ref in refs:
            add_layer_sizes(manifests_for(self, self._target(ref), selection.platform, selection.choice,
                                          f"exporting from {self.where}", strict=selection.platform_given,
                                          notes=notes), sizes)
        return CheckedRefs(sum(sizes.values()), tuple(notes))

    # === BlobProvider
    def _path(self, digest: str, what: str) -> str:
        d = Digest.parse(digest, what=f"{what}: digest")
        path = os.path.join(self.dir, d.blob_path)
        if not os.path.isfile(path):
            raise SourceError(f"{what}: expected the blob {d} in {self.where}, found none",
                              hint="the layout is incomplete; copy it again")
        return path

    @contextlib.contextmanager
    def open_blob(self, digest: str, what: str) -> Iterator[BinaryIO]:
        with open(self._path(digest, what), "rb") as f:
            yield f

    @staticmethod
    def image_refs(entry: Descriptor) -> Tuple[str, ...]:
        full = entry.annotations.get(CONTAINERD_NAME, "")
        if full:
            return (full,)
        name = entry.ref_name
        if ":" in name or "/" in name:
            return (name,)
        return ()

    def blobs(self, image: ResolvedImage) -> BlobProvider:
        return self

    def resolve(self, refs: Sequence[str], selection: Selection) -> List[Resolved]:
        images: List[Resolved] = []
        for ref in refs:
            entry = self._target(ref)
            what = f"exporting {ref or 'the image'} from {self.where}"
            images.append(resolve_target(self, entry, ref, self.image_refs(entry), platform=selection.platform,
                                         choice=selection.choice, what=what))
        return images

    def attached(self, image: ResolvedImage) -> Optional[Attached]:
        """The layout's cosign-tagged entries and the manifests whose subject is the image; the index
        the platform was picked from, when the target is one (oci_attached.py)."""
        layout = LayoutArtifacts(self.dir, self._entries(), self.where)
        entry = image.target
        raw_target = layout.manifest(str(entry.digest)) if entry.media_type in INDEX_TYPES else None
        return Attached(layout, (raw_target, entry.media_type) if raw_target else None)
