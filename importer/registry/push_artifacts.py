"""Hand the carried artifacts on to a registry (bundle schema 3.5 ``artifacts``): after the
images' manifests and before their tags (importer/registry/push.py calls it between the two, so a
tag is written last and read back after every artifact), every signature, attestation, SBOM and referrer of a pushed
image goes into each repository the image went to, byte for byte: its blobs (skipped when the
registry holds them), then its manifest under its cosign tag (``sha256-<hex>.sig``: a tag names
the subject by digest, and the push keeps the image's digest; the name is derived from the
record's subject, never taken from bundle.json, format/artifacts.py ``handed_on_reference``) or
by digest, the ``sha256-<hex>`` fallback index last (a registry with the Referrers API indexes
the referrers itself; the fallback tag is what clients look up on one without). So ``cosign
verify --key cosign.pub`` and admission controllers find them in the offline registry. Before the
image tags each one is read back by its digest (:func:`read_back_artifacts`): one the registry
lost is a read-back mismatch naming ``REPO@DIGEST``, and no image tag is written."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from importer.errors import DigestMismatch
from importer.format.artifacts import HANDED_ON, ArtifactRecord, handed_on_reference
from importer.format.digest import Digest
from importer.format.limits import MAX_CONFIG, MAX_MANIFEST
from importer.format.manifest import BundleManifest
from importer.format.mediatypes import OCI_INDEX, OCI_MANIFEST
from importer.input.opened import BundleRoot, open_bundle_file, read_bundle_file
from importer.registry.client import RegistryClient, map_ref


def _manifest(root: BundleRoot, art: ArtifactRecord, what: str) -> bytes:
    raw = read_bundle_file(root, art.manifest.digest.blob_path, MAX_CONFIG, what)
    if Digest.of_bytes(raw) != art.manifest.digest:
        raise DigestMismatch(f"{what}: expected {art.manifest.digest}, found {Digest.of_bytes(raw)}",
                             hint="the bundle changed after it was verified; re-copy it")
    return raw


def _media_type(art: ArtifactRecord, raw: bytes) -> str:
    if art.manifest.media_type:
        return art.manifest.media_type
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        doc = {}
    return OCI_INDEX if isinstance(doc, dict) and "manifests" in doc else OCI_MANIFEST


def push_artifacts(root: BundleRoot, manifest: BundleManifest, client: RegistryClient) -> List[Dict[str, Any]]:
    """Push every artifact of every named image (the bundle already verified); what went where."""
    pushed: List[Dict[str, Any]] = []
    for image in manifest.images:
        repos = list(dict.fromkeys(map_ref(ref, client.target).repository for ref in image.refs))
        # children before what lists them (the carried order); the fallback indexes last
        ordered = sorted((a for a in image.artifacts if a.kind in HANDED_ON), key=lambda a: a.kind == "referrers-index")
        for repo in repos:
            for art in ordered:
                reference = push_record(root, client, repo, art, image.name)
                pushed.append({"image": image.name, "repository": repo, "kind": art.kind,
                               "reference": reference,
                               "digest": str(art.manifest.digest)})
    return pushed


def push_record(root: BundleRoot, client: RegistryClient, repo: str, art: ArtifactRecord, of: str) -> str:
    """One record into ``repo``: its blobs (skipped when there), then its manifest under its
    derived name (:func:`handed_on_reference`); that name. Images' records and, 3.7, a file
    artifact's signatures (importer/registry/push_files.py) go this one way."""
    reference = handed_on_reference(art)
    what = f"pushing the {art.kind} {reference} of {of} to {repo}"
    for blob in art.blobs:
        if client.blob_size(repo, blob.digest) is None:
            client.upload_blob(repo, blob.digest, blob.size,
                               lambda b=blob: open_bundle_file(root, b.digest.blob_path))  # type: ignore[misc]
    raw = _manifest(root, art, what)
    client.put_manifest(repo, reference, raw, _media_type(art, raw))
    return reference


def read_back_artifacts(client: RegistryClient, pushed: List[Dict[str, Any]]) -> List[Tuple[str, str, str]]:
    """Each record :func:`push_artifacts` pushed, read back by its digest (GET: its bytes must hash
    to it); (image, repository, problem) for each one that differs or is missing."""
    problems: List[Tuple[str, str, str]] = []
    for rec in pushed:
        repo, digest = str(rec["repository"]), str(rec["digest"])
        what = f"{repo}@{digest} ({rec['kind']} {rec['reference']} of {rec['image']})"
        got = client.get_manifest(repo, digest, MAX_MANIFEST)
        if got is None:
            problems.append((str(rec["image"]), repo, f"{what}: the registry does not have it"))
            continue
        found = str(Digest.of_bytes(got[0]))
        if found != digest:
            problems.append((str(rec["image"]), repo, f"{what}: expected its bytes to hash to {digest}, found {found}"))
    return problems
