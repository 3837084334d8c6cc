"""The podman sink: ``podman load`` fed a docker-archive built on the fly, then ``podman image
inspect`` (importer/engines/podmanclient.py) to read back what containers/storage holds (image
ID = config digest, ``RootFS.Layers`` = diff_ids). ``--root``, ``--runroot`` and
``--storage-driver`` are passed through, so any storage (vfs, overlay, a CRI-O node's store) can be the target.

References are stored in their full form (``docker.io/library/app:1``), the name the bundle ref
means to Docker; podman itself would turn a short name in a docker-archive into
``localhost/app:1``. ``podman run app:1`` finds either.

Note: ``podman load`` copies its input to a temporary file first (``$TMPDIR``, default
``/var/tmp``), so that folder needs room for the uncompressed images."""

from __future__ import annotations

import tarfile
from typing import Dict, List, Optional, Sequence

from importer.engines import EngineImage, EngineInfo
from importer.engines.podmanclient import PODMAN_HINT, PodmanClient
from importer.format.digest import Digest, is_digest
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.refs import familiar, normalize
from importer.input.opened import BundleRoot, bundle_folder
from importer.input.tarscan import ArchiveScan, layer_bound, scan_tar
from importer.sinks import DeltaBase, ProgressFn, SinkBase, SinkCapabilities
from importer.sinks.delta import image_holders, pick_holders, require_base, splice_engine_layers
from importer.sinks.dockerarchive import write_docker_archive
from importer.streams.commands import StdinCommand, command_stdout, feed

_HINT = PODMAN_HINT


class PodmanSink(SinkBase):
    kind = "podman"
    capabilities = SinkCapabilities(loads_docker_archive=True, completes_deltas=True, lists_tags=True,
                                    lists_images=True, reexports=True)

    def __init__(self, root: Optional[str] = None, runroot: Optional[str] = None,
                 storage_driver: Optional[str] = None) -> None:
        self.client = PodmanClient(root, runroot, storage_driver)
        self.root, self.runroot, self.storage_driver = root, runroot, storage_driver

    def argv(self, *args: str) -> List[str]:
        return self.client.argv(*args)

    def probe(self) -> EngineInfo:
        return self.client.probe()

    def lookup(self, name: str) -> Optional[EngineImage]:
        return self.client.inspect(name)

    # === load
    def load(self, bundle_root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[DeltaBase] = None) -> None:
        """``external`` (delta bundles): diff_id -> image holding it, re-exported (``podman save``)
        and spliced into the archive, each layer hashed against its diff_id on the way."""
        root = bundle_folder(bundle_root, f"loading into {self.kind}")
        full = [ImageRecord(tuple(normalize(r) for r in image.refs), image.manifest, image.config, image.layers,
                            image.platform) for image in images]
        splice = None
        holders = image_holders(external)
        if holders:
            def splice(tar: tarfile.TarFile) -> Dict[Digest, str]:
                return splice_engine_layers(tar, self.argv(), holders, on_bytes)
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

    def tag(self, image_id: str, ref: str) -> None:
        self.client.tag(image_id, ref)

    def remove(self, image_id: str) -> None:
        self.client.remove(image_id)

    def list_tags(self, like: str = "") -> List[str]:
        """Every image name in the store, in Docker's short form (staging cleanup)."""
        return sorted({familiar(n) for n in self.client.names() if "<none>" not in n})

    # === --deep and --inventory
    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> ArchiveScan:
        argv = self.argv("save", "--format", "docker-archive", self.client.name(found.image_id))
        with command_stdout(argv, what=f"re-exporting {image.name} from podman (podman save)", hint=_HINT) as out:
            return scan_tar(out, f"podman save {found.image_id}", bound=layer_bound(image), on_bytes=on_bytes)

    def inventory(self) -> List[EngineImage]:
        return self.client.images()
