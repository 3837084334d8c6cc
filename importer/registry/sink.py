"""The registry as an import target: :class:`RegistrySink` (probe, inventory, the client the
push uses) and the ``bundle-import``/``bundle push`` options that make one. Importing into it is
importer/pipeline/registry.py."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, List, Optional, Tuple

from importer.errors import UsageError
from importer.format.identity import OCI
from importer.registry.auth import Credentials
from importer.registry.client import DEFAULT_CHUNK, RegistryClient, parse_target
from importer.registry.inventory import registry_inventory
from importer.registry.push import PushReport
from importer.sinks import EngineImage, EngineInfo, SinkBase
from importer.streams.sizes import parse_size


class RegistrySink(SinkBase):
    kind = "registry"
    lists_images = True

    def __init__(self, target: str, *, insecure: bool = False, credentials: Optional[Credentials] = None,
                 concurrency: int = 4, chunk_size: int = DEFAULT_CHUNK,
                 connect_to: Optional[Tuple[str, int]] = None, log: Optional[Callable[[str], None]] = None,
                 realm_credentials: bool = False) -> None:
        self.target = parse_target(target)
        self.concurrency = concurrency
        self.client = RegistryClient(self.target, connect_to=connect_to, insecure=insecure, credentials=credentials,
                                     chunk_size=chunk_size, log=log, realm_credentials=realm_credentials)
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


REALM_HELP = ("a registry login also goes to its token service (the WWW-Authenticate realm) when that is on "
              "another host or port, over HTTPS only (default: not sent there; docs/security.md)")


def add_registry_arguments(p: argparse.ArgumentParser) -> None:
    """The registry engine's options of ``bundle-import``."""
    p.add_argument("--registry", metavar="HOST[:PORT][/NAMESPACE]",
                   help="registry: where to push (implies --engine registry); `my/app:1` goes to "
                   "HOST:PORT/NAMESPACE/my/app:1")
    p.add_argument("--insecure", action="store_true",
                   help="registry: HTTPS without certificate checks, else plain HTTP (default for loopback)")
    p.add_argument("--username", metavar="USER", help="registry: user name (default: from ~/.docker/config.json)")
    p.add_argument("--password-stdin", action="store_true", help="registry: read the password from stdin")
    p.add_argument("--allow-realm-credentials", action="store_true", help="registry: " + REALM_HELP)
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
                        concurrency=args.concurrency, realm_credentials=getattr(args, "allow_realm_credentials", False),
                        chunk_size=parse_size(args.chunk_size, what="--chunk-size", minimum=4096))
