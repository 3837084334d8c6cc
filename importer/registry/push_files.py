"""Hand the files a bundle carries (schema 3.6 top-level ``artifacts``) on to a registry, as the
OCI 1.1 artifacts they are: ``bundle push`` and ``bundle-import --engine registry`` call it (no
copy of it elsewhere), after the images.

Each artifact goes to the repository and tag of its ref (``models/llama:3.1`` ->
``NAMESPACE/models/llama:3.1``, importer/registry/client.py ``map_ref``): its config and every
file's raw layer (HEAD first, skipped when the registry holds them; a blob two files share is sent
once), then its manifest under its tag, byte for byte (so the registry holds the bundle's digest),
then read back: the tag's manifest must hash to the bundle's digest and every blob must be there
with its size. A tag naming another manifest is refused before anything is sent unless the caller
allows moving tags (:func:`plan_file_pushes`, ``--force`` of ``--engine registry``; ``bundle
push`` moves them, as it does an image's). ``oras pull REGISTRY/models/llama:3.1`` then gives the
files byte for byte."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from importer.errors import DeltaBaseMissing, DigestMismatch
from importer.format.artifacts import handed_on_reference
from importer.format.digest import Digest
from importer.format.fileartifacts import FileArtifact
from importer.format.limits import MAX_MANIFEST
from importer.format.manifest import BundleManifest
from importer.input.opened import BundleRoot, open_bundle_file, read_bundle_file
from importer.registry.client import Destination, RegistryClient, map_ref
from importer.registry.push import PushReport, RegistryTagConflict, push_bundle
from importer.registry.push_artifacts import push_record
from importer.streams.progress import close_progress

ProgressFn = Callable[[int], None]
ProgressFactory = Callable[[str, int], ProgressFn]


@dataclass
class FilePush:
    """One file artifact on its way: where it goes, what the tag named before, what was read back."""

    artifact: FileArtifact
    destination: Destination
    pullable: str
    tag_was: Optional[str] = None
    status: str = "pushed"  # "pushed", "already-present", "tag-moved"
    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> Dict[str, Any]:
        return {"ref": self.artifact.ref, "pushedTo": self.pullable, "repository": self.destination.repository,
                "tag": self.destination.tag, "artifactType": self.artifact.artifact_type,
                "manifestDigest": str(self.artifact.manifest.digest), "files": len(self.artifact.files),
                "bytes": self.artifact.size, "status": self.status, "tagWas": self.tag_was,
                "blobsUploaded": self.blobs_uploaded, "bytesUploaded": self.bytes_uploaded,
                "readBack": {"ok": self.ok, "problems": list(self.problems)}}


def push_all(root: BundleRoot, manifest: BundleManifest, client: RegistryClient, *, concurrency: int,
             move_tags: bool, progress: Optional[ProgressFactory], local: Dict[str, str],
             artifacts: List[Dict[str, Any]]) -> Tuple[PushReport, List[FilePush]]:
    """What ``bundle push`` and ``--engine registry`` both do with a verified bundle: every file
    artifact's tag checked first (nothing sent on a conflict), the images (importer/registry/push.py;
    the 3.5 signatures and SBOMs handed on and read back before their tags, appended to ``artifacts``), then
    the file artifacts, each read back. A bundle of files alone pushes no image. The images go in
    the registry import's order (:func:`push_bundle`: by digest, read back by digest, then the tags),
    so a mismatch raises (exit 8) before any tag is written and before any file artifact is sent."""
    planned = plan_file_pushes(manifest, client, move_tags=move_tags)
    if manifest.images:
        report = push_bundle(root, manifest, client, concurrency=concurrency, move_tags=move_tags, progress=progress,
                             local=local, handed_on=artifacts)
    else:
        report = PushReport(target=str(client.target))
    started = time.monotonic()
    total = sum(f.blob.size for p in planned for f in p.artifact.files if not f.external)
    on_bytes = progress("files", total) if progress is not None and planned else None
    push_files(root, planned, client, on_bytes)
    close_progress(on_bytes)
    report.stats = client.stats.to_dict()
    report.seconds += time.monotonic() - started
    return report, planned


def read_back_problems(report: PushReport, files: List[FilePush]) -> List[str]:
    """Every read-back problem of the push, one line each (images and file artifacts); none: it
    went well."""
    lines = [f"{r.pullable}: {'; '.join(r.readback.problems)}" for r in report.refs if not r.readback.ok]
    return lines + [f"{p.pullable}: {'; '.join(p.problems)}" for p in files if not p.ok]


def plan_file_pushes(manifest: BundleManifest, client: RegistryClient, *, move_tags: bool) -> List[FilePush]:
    """Where each file artifact goes and what its tag names now; a tag on another manifest is
    refused (nothing sent) unless ``move_tags``. Call it before anything is pushed."""
    planned: List[FilePush] = []
    for art in manifest.file_artifacts:
        dest = map_ref(art.ref, client.target)
        push = FilePush(art, dest, dest.ref(client.target))
        push.tag_was = client.manifest_digest(dest.repository, dest.tag) if dest.tag else None
        planned.append(push)
    _check_held(planned, client)
    conflicts = [p for p in planned if p.tag_was and p.tag_was != str(p.artifact.manifest.digest)]
    if conflicts and not move_tags:
        first = conflicts[0]
        raise RegistryTagConflict(
            f"tagging {first.pullable}: expected it free or on {first.artifact.manifest.digest.short}, "
            f"found it on another manifest ({first.tag_was})",
            context="\n".join(f"{p.pullable}: {p.tag_was}" for p in conflicts),
            hint="nothing was pushed; re-run with --force to move the tag")
    return planned


def _check_held(planned: List[FilePush], client: RegistryClient) -> None:
    """A file delta (3.8): every file it leaves out must be in the destination repository with its
    size (HEAD), else nothing is pushed (exit 9, as for an image delta)."""
    missing = []
    for push in planned:
        for f in push.artifact.held_files():
            size = client.blob_size(push.destination.repository, f.blob.digest)
            if size is None or (size >= 0 and size != f.blob.size):
                missing.append(f"registry lacks file {f.title} ({f.blob.digest}) required by {push.pullable}")
    if missing:
        raise DeltaBaseMissing(
            f"checking the base of a file delta: expected the registry {client.target} to hold {len(missing)} "
            f"file(s) the bundle leaves out, found {len(missing)} missing",
            context="\n".join(missing[:20]),
            hint="nothing was pushed; push the base version's bundle to this repository first, or re-export "
            "without --have (or with --have from this registry's inventory)")


def push_files(root: BundleRoot, planned: List[FilePush], client: RegistryClient,
               on_bytes: Optional[ProgressFn] = None) -> List[FilePush]:
    """Push each planned artifact (the bundle already verified): blobs, manifest under its tag,
    then read every one back. The caller refuses a push whose read-back found problems."""
    for push in planned:
        _push_one(root, push, client, on_bytes)
    for push in planned:
        push.problems = read_back_files(client, push)
    return planned


def _push_one(root: BundleRoot, push: FilePush, client: RegistryClient, on_bytes: Optional[ProgressFn]) -> None:
    art, repo = push.artifact, push.destination.repository
    sent = set()
    for blob in (art.config, *(f.blob for f in art.files if not f.external)):  # held ones: checked there
        if blob.digest in sent:
            continue
        sent.add(blob.digest)
        found = client.blob_size(repo, blob.digest)
        if found is not None and (found < 0 or found == blob.size):
            continue
        client.upload_blob(repo, blob.digest, blob.size,
                           lambda b=blob: open_bundle_file(root, b.digest.blob_path), on_bytes)  # type: ignore[misc]
        push.blobs_uploaded += 1
        push.bytes_uploaded += blob.size
    for sig in art.signatures:  # 3.7: its cosign signatures under sha256-<hex>.sig, before its own tag
        push_record(root, client, repo, sig, art.ref)
    want = str(art.manifest.digest)
    if push.tag_was == want and not push.blobs_uploaded:
        push.status = "already-present"
        return
    raw = read_bundle_file(root, art.manifest.digest.blob_path, MAX_MANIFEST, f"the manifest of {art.ref}")
    if Digest.of_bytes(raw) != art.manifest.digest:
        raise DigestMismatch(f"pushing {art.ref}: expected its manifest to hash to {want}, found "
                             f"{Digest.of_bytes(raw)}", hint="the bundle changed after it was verified; re-copy it")
    client.put_manifest(repo, push.destination.tag or want, raw, art.manifest.media_type)
    push.status = "tag-moved" if push.tag_was and push.tag_was != want else "pushed"


def read_back_files(client: RegistryClient, push: FilePush) -> List[str]:
    """What the registry holds under the artifact's tag: the bundle's manifest, byte for byte,
    and every blob it names with its size."""
    art, repo = push.artifact, push.destination.repository
    want = str(art.manifest.digest)
    got = client.get_manifest(repo, push.destination.tag or want, MAX_MANIFEST)
    if got is None:
        return [f"{push.pullable}: the registry does not have it"]
    raw, _media_type, header_digest = got
    problems = []
    found = str(Digest.of_bytes(raw))
    if found != want:
        problems.append(f"manifest: expected {want}, found {found}")
    if header_digest and header_digest != found:
        problems.append(f"manifest: the registry names it {header_digest}, its bytes hash to {found}")
    for sig in art.signatures:  # 3.7: each signature under its cosign tag
        tag = handed_on_reference(sig)
        held = client.manifest_digest(repo, tag)
        if held != str(sig.manifest.digest):
            problems.append(f"signature {tag}: expected {sig.manifest.digest.short}, found {held or 'none'}")
    for blob in (art.config, *(f.blob for f in art.files)):
        size = client.blob_size(repo, blob.digest)
        if size is None:
            problems.append(f"blob {blob.digest.short}: missing from {repo}")
        elif size >= 0 and size != blob.size:
            problems.append(f"blob {blob.digest.short}: expected {blob.size} bytes, found {size}")
    return problems
