"""The podman client (the ``podman`` CLI over one storage: ``--root``, ``--runroot``,
``--storage-driver`` passed through): its info, ``podman image inspect``, names and removal. The
podman sink (importer/sinks/podman.py) loads and re-exports through it.

References are handed over in their full form (``docker.io/library/app:1``), the name a bundle
ref means to Docker; podman itself would turn a short name into ``localhost/app:1``."""

from __future__ import annotations

import json
from typing import Any, List, Optional, Sequence

from importer.engines import EngineImage, EngineInfo, inspect_each
from importer.errors import BundleError, CommandFailed, EngineUnavailable
from importer.format.digest import is_digest
from importer.format.identity import CLASSIC
from importer.format.refs import normalize
from importer.streams.commands import run

PODMAN_HINT = ("install podman, or point the importer at its storage: --engine podman --podman-root DIR "
               "--podman-runroot DIR [--storage-driver overlay|vfs]")
_MISSING = ("image not known", "no such image", "image not found")


class PodmanClient:
    def __init__(self, root: Optional[str] = None, runroot: Optional[str] = None,
                 storage_driver: Optional[str] = None) -> None:
        self.root = root
        self.runroot = runroot
        self.storage_driver = storage_driver

    def argv(self, *args: str) -> List[str]:
        base = ["podman"]
        if self.root:
            base += ["--root", self.root]
        if self.runroot:
            base += ["--runroot", self.runroot]
        if self.storage_driver:
            base += ["--storage-driver", self.storage_driver]
        return base + list(args)

    @staticmethod
    def name(name: str) -> str:
        """What to hand podman: an ID as bare hex, a reference in its full form."""
        return name[7:] if is_digest(name) else normalize(name)

    def probe(self) -> EngineInfo:
        try:
            res = run(self.argv("info", "--format", "json"), what="asking podman for its version",
                      timeout=120, hint=PODMAN_HINT)
        except CommandFailed as e:
            last = e.stderr_tail.strip().splitlines()[-1] if e.stderr_tail.strip() else "no answer"
            raise EngineUnavailable(
                f"opening podman's storage: expected `podman info` to answer, found an error ({last})",
                hint=PODMAN_HINT) from e
        try:
            info = json.loads(res.stdout.decode("utf-8", "replace") or "{}")
        except ValueError as e:
            raise EngineUnavailable(f"reading `podman info`: expected JSON, found something else ({e})",
                                    hint=PODMAN_HINT) from e
        version = (info.get("version") or {}).get("Version") if isinstance(info, dict) else None
        store = (info.get("store") or {}) if isinstance(info, dict) else {}
        if not version:
            raise EngineUnavailable("reading `podman info`: expected a version, found none", hint=PODMAN_HINT)
        return EngineInfo(
            kind="podman",
            version=str(version),
            storage_driver=str(store.get("graphDriverName", "")),
            image_store=CLASSIC,
            address=str(store.get("graphRoot") or self.root or ""),
            data_root=store.get("graphRoot"),
            extra={"runRoot": store.get("runRoot")},
        )

    def inspect(self, name: str) -> Optional[EngineImage]:
        """The image called ``name`` (a tag or an ID), or None."""
        target = self.name(name)
        res = run(self.argv("image", "inspect", target), what=f"inspecting {target} in podman", check=False,
                  timeout=120)
        if res.returncode != 0:
            if any(m in res.stderr.lower() for m in _MISSING):
                return None
            raise CommandFailed(self.argv("image", "inspect", target), res.returncode, res.stderr,
                                what=f"inspecting {target} in podman")
        docs = json.loads(res.stdout.decode("utf-8", "replace") or "[]")
        if not docs:
            return None
        return engine_image_from_podman(docs[0])

    def untag(self, image_id: str, name: str) -> None:
        """Drop the name ``name`` (as podman spells it) from the image, keeping the image."""
        run(self.argv("untag", self.name(image_id), name), what=f"removing the name {name} from {image_id[:19]}",
            timeout=120)

    def tag(self, image_id: str, ref: str) -> None:
        run(self.argv("tag", self.name(image_id), normalize(ref)),
            what=f"tagging {image_id[:19]} as {normalize(ref)}", timeout=120)

    def remove(self, image_id: str) -> None:
        """Untag a name (the image goes with its last name), or remove an image by ID."""
        target = self.name(image_id)
        run(self.argv("rmi", target), what=f"removing {target} from podman", timeout=300)

    def names(self) -> List[str]:
        """Every ``REPOSITORY:TAG`` in the store, as podman spells it (``<none>`` included)."""
        res = run(self.argv("images", "--format", "{{.Repository}}:{{.Tag}}"), what="listing podman's images",
                  timeout=300)
        return res.stdout.decode("utf-8", "replace").split()

    def images(self) -> List[EngineImage]:
        """Every image in the store (one it no longer holds, or cannot describe, left out)."""
        res = run(self.argv("images", "-q", "--no-trunc"), what="listing podman's images", timeout=300)
        ids = sorted({x[7:] if x.startswith("sha256:") else x for x in res.stdout.decode("utf-8", "replace").split()})

        def inspect(batch: Sequence[str]) -> Optional[bytes]:
            out = run(self.argv("image", "inspect", *batch), what="inspecting podman's images", timeout=600,
                      check=False)
            return out.stdout if out.returncode == 0 else None

        return inspect_each(ids, inspect, engine_image_from_podman)


def engine_image_from_podman(doc: Any) -> EngineImage:
    """What ``podman image inspect`` says: ``Id`` is the config digest as bare hex, ``Digest``
    the manifest podman wrote, ``RootFS.Layers`` the diff_ids."""
    if not isinstance(doc, dict) or not isinstance(doc.get("Id"), str):
        raise BundleError("reading `podman image inspect` output: expected an object with Id, found something else")
    image_id = doc["Id"] if doc["Id"].startswith("sha256:") else f"sha256:{doc['Id']}"
    rootfs = doc.get("RootFS")
    layers = rootfs.get("Layers") if isinstance(rootfs, dict) else None  # absent or null: no layers
    tags = doc.get("RepoTags")  # null or empty: an untagged (dangling) image
    manifest = doc.get("Digest")
    return EngineImage(
        image_id=image_id,
        diff_ids=[str(x) for x in layers] if isinstance(layers, list) else [],
        tags=[str(t) for t in tags] if isinstance(tags, list) else [],
        config_digest=image_id,
        manifest_digest=str(manifest) if is_digest(manifest) else None,
    )
