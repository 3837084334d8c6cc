"""The Docker sink: ``docker load`` fed an archive built on the fly, then ``docker image
inspect`` to read back what the engine holds.

Classic image store (any storage driver): a docker-archive, each layer decompressed once into the
stream and checked against its diff_id; image ID = config digest. From 128 MiB on, in two loads
that overlap (the engine registers the first third while the rest streams:
importer/sinks/dockersplit.py). Containerd image store (Docker 25+ with the containerd
snapshotter): an OCI archive of the bundle's own manifest, config and
compressed layers byte for byte, each entry named as Docker names it
(``io.containerd.image.name`` = ``docker.io/library/app:1``), so the engine keeps the bundle's
manifest and the image ID is the bundle's manifest digest, compared exactly. A delta bundle
whose left-out layers name compressed blobs goes in the same way, those blobs copied byte for
byte out of ``docker save`` of the image holding them (the ID is kept); one made against a Docker
inventory (left-out layers described uncompressed) goes in as a docker-archive with the engine's
layers spliced in: there the ID is the manifest Docker makes while loading (importer/format/identity.py)."""

from __future__ import annotations

import tarfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from importer.engines import EngineImage, EngineInfo
from importer.engines.dockerapi import ApiLoad, socket_path
from importer.engines.dockerclient import DOCKER_HINT, DockerClient
from importer.errors import CommandFailed
from importer.format.digest import Digest
from importer.format.identity import loads_as_docker_archive
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.mediatypes import compression_of
from importer.format.refs import normalize
from importer.input.opened import BundleRoot
from importer.input.tarscan import ArchiveScan, layer_bound, scan_tar
from importer.input.unpackcheck import UnpackCheck
from importer.sinks import DeltaBase, ProgressFn, SinkBase, SinkCapabilities
from importer.sinks.delta import copy_engine_blobs, image_holders, pick_holders, require_base, splice_engine_layers
from importer.sinks.dockerarchive import archive_layers, write_docker_archive
from importer.sinks.dockersplit import head_count, load_in_two
from importer.sinks.ociarchive import archive_blobs, write_oci_archive
from importer.streams.commands import FedCommand, StdinCommand, command_stdout, feed

_HINT = DOCKER_HINT
_NAMING_WAIT = 60.0  # seconds a failed layer check waits for the engine to name what it loads


