"""What a registry has attached to an exported image, carried with it (bundle schema 3.5
``artifacts``, importer/format/artifacts.py): cosign's ``sha256-<hex>.sig``/``.att``/``.sbom``
tags and the OCI 1.1 referrers of the image's manifests (the Referrers API, else the
``sha256-<hex>`` fallback index, which is carried too). Manifests are kept byte for byte and
every blob they name is streamed into the bundle's blob store with its digest and size checked;
a registry that answers with other bytes, or with more artifacts than MAX_ARTIFACTS, fails the
export (SourceError) before the bundle exists."""

from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from bundle.blobstore import BlobStore
from bundle.sources.records import ClosingReader, Descriptor, JsonObject, as_object, list_of, load_json, text
from importer.errors import SourceError
from importer.format.artifacts import MAX_ARTIFACTS, TAG_SUFFIXES, ArtifactRecord
from importer.format.digest import CHUNK, BlobRef, Digest, is_digest
from importer.format.limits import MAX_CONFIG
from importer.registry.client import RegistryClient
from importer.registry.referrers import FALLBACK_TAG, fallback_tag, fetch_referrers

#: an artifact blob (an SBOM, an attestation) larger than this is refused, not carried
MAX_ARTIFACT_BLOB = 512 * 1024 * 1024


class ArtifactSource(Protocol):
    """Where attached artifacts are read: a registry repository, or an OCI layout (oci_attached.py)."""

    #: HOST[:PORT]/REPO the artifacts are recorded as read from ("" for a layout)
    repository: str

    def manifest(self, reference: str) -> Optional[bytes]:
        """The exact bytes of the manifest a tag or digest names, None when there is none."""

    def open_blob(self, digest: Digest, what: str) -> Tuple[ClosingReader, int]:
        """(a readable the caller closes, the offset of its first byte)."""

    def referrers(self, subject: Digest) -> Optional[Tuple[bytes, str]]:
        """(a referrers index, API or FALLBACK_TAG), or None: see importer/registry/referrers.py."""


class RegistryArtifacts:
    """The artifacts of one repository of a registry."""

    def __init__(self, client: RegistryClient, host: str, repo: str) -> None:
        self.client, self.repo, self.repository = client, repo, f"{host}/{repo}"

    def manifest(self, reference: str) -> Optional[bytes]:
        got = self.client.get_manifest(self.repo, reference, MAX_CONFIG)
        return got[0] if got is not None else None

    def open_blob(self, digest: Digest, what: str) -> Tuple[ClosingReader, int]:
        return self.client.open_blob(self.repo, digest, what=what)

    def referrers(self, subject: Digest) -> Optional[Tuple[bytes, str]]:
        return fetch_referrers(self.client, self.repo, subject)


