"""``bundle push BUNDLE REGISTRY[/NAMESPACE]``: verify, (tunnel,) push, read back.

Thin over importer/registry/push.py, which the importer shares for ``--engine registry``. With
``--ssh`` REGISTRY is the registry as the SSH host sees it; the push goes through a tunnel that is
closed whatever happens. Cheap checks first: the tunnel (the SSH host and its key) and the
registry (it answers, it takes the login) before every byte is verified."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from bundle.sshtunnel import SshTarget, SshTunnel, terminate_as_interrupt
from importer.errors import PolicyRejected, PostLoadMismatch
from importer.format.manifest import BundleManifest
from importer.input.opened import BundleRoot, open_bundle
from importer.registry.access import RegistryAccess
from importer.registry.client import DEFAULT_CHUNK, RegistryClient, parse_target
from importer.registry.push import PushReport
from importer.registry.push_files import FilePush, push_all, read_back_problems
from importer.registry.transcode import (
    Transcoded,
    has_zstd,
    new_workdir,
    remove_workdir,
    signatures_lost,
    signed_and_rewritten,
    transcode,
    zstd_warning,
)
from importer.verify.cosign import images_signed
from importer.verify.opened import verify_or_raise

ProgressFactory = Callable[[str, int], Callable[[int], None]]


@dataclass
class PushOutcome:
    report: PushReport
    via: Optional[str]
    scheme: str
    api_version: str
    compression: str = "keep"
    renamed: Dict[str, str] = field(default_factory=dict)  # the bundle's manifest/index digest -> the pushed one
    #: schema 3.5: the signatures, attestations, SBOMs and referrers pushed beside the images
    artifacts: List[Dict[str, Any]] = field(default_factory=list)
    #: --require-signed: which key signed which image (None without it)
    image_signatures: Optional[List[Dict[str, Any]]] = None
    #: schema 3.6: the file artifacts pushed under their refs and read back (importer/registry/push_files.py)
    files: List[FilePush] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not read_back_problems(self.report, self.files) and bool(self.report.refs or self.files)

    def to_dict(self) -> Dict[str, Any]:
        doc = self.report.to_dict()
        doc["ok"] = self.ok
        doc["fileArtifacts"] = [p.to_dict() for p in self.files]
        doc["compression"] = self.compression
        doc["renamedManifests"] = dict(self.renamed)
        doc["artifacts"] = self.artifacts
        doc["imageSignatures"] = self.image_signatures
        doc["via"] = self.via
        doc["scheme"] = self.scheme
        doc["apiVersion"] = self.api_version
        return doc


@contextlib.contextmanager
def _route(target_host: str, ssh: Optional[SshTarget], insecure: bool) -> Iterator[Optional[int]]:
    if ssh is None:
        yield None
        return
    with SshTunnel(ssh, target_host, default_port=80 if insecure else 443) as port:
        yield port


def push(
    bundle: str,
    registry: str,
    *,
    access: Optional[RegistryAccess] = None,
    concurrency: int = 4,
    chunk_size: int = DEFAULT_CHUNK,
    ssh: Optional[SshTarget] = None,
    progress: Optional[ProgressFactory] = None,
    log: Optional[Callable[[str], None]] = None,
    compression: str = "keep",
    require_signed: Sequence[str] = (),
    allow_recompressed_signed: bool = False,
) -> PushOutcome:
    """``require_signed``: cosign keys one of which must sign every image (as at import), checked
    before any byte is verified or sent; ``allow_recompressed_signed``: let ``compression`` rewrite
    signed images under it (their signatures then name digests the registry never gets).
    ``access``: logins, CA certificates, ``--insecure`` (importer/registry/access.py)."""
    target = parse_target(registry)
    access = access or RegistryAccess()
    opened = open_bundle(bundle)
    root = opened
    signed: List[Dict[str, Any]] = []
    if require_signed:
        major = opened.schema_major()
        signed = images_signed(opened, require_signed, major if major in (1, 2) else None, quiet=log is None,
                               on_notice=log or (lambda _line: None), doing="pushing with --require-signed")
    lost = signed_and_rewritten(opened.manifest(), compression) if opened.schema_major() == 3 else []
    if lost and require_signed and not allow_recompressed_signed:
        raise PolicyRejected(signatures_lost("pushing with --require-signed", compression, lost),
                             hint="push with --compression keep (Docker before 23.0 reads no zstd: pull those "
                             "nodes through `bundle-import serve`), or pass --allow-recompressed-signed")
    if lost and log is not None:
        log(signatures_lost("push", compression, lost))
    with terminate_as_interrupt(), _route(target.host, ssh, access.insecure) as port:
        connect = ("127.0.0.1", port) if port is not None else None
        with RegistryClient(target, connect_to=connect, access=access, chunk_size=chunk_size, log=log) as client:
            client.ping()  # it answers and takes the login, before every byte is verified
            manifest = verify_or_raise(opened, progress=progress).manifest
            assert manifest is not None
            workdir = new_workdir("sneakernet-push-") if compression != "keep" else ""
            try:
                done = transcode(root, manifest, compression, workdir)
                if log is not None and any(has_zstd(image) for image in done.images):
                    log(zstd_warning("push"))
                outcome = _push(done.manifest(manifest), root, client, concurrency, progress, done, compression,
                                f"ssh {ssh.describe()} -> 127.0.0.1:{port}" if ssh else None)
            finally:
                remove_workdir(workdir)
    outcome.image_signatures = signed if require_signed else None
    bad = read_back_problems(outcome.report, outcome.files)
    if bad:
        raise PostLoadMismatch(
            f"reading back from {target}: expected every pushed image and file artifact to match bundle.json, "
            f"found {len(bad)} mismatch(es)",
            context="\n".join(bad),
            hint="push again (blobs already there are skipped); if it persists the registry rewrites images",
        )
    return outcome


def _push(manifest: BundleManifest, root: BundleRoot, client: RegistryClient, concurrency: int,
          progress: Optional[ProgressFactory], done: Transcoded, compression: str, via: Optional[str]) -> PushOutcome:
    artifacts: List[Dict[str, Any]] = []  # handed on before the tags, read back after them
    report, files = push_all(root, manifest, client, concurrency=concurrency, move_tags=True, progress=progress,
                             local=done.files, artifacts=artifacts)
    outcome = PushOutcome(report, via, client.scheme, client.api_version, compression, dict(done.renamed))
    outcome.artifacts = artifacts
    outcome.files = files
    return outcome