class DockerSink(SinkBase):
    kind = "docker"
    capabilities = SinkCapabilities(
        reads_archives=True,  # load() builds its stream from the opened tar or parts in place
        checks_layers_while_loading=True, loads_docker_archive=True, completes_deltas=True, lists_tags=True,
        lists_images=True, reexports=True)

    def _loads_oci_archive(self, images: Sequence[ImageRecord]) -> bool:
        """Which archive :meth:`load` sends (and so which layer blobs it checks:
        :meth:`streamed_layers` must answer from the same choice): an OCI archive of the bundle's
        blobs into the containerd store, a docker-archive otherwise."""
        return self.image_store == "containerd" and not any(loads_as_docker_archive(x) for x in images)

    def streamed_layers(self, images: Sequence[ImageRecord]) -> Set[Digest]:
        """The layer blobs :meth:`load` sends (and checks) for ``images``: every stored blob of an
        OCI archive (containerd store), the first blob of each diff_id of a docker-archive.

        Both stores check each layer blob while it streams into ``docker load``, from the read
        that sends it: its digest and size (a layer stored uncompressed is its own diff_id, hashed
        once), and a blob's last chunk is sent only after its digest matched; a mismatch aborts the
        load before the member that names an image (manifest.json, index.json), so Docker names no
        image; and each layer's diff_id and uncompressed size (decompressed once). Classic store:
        the docker-archive decompresses each layer into the stream (importer/sinks/dockerarchive.py).
        Containerd store: the OCI archive carries the compressed blobs as they are; the diff_ids
        are checked while the engine unpacks, from a second read of each blob (its digest checked
        again), before any user tag (importer/input/unpackcheck.py), or, for an image loaded
        untagged, by a thread beside the stream from the same read (importer/input/layercheck.py).
        So the verification before the load leaves those blobs' bytes to the load, and each layer
        is decompressed once by the importer (docs/security.md)."""
        if self._loads_oci_archive(images):
            return {x.digest for image in images for x in image.layers if not x.external}
        return {x.digest for _, _, x in archive_layers(images)}

    def __init__(self, host: Optional[str] = None) -> None:
        self.client = DockerClient(host, api=True)
        self.host = self.client.host

    @property
    def image_store(self) -> str:
        """'classic' or 'containerd', known after :meth:`probe`."""
        return self.client.image_store

    def argv(self, *args: str) -> List[str]:
        return self.client.argv(*args)

    def probe(self) -> EngineInfo:
        return self.client.probe()

    def lookup(self, name: str) -> Optional[EngineImage]:
        return self.client.inspect(name)

    # === load
    def load(self, root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[DeltaBase] = None) -> None:
        """``external`` (delta bundles): diff_id -> engine image holding it, re-exported and spliced in."""
        holders = image_holders(external)
        cmd = self.archive_command("loading the bundle into Docker")
        if self._loads_oci_archive(images):
            named = [(image, normalize(ref)) for image in images for ref in image.refs]
            named += [(image, "") for image in images if not image.refs]
            blobs = None
            if external:  # left-out layers copied as the engine keeps them (docker save of their holder)
                layers = {x.digest: x for image in images for x in image.layers if x.external}
                first = sorted(layers)[0]
                argv = self.argv()
                blobs = {d: None for d in layers}
                blobs[first] = lambda tar: copy_engine_blobs(tar, argv, holders, layers, on_bytes)  # type: ignore
            after = self._unpack_check(root, images) if blobs is None else None
            if after is not None:
                self._load_checking_beside_unpack(cmd, root, named, after, on_bytes)
                return
            feed(cmd, lambda out: write_oci_archive(out, root, named, on_bytes=on_bytes, index_last=True,
                                                    external=blobs, check_layers=True))  # type: ignore[arg-type]
            return
        splice = None
        head = 0 if external else head_count(images)
        if external:
            def splice(tar: tarfile.TarFile) -> Dict[Digest, str]:
                return splice_engine_layers(tar, self.argv(), holders, on_bytes)
        elif head:
            load_in_two(cmd, lambda: self.archive_command("loading the bundle into Docker"), root, images, head,
                        on_bytes, forget=self._forget)
            return
        feed(cmd, lambda out: write_docker_archive(out, root, images, with_tags=True, on_bytes=on_bytes,
                                                   splice=splice))

    def _forget(self, ref: str) -> None:
        """Remove the name ``ref`` (a staging name) if the engine holds it."""
        if self.lookup(ref) is not None:
            self.remove(ref)

    def _load_checking_beside_unpack(self, cmd: FedCommand, root: BundleRoot, named: Sequence[Tuple[ImageRecord, str]],
                                     after: UnpackCheck, on_bytes: Optional[ProgressFn]) -> None:
        """The OCI archive with every blob's digest checked in the stream, then ``after`` checking
        the diff_ids while the engine unpacks; its verdict comes before the engine's answer."""
        ended = threading.Event()
        refs = [ref for _, ref in named]
        after.on_fail = lambda: self._cut_once_named(cmd, refs, ended)
        try:
            feed(cmd, lambda out: write_oci_archive(out, root, named, on_bytes=on_bytes, index_last=True,
                                                    before_index=after.start))
        except BaseException as e:
            ended.set()
            if after.started and (after.error is not None or isinstance(e, (CommandFailed, OSError))):
                after.finish()  # the engine's answer, or the cut: the layer check's verdict comes first
            else:
                after.stop()  # interrupted, or the stream failed before index.json: nothing unpacks
            raise
        ended.set()
        after.finish()

    def _cut_once_named(self, cmd: Any, refs: Sequence[str], ended: threading.Event) -> None:
        """A layer failed while the engine unpacks: cut the load (Docker cancels the unpack, which
        may be writing a bomb), but only once the engine named every image of the archive, or
        answered: it names them when the stream ends, whether or not the client is still there,
        and a name made after the caller removed this run's names would outlive the removal."""
        deadline = time.monotonic() + _NAMING_WAIT
        try:
            while not ended.is_set() and time.monotonic() < deadline:
                if all(self.lookup(ref) is not None for ref in refs):
                    break
                ended.wait(0.05)
        finally:
            cmd.abort()

    @staticmethod
    def _unpack_check(root: BundleRoot, images: Sequence[ImageRecord]) -> Optional[UnpackCheck]:
        """The check of each compressed layer's diff_id beside the engine's unpack (after the
        stream, from a second read: importer/input/unpackcheck.py), where a failure can remove
        everything the load named: every image is loaded under a (staging) name. None: an image
        loaded untagged, checked in the stream instead (nothing is named before its layers matched)."""
        if not images or not all(image.refs for image in images):
            return None
        return UnpackCheck(root, [(layer, what) for _, _, what, layer in archive_blobs(images)
                                  if layer is not None and not layer.external
                                  and compression_of(layer.media_type) != "none"])

    def archive_command(self, what: str) -> FedCommand:
        """Something whose ``stdin`` takes a docker-archive for ``docker load`` (``finish``,
        ``abort``): the Engine API over the socket (no docker CLI copying every byte), else the CLI."""
        path = socket_path(self.host)
        return ApiLoad(path, what=what, hint=_HINT) if path else StdinCommand(self.argv("load", "-q"), what=what,
                                                                             hint=_HINT)

    def prepare_delta(self, manifest: BundleManifest) -> Dict[Digest, str]:
        """The image holding each layer a delta leaves out (re-exported by :meth:`load`);
        DeltaBaseMissing (nothing loaded) if the engine lacks one."""
        return require_base(manifest, self.held_diff_ids())

    def held_diff_ids(self) -> Dict[Digest, str]:
        """Every layer diff_id the engine holds -> the image (with the fewest layers) holding it.
        Read from ``image inspect``'s whole JSON, not a ``--format`` template: a template naming
        ``.RootFS.Layers`` fails the whole call on an image with no layers (``FROM scratch`` plus
        a ``LABEL``), whose RootFS has no Layers key (issue 38)."""
        return pick_holders((x.image_id, x.diff_ids) for x in self.client.images(all_images=True))

    def tag(self, image_id: str, ref: str) -> None:
        self.client.tag(image_id, ref)

    def remove(self, image_id: str) -> None:
        self.client.remove(image_id)

    def list_tags(self, like: str = "") -> List[str]:
        """Every ``repository:tag`` the engine holds (for staging tags left by killed runs), or
        those whose name matches ``like`` (the engine's ``reference`` filter)."""
        return self.client.tags(like)

    # === --deep and --inventory
    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> ArchiveScan:
        argv = self.argv("save", found.image_id)
        with command_stdout(argv, what=f"re-exporting {image.name} from Docker (docker save)", hint=_HINT) as out:
            return scan_tar(out, f"docker save {found.image_id}", bound=layer_bound(image), on_bytes=on_bytes)

    def inventory(self) -> List[EngineImage]:
        return self.client.images(all_images=False)
