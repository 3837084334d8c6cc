"""What `bundle-import serve` answers for the artifacts a bundle carries with its images (schema
3.5 ``artifacts``): in every repository an image is served from, each artifact's manifest by
digest and under its source tag (cosign's ``sha256-<hex>.sig``/``.att``/``.sbom``, the
``sha256-<hex>`` fallback index), its blobs, those tags in ``tags/list``, and the OCI 1.1
Referrers API (``GET /v2/<name>/referrers/<digest>[?artifactType=T]``): an image index of the
carried manifests whose subject is that digest. So ``cosign verify`` and admission controllers
can read the publisher's signatures straight from the served bundle. Also the files a bundle
carries as OCI artifacts (schema 3.6, :meth:`ServedArtifacts.add_manifest`): each manifest by
digest and under its ref's tag, so ``oras pull``/``oras copy`` read them."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Set

from importer.format.artifacts import HANDED_ON, ArtifactRecord, handed_on_reference
from importer.format.manifest import ImageRecord
from importer.format.mediatypes import OCI_INDEX

REFERRERS_RE = re.compile(r"^/v2/(?P<name>.+)/referrers/(?P<digest>[^/]+)$")


class ServedArtifacts:
    """One repository's artifacts: reference (tag or digest) -> manifest digest, and the
    referrer descriptors by subject digest."""

    def __init__(self) -> None:
        self.manifests: Dict[str, str] = {}
        self.tags: Set[str] = set()
        self.referrers: Dict[str, List[Dict[str, Any]]] = {}
        self.file_tags: Set[str] = set()  # the tags of file artifacts (3.6), listed at start with the images'

    def add(self, image: ImageRecord, add_blob: Any) -> Set[str]:
        """Register ``image``'s artifacts; ``add_blob(digest, size, media_type)`` returns the digest
        text of a blob the repository serves. Returns the digests of every blob added."""
        blobs: Set[str] = set()
        for art in (a for a in image.artifacts if a.kind in HANDED_ON):
            digest = add_blob(art.manifest.digest, art.manifest.size, art.manifest.media_type)
            blobs.add(digest)
            blobs.update(add_blob(b.digest, b.size, b.media_type) for b in art.blobs)
            self.manifests[digest] = digest
            reference = handed_on_reference(art)  # its derived tag, never bundle.json's word
            if reference != str(art.manifest.digest):
                self.manifests[reference] = digest
                self.tags.add(reference)
            if art.kind == "referrer":
                self._referrer(art)
        return blobs

    def add_manifest(self, digest: str, tag: str) -> None:
        """A manifest served by ``digest`` and, when given, under ``tag`` (a file artifact, 3.6)."""
        self.manifests[digest] = digest
        if tag:
            self.manifests[tag] = digest
            self.tags.add(tag)
            self.file_tags.add(tag)

    def add_signature(self, digest: str, tag: str) -> None:
        """A file artifact's cosign signature (3.7): by ``digest`` and under its derived ``tag``."""
        self.manifests[digest] = digest
        self.manifests[tag] = digest
        self.tags.add(tag)

    def _referrer(self, art: ArtifactRecord) -> None:
        listed = self.referrers.setdefault(str(art.subject), [])
        if any(d["digest"] == str(art.manifest.digest) for d in listed):
            return
        desc: Dict[str, Any] = {"mediaType": art.manifest.media_type, "digest": str(art.manifest.digest),
                                "size": art.manifest.size}
        if art.artifact_type:
            desc["artifactType"] = art.artifact_type
        listed.append(desc)

    def index(self, subject: str, artifact_type: str = "") -> bytes:
        """The referrers of ``subject`` as an OCI image index (empty when none)."""
        listed = [d for d in self.referrers.get(subject, [])
                  if not artifact_type or d.get("artifactType") == artifact_type]
        return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed},
                          separators=(",", ":")).encode("utf-8")
