"""The containerd client (``ctr`` with an address and a namespace): what the containerd sink,
the smoke suite and the exporter's ``containerd:`` source all ask containerd, apart from any
sink: the server's version, image rows, content blobs as JSON or as a stream."""

from __future__ import annotations

import json
import os
from typing import Any, List, Optional, Tuple

from importer.errors import BundleError, CommandFailed, EngineUnavailable
from importer.format.digest import is_digest
from importer.format.limits import MAX_CONFIG
from importer.streams.commands import run

DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
DEFAULT_NAMESPACE = "default"


def ctr_hint(address: str) -> str:
    return (f"start containerd, or point the importer at it: --engine containerd --address SOCKET "
            f"[--namespace k8s.io] [--snapshotter overlayfs] (tried {address})")


class CtrClient:
    def __init__(self, address: Optional[str] = None, namespace: Optional[str] = None) -> None:
        self.address = address or os.environ.get("CONTAINERD_ADDRESS") or DEFAULT_ADDRESS
        self.namespace = namespace or os.environ.get("CONTAINERD_NAMESPACE") or DEFAULT_NAMESPACE

    def argv(self, *args: str) -> List[str]:
        return ["ctr", "--address", self.address, "--namespace", self.namespace, *args]

    def run(self, *args: str, what: str, timeout: float = 300, check: bool = True) -> str:
        """``ctr ARGS``'s output (bounded); CommandFailed naming ``what`` when it fails."""
        res = run(self.argv(*args), what=what, timeout=timeout, check=check, hint=ctr_hint(self.address),
                  limit=64 * 1024 * 1024)
        return res.stdout.decode("utf-8", "replace")

    def version(self, hint: Optional[str] = None) -> str:
        """The server's version; EngineUnavailable when no containerd answers."""
        try:
            out = self.run("version", what="asking containerd for its version", timeout=60)
        except CommandFailed as e:
            last = e.stderr_tail.strip().splitlines()[-1] if e.stderr_tail.strip() else "no answer"
            raise EngineUnavailable(
                f"connecting to containerd at {self.address}: expected a running containerd, found none ({last})",
                hint=hint or ctr_hint(self.address),
            ) from e
        version = server_version(out)
        if not version:
            raise EngineUnavailable(f"connecting to containerd at {self.address}: no server answered",
                                    hint=hint or ctr_hint(self.address))
        return version

    def rows(self, *filters: str) -> List[Tuple[str, str, str]]:
        """(name, media type, target digest) of the images matching ``filters``."""
        return parse_image_rows(self.run("images", "ls", *filters, what="listing containerd's images"))

    def content_json(self, digest: str, what: str) -> Any:
        """A content blob (a manifest, index or config) parsed, bounded by MAX_CONFIG."""
        out = self.run("content", "get", digest, what=what)
        if len(out) > MAX_CONFIG:
            raise BundleError(f"{what}: expected at most {MAX_CONFIG} bytes, found more")
        try:
            return json.loads(out)
        except ValueError as e:
            raise BundleError(f"{what}: expected JSON, found something else ({e})") from e


def server_version(out: str) -> str:
    """The server version from ``ctr version``."""
    in_server = False
    for line in out.splitlines():
        if line.strip() == "Server:":
            in_server = True
        elif in_server and line.strip().startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return ""


def parse_image_rows(out: str) -> List[Tuple[str, str, str]]:
    """(REF, TYPE, DIGEST) rows of ``ctr images ls`` (its SIZE column holds spaces)."""
    rows: List[Tuple[str, str, str]] = []
    for line in out.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and is_digest(parts[2]):
            rows.append((parts[0], parts[1], parts[2]))
    return rows