class _Collector:
    def __init__(self, src: ArtifactSource, store: BlobStore, doing: str) -> None:
        self.src, self.store, self.doing = src, store, doing
        self.repository = src.repository
        self.records: List[ArtifactRecord] = []
        self.seen: Dict[str, None] = {}

    def _add(self, record: ArtifactRecord) -> None:
        if str(record.manifest.digest) in self.seen:
            return
        if len(self.records) >= MAX_ARTIFACTS:
            raise SourceError(f"{self.doing}: expected at most {MAX_ARTIFACTS} artifacts attached to the image, "
                              "found more", hint="export with --no-referrers, or clean up the registry's artifacts")
        self.seen[str(record.manifest.digest)] = None
        self.records.append(record)

    def blob(self, value: object, what: str) -> BlobRef:
        """One blob a manifest names, streamed into the store, digest and size checked."""
        desc = Descriptor.of(value)
        if desc is None or desc.size is None or desc.size > MAX_ARTIFACT_BLOB:
            raise SourceError(f"{what}: expected a descriptor with a sha256 digest and a size of at most "
                              f"{MAX_ARTIFACT_BLOB} bytes, found {str(value)[:200]!r}",
                              hint="the registry holds a damaged artifact; export with --no-referrers")
        if desc.digest.blob_path not in self.store.written:
            self._copy(desc.digest, desc.size, f"{what}, blob {desc.digest.short}")
        return BlobRef(desc.media_type, desc.digest, desc.size)

    def _copy(self, digest: Digest, size: int, what: str) -> None:
        f, start = self.src.open_blob(digest, what)
        hasher = hashlib.sha256()
        n = 0
        try:
            with self.store.temp() as (out, tmp):
                while True:
                    chunk = f.read(CHUNK)
                    if not chunk:
                        break
                    n += len(chunk)
                    if n > size:
                        break
                    hasher.update(chunk)
                    out.write(chunk)
                found = Digest("sha256", hasher.hexdigest())
                if n != size or found != digest or start != 0:
                    raise SourceError(f"{what}: expected {size} bytes hashing to {digest}, found "
                                      f"{'more than ' if n > size else ''}{n} bytes hashing to {found}",
                                      hint="the registry answered with other bytes; do not trust this registry")
        finally:
            f.close()
        self.store.commit(tmp, digest, size)

    def manifest(self, reference: str, what: str) -> Optional[Tuple[bytes, JsonObject]]:
        raw = self.src.manifest(reference)
        if raw is None:
            return None
        if is_digest(reference) and str(Digest.of_bytes(raw)) != reference:
            raise SourceError(f"{what}: expected the manifest to hash to {reference}, found {Digest.of_bytes(raw)}",
                              hint="the registry answered with other bytes; do not trust this registry")
        value = load_json(raw, what)
        doc = as_object(value)
        if doc is None:
            raise SourceError(f"{what}: expected a JSON object (an OCI manifest or index), found "
                              f"{type(value).__name__}", hint="export with --no-referrers to leave it out")
        return raw, doc

    def carry(self, kind: str, subject: Digest, raw: bytes, doc: JsonObject, what: str, *, tag: str = "",
              artifact_type: str = "", depth: int = 0) -> None:
        """A manifest (its config and layers) or an index (each manifest it lists, a record of its own)."""
        stored = self.store.write_bytes(raw)
        blobs: List[BlobRef] = []
        listed = doc.get("manifests")
        if isinstance(listed, list):
            for n, entry in enumerate(listed[:MAX_ARTIFACTS]):
                desc = Descriptor.of(entry)
                if depth > 0 or desc is None:
                    continue
                got = self.manifest(str(desc.digest), f"{what}, manifest {n}")
                if got is not None:
                    sub_type = desc.artifact_type or text(got[1], "artifactType")
                    sub_kind = "referrer" if kind == "referrers-index" else kind
                    self.carry(sub_kind, subject, got[0], got[1], f"{what}, manifest {n}", artifact_type=sub_type,
                               depth=depth + 1)
        else:
            hint = "the registry holds a damaged artifact; export with --no-referrers"
            for value in [doc.get("config"), *list_of(doc, "layers", what, hint=hint)]:
                if value is not None:
                    blobs.append(self.blob(value, what))
        self._add(ArtifactRecord(kind, subject, BlobRef(text(doc, "mediaType"), stored.digest, stored.size),
                                 tuple(blobs), tag, artifact_type or text(doc, "artifactType"), self.repository))

    def collect(self, subject: Digest) -> None:
        for kind, suffix in TAG_SUFFIXES.items():
            tag = fallback_tag(subject) + suffix
            got = self.manifest(tag, f"{self.doing}: the {kind} {tag}")
            if got is not None:
                self.carry(kind, subject, got[0], got[1], f"{self.doing}: the {kind} {tag}", tag=tag)
        found = self.src.referrers(subject)
        if found is None:
            return
        raw, via = found
        what = f"{self.doing}: the referrers of {subject.short}"
        doc = as_object(load_json(raw, what))
        listed = doc.get("manifests") if doc is not None else None
        if doc is None or not isinstance(listed, list):
            return  # a tag of that name that is no index: not a referrers list
        if via == FALLBACK_TAG:  # the index itself is a tagged manifest of the registry: carried
            self.carry("referrers-index", subject, raw, doc, what, tag=fallback_tag(subject))
            return
        for n, entry in enumerate(listed[:MAX_ARTIFACTS + 1]):
            desc = Descriptor.of(entry)
            if desc is not None:
                got = self.manifest(str(desc.digest), f"{what}, manifest {n}")
                if got is not None:
                    self.carry("referrer", subject, got[0], got[1], f"{what}, manifest {n}",
                               artifact_type=desc.artifact_type)


def collect_artifacts(src: ArtifactSource, subjects: Sequence[Digest], store: BlobStore,
                      doing: str, *, picked_from: Optional[Tuple[bytes, str]] = None) -> Tuple[ArtifactRecord, ...]:
    """Every artifact attached to one of ``subjects`` (an image's manifests and index) in ``src``.
    ``picked_from``: (bytes, media type) of the image index one platform was picked from (the
    first subject); carried as kind ``index`` when something is attached to it, so that a
    signature on the index can be checked offline against the carried platform's manifest."""
    collector = _Collector(src, store, doing)
    for subject in dict.fromkeys(subjects):
        collector.collect(subject)
    records = collector.records
    if picked_from is not None and any(r.subject == subjects[0] for r in records):
        stored = store.write_bytes(picked_from[0])
        records.append(ArtifactRecord("index", stored.digest, BlobRef(picked_from[1], stored.digest, stored.size),
                                      repository=collector.repository))
    return tuple(records)
