"""Put an image into a loopback registry with *uncompressed* layers, for the pull probe.

The import target mentions a loopback-registry load path (`docker pull` from 127.0.0.1:PORT
instead of `docker load`). Docker 20.10 cannot pull zstd layers (that came with 23.0), so such
a path would serve the layers uncompressed (digest = diff_id). This helper pushes exactly that
(from a plain `docker save` archive, classic layout) so `bench/run.py` can time `docker pull`
side by side with `docker load` and `bundle-import` before anyone builds the path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import tarfile
from pathlib import Path

from importer.format.digest import Digest
from importer.registry.client import RegistryClient, parse_target

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def push_uncompressed(archive: Path, scratch: Path, ref: str) -> None:
    """`ref` is HOST:PORT/REPO:TAG; the archive is extracted to `scratch` (removed by the caller)."""
    with tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
    entry = json.loads((scratch / "manifest.json").read_text())[0]
    target = parse_target(ref.rsplit(":", 1)[0].split("/", 1)[0])
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    with RegistryClient(target) as client:
        client.ping()
        layers = []
        for name in entry["Layers"]:
            path = scratch / name
            digest, size = _sha256(path), path.stat().st_size
            client.upload_blob(repo, Digest.parse(digest), size, functools.partial(path.open, "rb"))
            layers.append({"mediaType": LAYER_TAR, "size": size, "digest": digest})
        config = scratch / entry["Config"]
        client.upload_blob(repo, Digest.parse(_sha256(config)), config.stat().st_size,
                           functools.partial(config.open, "rb"))
        manifest = {
            "schemaVersion": 2, "mediaType": MANIFEST_V2,
            "config": {"mediaType": CONFIG_V1, "size": config.stat().st_size, "digest": _sha256(config)},
            "layers": layers,
        }
        client.put_manifest(repo, tag, json.dumps(manifest).encode(), MANIFEST_V2)
