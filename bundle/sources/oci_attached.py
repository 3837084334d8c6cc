"""The artifacts attached to an image in an OCI layout (``oci:DIR[:REF]``), for
bundle/sources/attached.py: cosign's artifacts are entries of index.json named by their tag
(``sha256-<hex>.sig``, as ``cosign save`` and the importer's OCI target write them; a name
``REPO:sha256-<hex>.sig`` is found too), referrers are the manifests index.json lists whose
``subject`` is the image (the layout has no Referrers API: they are found by reading at most
MAX_SCANNED of them, each bounded). Every byte read is checked against its digest."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from importer.errors import SourceError
from importer.format.digest import Digest, is_digest
from importer.format.limits import MAX_CONFIG, parse_json, read_file_limited
from importer.format.mediatypes import OCI_INDEX, REF_NAME_ANNOTATION
from importer.registry.referrers import API

MAX_SCANNED = 4096  # index.json entries read to find referrers


class LayoutArtifacts:
    repository = ""

    def __init__(self, directory: str, entries: List[Dict[str, Any]], where: str) -> None:
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
            name = (entry.get("annotations") or {}).get(REF_NAME_ANNOTATION)
            if isinstance(name, str) and (name == reference or name.endswith(":" + reference)) and \
                    is_digest(entry.get("digest")):
                return self._read(str(entry["digest"]), f"reading {name} in {self.where}")
        return None

    def open_blob(self, digest: Digest, what: str) -> Tuple[Any, int]:
        path = os.path.join(self.dir, digest.blob_path)
        if not os.path.isfile(path):
            raise SourceError(f"{what}: expected the blob {digest} in {self.where}, found none",
                              hint="the layout is incomplete; copy it again, or export with --no-referrers")
        return open(path, "rb"), 0

    def referrers(self, subject: Digest) -> Optional[Tuple[bytes, str]]:
        """The listed manifests whose ``subject`` is ``subject``, as the Referrers API would answer."""
        found: List[Dict[str, Any]] = []
        for entry in self.entries[:MAX_SCANNED]:
            digest = entry.get("digest")
            if not is_digest(digest) or digest == str(subject) or not isinstance(entry.get("size"), int) \
                    or entry["size"] > MAX_CONFIG:
                continue
            raw = self._read(str(digest), f"reading {str(digest)[:19]} in {self.where}")
            doc = parse_json(raw, f"the manifest {str(digest)[:19]}") if raw is not None else None
            sub = doc.get("subject") if isinstance(doc, dict) else None
            if isinstance(sub, dict) and sub.get("digest") == str(subject):
                desc = {"mediaType": entry.get("mediaType"), "digest": digest, "size": entry["size"]}
                kind = entry.get("artifactType") or (doc.get("artifactType") if isinstance(doc, dict) else None)
                if isinstance(kind, str) and kind:
                    desc["artifactType"] = kind
                found.append(desc)
        if not found:
            return None
        return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": found}).encode(), API
