"""The registry as an import target: :class:`RegistrySink` (probe, inventory, push: an ordinary
sink whose load is a push, ``capabilities.pushes``) and the ``bundle-import``/``bundle push``
options that make one. Importing into it is the one load route (importer/pipeline/load.py) over
importer/pipeline/registry.py's ``RegistryPayload``: the push is planned (nothing sent: tag
conflicts, a delta's base), everything sent by digest (no tag written), read back by digest, and
only then each tag written by :meth:`RegistrySink.tag` (core ``lookup``/``tag`` in registry terms:
a name is a reference the push maps into the registry, ``HOST[:PORT]/NAMESPACE/REPO:TAG``), the
file artifacts (3.6) last."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from importer.engines import EngineImage, EngineInfo
from importer.errors import UsageError
from importer.format.digest import is_digest
from importer.format.identity import OCI
from importer.format.manifest import BundleManifest
from importer.input.opened import BundleRoot
from importer.registry.access import RegistryAccess, access_from_args, add_access_arguments
from importer.registry.client import DEFAULT_CHUNK, RegistryClient, map_ref, parse_target
from importer.registry.inventory import registry_inventory
from importer.registry.push import PushPlan, PushReport, plan_push, read_back_all, send_by_digest, write_tag
from importer.registry.push_files import plan_file_pushes, push_files
from importer.registry.transcode import CHOICES, ZSTD_READERS
from importer.sinks import ProgressFactory, PushOutcome, SinkBase, SinkCapabilities
from importer.streams.progress import close_progress
from importer.streams.sizes import parse_size


class RegistrySink(SinkBase):
    kind = "registry"
    capabilities = SinkCapabilities(lists_images=True, pushes=True)

    def __init__(self, target: str, *, access: Optional[RegistryAccess] = None,
                 concurrency: int = 4, chunk_size: int = DEFAULT_CHUNK,
                 connect_to: Optional[Tuple[str, int]] = None, log: Optional[Callable[[str], None]] = None) -> None:
        self.target = parse_target(target)
        self.concurrency = concurrency
        self.client = RegistryClient(self.target, connect_to=connect_to, access=access, chunk_size=chunk_size,
                                     log=log)
        self._planned: Optional[PushPlan] = None  # this run's push: what a tag of each image names

    def probe(self) -> EngineInfo:
        version = self.client.ping()
        return EngineInfo(kind="registry", version=version, storage_driver="", image_store=OCI,
                          address=str(self.target), data_root=None,
                          extra={"scheme": self.client.scheme})

    def lookup(self, name: str) -> Optional[EngineImage]:
        """What the registry names ``name`` (a reference of the bundle's, mapped into the registry as
        the push maps it): the digest its tag names (a HEAD), or None. A bare digest names nothing
        here (a registry keeps a manifest by digest only inside a repository)."""
        if is_digest(name):
            return None
        dest = map_ref(name, self.target)
        digest = self.client.manifest_digest(dest.repository, dest.tag) if dest.tag else None
        if not digest:
            return None
        return EngineImage(image_id=digest, diff_ids=[], tags=[dest.ref(self.target)], manifest_digest=digest)

    def plan_push(self, root: BundleRoot, manifest: BundleManifest, *, move_tags: bool,
                  local: Dict[str, str]) -> PushOutcome:
        """Where everything goes, nothing sent: the file artifacts' tags and a file delta's base
        (importer/registry/push_files.py), the images' refs, manifests and tags, an image delta's base
        (importer/registry/push.py ``plan_push``)."""
        files = plan_file_pushes(manifest, self.client, move_tags=move_tags)
        if not manifest.images:
            return PushOutcome(PushReport(target=str(self.client.target)), files, [])
        plan = plan_push(root, manifest, self.client, concurrency=self.concurrency, move_tags=move_tags, local=local)
        self._planned = plan
        return PushOutcome(plan.report, files, [], plan)

    def push_by_digest(self, outcome: PushOutcome, progress: Optional[ProgressFactory]) -> None:
        """Every blob and manifest by digest, then the carried signatures and SBOMs (3.5): no tag."""
        plan = outcome.plan
        if plan is None:
            return
        send_by_digest(plan, self.client, progress=progress)
        outcome.handed_on.extend(plan.handed_on)

    def read_back(self, outcome: PushOutcome) -> None:
        """Every image read back by digest (the manifest its tags are to name), and every carried
        signature and SBOM by its digest, before any tag."""
        if outcome.plan is not None:
            read_back_all(outcome.plan, self.client, by_digest=True)

    def tag(self, image_id: str, ref: str) -> None:
        """Write ``ref``'s tag onto the image this sink pushed whose manifest is ``image_id`` (its
        index for a multi-platform image), with the exact bytes pushed by digest, then HEAD it:
        the tag must name that digest."""
        target = self._planned.tag_target(image_id) if self._planned is not None else None
        if target is None:
            raise UsageError(f"tagging {ref} in the registry {self.target}: expected an image this run pushed, "
                             f"found {image_id[:19]}")
        dest = map_ref(ref, self.target)
        if dest.tag:
            write_tag(self.client, dest.repository, dest.tag, target, dest.ref(self.target))

    def push_files(self, root: BundleRoot, outcome: PushOutcome, progress: Optional[ProgressFactory]) -> None:
        """The file artifacts (3.6), each under its tag, read back (importer/registry/push_files.py)."""
        started = time.monotonic()
        planned = outcome.files
        total = sum(f.blob.size for p in planned for f in p.artifact.files if not f.external)
        on_bytes = progress("files", total) if progress is not None and planned else None
        push_files(root, planned, self.client, on_bytes)
        close_progress(on_bytes)
        outcome.report.stats = self.client.stats.to_dict()
        outcome.report.seconds += time.monotonic() - started

    def inventory(self) -> List[EngineImage]:
        """Every image in the registry (under the namespace, if one is named): ``--inventory``."""
        return registry_inventory(self.client, workers=self.concurrency, note=_note)

    def close(self) -> None:
        self.client.close()


def _note(text: str) -> None:
    sys.stderr.write(f"note: {text}\n")


def add_registry_arguments(p: argparse.ArgumentParser) -> None:
    """The registry engine's options of ``bundle-import``."""
    p.add_argument("--registry", metavar="HOST[:PORT][/NAMESPACE]",
                   help="registry: where to push (implies --engine registry); `my/app:1` goes to "
                   "HOST:PORT/NAMESPACE/my/app:1")
    add_access_arguments(p, "registry: ")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="registry: parallel blob uploads")
    p.add_argument("--chunk-size", metavar="SIZE", default="16M",
                   help="registry: bytes per upload request (default 16M; lower it behind a proxy body limit)")
    p.add_argument("--compression", choices=CHOICES, default="keep",
                   help="registry: the layers' compression there: keep (default; a default bundle's are zstd, read "
                   f"by {ZSTD_READERS}), gzip (for Docker before 23.0) or zstd; recompressed on the way in a private "
                   "temp folder (TMPDIR), each layer's diff_id checked: same image IDs, new manifest digests "
                   "(the receipt's push.renamedManifests)")
    p.add_argument("--allow-recompressed-signed", action="store_true",
                   help="registry, with --require-signed: let --compression rewrite signed images (their signatures "
                   "then name digests the registry does not get, so `cosign verify` refuses the pushed images)")


def registry_sink(args: argparse.Namespace) -> RegistrySink:
    if not getattr(args, "registry", None):
        raise UsageError("choosing the registry engine: expected --registry HOST[:PORT][/NAMESPACE], found none")
    if args.concurrency < 1:
        raise UsageError(f"reading --concurrency: expected at least 1, found {args.concurrency}")
    return RegistrySink(args.registry, access=access_from_args(args), concurrency=args.concurrency,
                        chunk_size=parse_size(args.chunk_size, what="--chunk-size", minimum=4096))
