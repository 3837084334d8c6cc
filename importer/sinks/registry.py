"""A registry as the import target (``bundle-import BUNDLE --engine registry --registry HOST:PORT``).

The multi-node path: the offline host's registry receives the verified bundle and every node
pulls from it. The same push code as ``bundle push`` (importer/registrypush.py); the check after
"loading" is the read-back: the registry keeps the bundle's own manifests, so the image ID is
the bundle's manifest digest (identity rule ``manifest-digest``) and the config and diff_ids
must be the bundle's. Tags already naming another manifest are refused without ``--force``.
A delta bundle completes from the registry: its left-out layers must be there or be mounted from
another repository (importer/registrydelta.py), else exit 9 with nothing pushed."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from importer.errors import PostLoadMismatch, UsageError
from importer.identity import OCI
from importer.importing import ImportResult, verify_or_raise
from importer.opened import OpenedBundle
from importer.postload import ImageCheck, check_image
from importer.registry import DEFAULT_CHUNK, RegistryClient, parse_target
from importer.registryauth import Credentials
from importer.registryinventory import registry_inventory
from importer.registrypush import PushedRef, PushReport, push_bundle
from importer.sinks import EngineImage, EngineInfo
from importer.sizes import parse_size
from importer.verify import VerifyReport

ProgressFactory = Callable[[str, int], Callable[[int], None]]


class RegistrySink:
    kind = "registry"

    def __init__(self, target: str, *, insecure: bool = False, credentials: Optional[Credentials] = None,
                 concurrency: int = 4, chunk_size: int = DEFAULT_CHUNK,
                 connect_to: Optional[Tuple[str, int]] = None, log: Optional[Callable[[str], None]] = None) -> None:
        self.target = parse_target(target)
        self.concurrency = concurrency
        self.client = RegistryClient(self.target, connect_to=connect_to, insecure=insecure, credentials=credentials,
                                     chunk_size=chunk_size, log=log)
        self.last_push: Optional[PushReport] = None

    def probe(self) -> EngineInfo:
        version = self.client.ping()
        return EngineInfo(kind="registry", version=version, storage_driver="", image_store=OCI,
                          address=str(self.target), data_root=None,
                          extra={"scheme": self.client.scheme})

    def inventory(self) -> List[EngineImage]:
        """Every image in the registry (under the namespace, if one is named): ``--inventory``."""
        return registry_inventory(self.client, workers=self.concurrency)

    def close(self) -> None:
        self.client.close()


def checks_from_push(report: PushReport) -> List[ImageCheck]:
    """One ImageCheck per bundle image, from what the registry gave back for its tags."""
    by_image: Dict[str, List[PushedRef]] = {}
    for r in report.refs:
        by_image.setdefault(str(r.image.manifest.digest), []).append(r)
    checks: List[ImageCheck] = []
    for refs in by_image.values():
        image = refs[0].image
        problems = [p for r in refs for p in r.readback.problems]
        first = next((r.readback for r in refs if r.readback.manifest_digest), refs[0].readback)
        found = EngineImage(image_id=first.manifest_digest, diff_ids=list(first.diff_ids),
                            tags=[r.pullable for r in refs], config_digest=first.config_digest or None,
                            manifest_digest=first.manifest_digest or None, problems=problems)
        check = check_image(image, found if first.manifest_digest else None, OCI)
        check.status = "already-present" if all(r.status == "already-present" for r in refs) else "loaded"
        check.tags_applied = [r.pullable for r in refs if r.status != "already-present"]
        checks.append(check)
    return checks


def import_to_registry(
    bundle: OpenedBundle,
    sink: RegistrySink,
    *,
    force: bool = False,
    progress: Optional[ProgressFactory] = None,
    result: Optional[ImportResult] = None,
) -> ImportResult:
    """Verify every byte of the opened bundle (against the bundle.json the signature step
    judged), push, read back and compare; ``result`` is filled in as work proceeds."""
    started = time.monotonic()
    res = result or ImportResult(root=bundle.path, bundle_digest="", report=VerifyReport(root=bundle.path))
    root = bundle.root
    res.bundle_digest = str(bundle.digest)
    res.report = verify_or_raise(bundle, progress=progress)
    res.timings["verifySeconds"] = time.monotonic() - started
    manifest = res.report.manifest
    assert manifest is not None
    res.engine = sink.probe()
    t_push = time.monotonic()
    try:
        report = push_bundle(root, manifest, sink.client, concurrency=sink.concurrency, move_tags=force,
                             progress=progress)
    finally:
        sink.close()
    sink.last_push = report
    setattr(res, "registry_push", report.to_dict())  # noqa: B010 - the receipt's "push" section (importer/cli.py)
    res.timings["loadSeconds"] = time.monotonic() - t_push
    res.checks = checks_from_push(report)
    bad = [c for c in res.checks if not c.ok]
    if report.untagged:
        bad_names = ", ".join(d[:19] for d in report.untagged)
        raise PostLoadMismatch(
            f"pushing to {sink.target}: expected every image to have a name, found {len(report.untagged)} "
            f"untagged ({bad_names})",
            hint="a registry names images by repository:tag; the tagged images were pushed and checked",
        )
    if bad:
        raise PostLoadMismatch(
            "reading back what the registry holds: expected every image to match bundle.json, "
            f"found {len(bad)} mismatch(es)",
            context="\n".join(f"{c.image.name}: {c.detail}" for c in bad),
            hint="push again (blobs already there are skipped); report this with the receipt if it persists",
        )
    res.timings["totalSeconds"] = time.monotonic() - started
    return res


def add_registry_arguments(p: argparse.ArgumentParser) -> None:
    """The registry engine's options of ``bundle-import``."""
    p.add_argument("--registry", metavar="HOST[:PORT][/NAMESPACE]",
                   help="registry: where to push (implies --engine registry); `my/app:1` goes to "
                   "HOST:PORT/NAMESPACE/my/app:1")
    p.add_argument("--insecure", action="store_true",
                   help="registry: HTTPS without certificate checks, else plain HTTP (default for loopback)")
    p.add_argument("--username", metavar="USER", help="registry: user name (default: from ~/.docker/config.json)")
    p.add_argument("--password-stdin", action="store_true", help="registry: read the password from stdin")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="registry: parallel blob uploads")
    p.add_argument("--chunk-size", metavar="SIZE", default="16M",
                   help="registry: bytes per upload request (default 16M; lower it behind a proxy body limit)")


def credentials_from_args(args: argparse.Namespace) -> Optional[Credentials]:
    """``--username`` + ``--password-stdin`` (one line); None: the docker config or anonymous."""
    if not getattr(args, "username", None):
        if getattr(args, "password_stdin", False):
            raise UsageError("reading credentials: expected --username with --password-stdin, found none")
        return None
    if not getattr(args, "password_stdin", False):
        raise UsageError("reading credentials: expected --password-stdin with --username, found none",
                         hint="pipe the password: echo \"$PASSWORD\" | ... --username USER --password-stdin")
    password = sys.stdin.readline().rstrip("\r\n")
    return Credentials(args.username, password, source="--username/--password-stdin")


def registry_sink(args: argparse.Namespace) -> RegistrySink:
    if not getattr(args, "registry", None):
        raise UsageError("choosing the registry engine: expected --registry HOST[:PORT][/NAMESPACE], found none")
    if args.concurrency < 1:
        raise UsageError(f"reading --concurrency: expected at least 1, found {args.concurrency}")
    return RegistrySink(args.registry, insecure=args.insecure, credentials=credentials_from_args(args),
                        concurrency=args.concurrency,
                        chunk_size=parse_size(args.chunk_size, what="--chunk-size", minimum=4096))
