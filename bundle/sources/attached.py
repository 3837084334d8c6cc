"""Where the artifacts attached to an exported image are read (bundle schema 3.5 ``artifacts``,
importer/format/artifacts.py): :class:`ArtifactSource`, a registry repository
(:class:`RegistryArtifacts`) or an OCI layout (oci_attached.py): cosign's
``sha256-<hex>.sig``/``.att``/``.sbom`` tags and the OCI 1.1 referrers of the image's manifests
(the Referrers API, else the ``sha256-<hex>`` fallback index, which is carried too). The export
loop (bundle/exportloop.py, ``collect_artifacts``) keeps the manifests byte for byte and streams
every blob they name into the bundle's blob store, its digest and size checked; a registry that
answers with other bytes, or with more artifacts than MAX_ARTIFACTS, fails the export
(SourceError) before the bundle exists."""

from __future__ import annotations

from typing import Optional, Protocol, Tuple

from bundle.sources.records import ClosingReader
from importer.format.digest import Digest
from importer.format.limits import MAX_CONFIG
from importer.registry.client import RegistryClient
from importer.registry.referrers import fetch_referrers

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
