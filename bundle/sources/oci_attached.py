"""The artifacts attached to an image in an OCI layout (``oci:DIR[:REF]``), for
bundle/sources/attached.py: cosign's artifacts are entries of index.json named by their tag
(``sha256-<hex>.sig``, as ``cosign save`` and the importer's OCI target write them; a name
``REPO:sha256-<hex>.sig`` is found too), referrers are the manifests index.json lists whose
``subject`` is the image (the layout has no Referrers API: they are found by reading at most
MAX_SCANNED of them, each bounded). Every byte read is checked against its digest."""

from __future__ import annotations

import json
import os
from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple

from bundle.sources.records import Descriptor, as_object, load_json, text
from importer.errors import SourceError
from importer.format.digest import Digest, is_digest
from importer.format.limits import MAX_CONFIG, read_file_limited
from importer.format.mediatypes import OCI_INDEX
from importer.registry.referrers import API

MAX_SCANNED = 4096  # index.json entries read to find referrers


class LayoutArtifacts:
    repository = ""

    def __init__(self, directory: str, entries: Sequence[Descriptor], where: str) -> None:
        self.dir, self.entries, self.where = directory, entries, where

    def _read(self, digest: str, what: str) -> Optional[bytes]:
        path = os.path.join(self.dir, Digest.parse(digest).blob_path)
        if not os.path.isfile(path):
            return None
        raw = read_file_limited(path, MAX_CONFIG, what)
        if str(Digest.of_bytes(raw)) != digest:
            raise SourceError(f"{what}: expected the blob to hash to {digest}, found other bytes",
                              hint="the layout is damaged; copy it again, or export with --no-referrers")
        return raw

    def manifest(self, reference: str) -> Optional[bytes]:
        if is_digest(reference):
            return self._read(reference, f"reading {reference[:19]} in {self.where}")
        for entry in self.entries:
            name = entry.ref_name
            if name and (name == reference or name.endswith(":" + reference)):
                return self._read(str(entry.digest), f"reading {name} in {self.where}")
        return None

    def open_blob(self, digest: Digest, what: str) -> Tuple[BinaryIO, int]:
        path = os.path.join(self.dir, digest.blob_path)
        if not os.path.isfile(path):
            raise SourceError(f"{what}: expected the blob {digest} in {self.where}, found none",
                              hint="the layout is incomplete; copy it again, or export with --no-referrers")
        return open(path, "rb"), 0

    def referrers(self, subject: Digest) -> Optional[Tuple[bytes, str]]:
        """The listed manifests whose ``subject`` is ``subject``, as the Referrers API would answer."""
        found: List[Dict[str, object]] = []
        for entry in self.entries[:MAX_SCANNED]:
            short = str(entry.digest)[:19]
            if entry.digest == subject or entry.size is None or entry.size > MAX_CONFIG:
                continue
            raw = self._read(str(entry.digest), f"reading {short} in {self.where}")
            doc = as_object(load_json(raw, f"the manifest {short}")) if raw is not None else None
            sub = as_object(doc.get("subject")) if doc is not None else None
            if doc is not None and sub is not None and sub.get("digest") == str(subject):
                kind = entry.artifact_type or text(doc, "artifactType")
                found.append(Descriptor(entry.media_type, entry.digest, entry.size, artifact_type=kind).to_json())
        if not found:
            return None
        return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": found}).encode(), API
