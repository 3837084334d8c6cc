"""The registry as an import target: :class:`RegistrySink` (probe, inventory, push: an ordinary
sink whose load is a push, ``capabilities.pushes``) and the ``bundle-import``/``bundle push``
options that make one. Importing into it is importer/pipeline/registry.py."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from importer.engines import EngineImage, EngineInfo
from importer.errors import UsageError
from importer.format.identity import OCI
from importer.format.manifest import BundleManifest
from importer.input.opened import BundleRoot
from importer.registry.access import RegistryAccess, access_from_args, add_access_arguments
from importer.registry.client import DEFAULT_CHUNK, RegistryClient, parse_target
from importer.registry.inventory import registry_inventory
from importer.registry.push_files import push_all
from importer.registry.transcode import CHOICES, ZSTD_READERS
from importer.sinks import ProgressFactory, PushOutcome, SinkBase, SinkCapabilities
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

    def probe(self) -> EngineInfo:
        version = self.client.ping()
        return EngineInfo(kind="registry", version=version, storage_driver="", image_store=OCI,
                          address=str(self.target), data_root=None,
                          extra={"scheme": self.client.scheme})

    def push(self, root: BundleRoot, manifest: BundleManifest, *, move_tags: bool,
             progress: Optional[ProgressFactory], local: Dict[str, str]) -> PushOutcome:
        """The same push as ``bundle push`` (importer/registry/push_files.py), on this sink's client."""
        handed_on: List[Dict[str, Any]] = []
        report, files = push_all(root, manifest, self.client, concurrency=self.concurrency, move_tags=move_tags,
                                 progress=progress, local=local, artifacts=handed_on)
        return PushOutcome(report, files, list(handed_on))

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
