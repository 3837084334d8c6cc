"""The podman sink: ``podman load`` fed a docker-archive built on the fly, then ``podman image
inspect`` to read back what containers/storage holds (image ID = config digest, ``RootFS.Layers``
= diff_ids). ``--root``, ``--runroot`` and ``--storage-driver`` are passed through, so any
storage (vfs, overlay, a CRI-O node's store) can be the target.

References are stored in their full form (``docker.io/library/app:1``), the name the bundle ref
means to Docker; podman itself would turn a short name in a docker-archive into
``localhost/app:1``. ``podman run app:1`` finds either.

Note: ``podman load`` copies its input to a temporary file first (``$TMPDIR``, default
``/var/tmp``), so that folder needs room for the uncompressed images."""

from __future__ import annotations

import json
import tarfile
from typing import Any, Dict, List, Optional, Sequence

from importer.errors import BundleError, CommandFailed, EngineUnavailable
from importer.format.digest import Digest, is_digest
from importer.format.identity import CLASSIC
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.refs import familiar, normalize
from importer.input.opened import BundleRoot
from importer.input.tarscan import ArchiveScan, layer_bound, scan_tar
from importer.sinks import EngineImage, EngineInfo, ProgressFn, SinkBase, folder_of, inspect_each
from importer.sinks.delta import pick_holders, require_base, splice_engine_layers
from importer.sinks.dockerarchive import write_docker_archive
from importer.streams.commands import StdinCommand, command_stdout, feed, run

_HINT = ("install podman, or point the importer at its storage: --engine podman --podman-root DIR "
         "--podman-runroot DIR [--storage-driver overlay|vfs]")
_MISSING = ("image not known", "no such image", "image not found")


class PodmanSink(SinkBase):
    kind = "podman"
    loads_docker_archive = True
    completes_deltas = True
    lists_tags = True
    lists_images = True
    reexports = True

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
    def _name(name: str) -> str:
        """What to hand podman: an ID as bare hex, a reference in its full form."""
        return name[7:] if is_digest(name) else normalize(name)

    # === probe
    def probe(self) -> EngineInfo:
        try:
            res = run(self.argv("info", "--format", "json"), what="asking podman for its version",
                      timeout=120, hint=_HINT)
        except CommandFailed as e:
            last = e.stderr_tail.strip().splitlines()[-1] if e.stderr_tail.strip() else "no answer"
            raise EngineUnavailable(
                f"opening podman's storage: expected `podman info` to answer, found an error ({last})", hint=_HINT
            ) from e
        try:
            info = json.loads(res.stdout.decode("utf-8", "replace") or "{}")
        except ValueError as e:
            raise EngineUnavailable(f"reading `podman info`: expected JSON, found something else ({e})",
                                    hint=_HINT) from e
        version = (info.get("version") or {}).get("Version") if isinstance(info, dict) else None
        store = (info.get("store") or {}) if isinstance(info, dict) else {}
        if not version:
            raise EngineUnavailable("reading `podman info`: expected a version, found none", hint=_HINT)
        return EngineInfo(
            kind="podman",
            version=str(version),
            storage_driver=str(store.get("graphDriverName", "")),
            image_store=CLASSIC,
            address=str(store.get("graphRoot") or self.root or ""),
            data_root=store.get("graphRoot"),
            extra={"runRoot": store.get("runRoot")},
        )

    # === read back
    def lookup(self, name: str) -> Optional[EngineImage]:
        target = self._name(name)
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

    # === load
    def load(self, bundle_root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[Dict[Digest, str]] = None) -> None:
        """``external`` (delta bundles): diff_id -> image holding it, re-exported (``podman save``)
        and spliced into the archive, each layer hashed against its diff_id on the way."""
        root = folder_of(bundle_root, self.kind)
        full = [ImageRecord(tuple(normalize(r) for r in image.refs), image.manifest, image.config, image.layers,
                            image.platform) for image in images]
        splice = None
        if external:
            def splice(tar: tarfile.TarFile) -> Dict[Digest, str]:
                return splice_engine_layers(tar, self.argv(), external, on_bytes)
        cmd = self.archive_command("loading the bundle into podman")
        feed(cmd, lambda out: write_docker_archive(out, root, full, with_tags=True, on_bytes=on_bytes,
                                                   splice=splice))

    def prepare_delta(self, manifest: BundleManifest) -> Dict[Digest, str]:
        """The image (bare ID) holding each layer a delta leaves out, re-exported by :meth:`load`;
        DeltaBaseMissing (nothing loaded) if the store lacks one."""
        held = pick_holders((image.image_id[7:] if is_digest(image.image_id) else image.image_id, image.diff_ids)
                            for image in self.inventory())
        return require_base(manifest, held)

    def archive_command(self, what: str) -> StdinCommand:
        """``podman load`` reading a docker-archive from its stdin."""
        return StdinCommand(self.argv("load", "-q"), what=what, hint=_HINT)

    def untag(self, image_id: str, name: str) -> None:
        """Drop the name ``name`` (as podman spells it) from the image, keeping the image."""
        run(self.argv("untag", self._name(image_id), name), what=f"removing the name {name} from {image_id[:19]}",
            timeout=120)

    def tag(self, image_id: str, ref: str) -> None:
        run(self.argv("tag", self._name(image_id), normalize(ref)),
            what=f"tagging {image_id[:19]} as {normalize(ref)}", timeout=120)

    def remove(self, image_id: str) -> None:
        """Untag a name (the image goes with its last name), or remove an image by ID."""
        target = self._name(image_id)
        run(self.argv("rmi", target), what=f"removing {target} from podman", timeout=300)

    def list_tags(self) -> List[str]:
        """Every image name in the store, in Docker's short form (staging cleanup)."""
        res = run(self.argv("images", "--format", "{{.Repository}}:{{.Tag}}"), what="listing podman's images",
                  timeout=300)
        names = res.stdout.decode("utf-8", "replace").split()
        return sorted({familiar(n) for n in names if "<none>" not in n})

    # === --deep and --inventory
    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> ArchiveScan:
        argv = self.argv("save", "--format", "docker-archive", self._name(found.image_id))
        with command_stdout(argv, what=f"re-exporting {image.name} from podman (podman save)", hint=_HINT) as out:
            return scan_tar(out, f"podman save {found.image_id}", bound=layer_bound(image), on_bytes=on_bytes)

    def inventory(self) -> List[EngineImage]:
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
