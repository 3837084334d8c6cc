"""The containerd sink (Kubernetes nodes, no dockerd): ``ctr images import`` fed an OCI archive
built on the fly from the bundle's own blobs, unpacked into the chosen snapshotter.

The manifest, config and compressed layers go in byte for byte, so containerd holds the bundle's
manifest digest. Every index entry carries the full reference (``docker.io/library/app:1``) in
``io.containerd.image.name`` and ``org.opencontainers.image.ref.name``: an entry without a usable
name imports nothing, and ``ctr`` still exits 0. After loading, the check reads back the image's
target (manifest digest), its config digest and diff_ids (``ctr content get``), that every content
blob is present and the image unpacked (``ctr images check``), and that a snapshot exists for
every layer chain ID (``ctr snapshots ls``)."""

from __future__ import annotations

import functools
import json
import os
import re
import tarfile
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from importer.engines import EngineBlob, EngineImage, EngineInfo
from importer.engines.ctrclient import CtrClient, ctr_hint
from importer.errors import BundleError, CommandFailed, EngineUnavailable, SinkError
from importer.format.digest import Digest, is_digest
from importer.format.identity import OCI, chain_ids
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.platform import pick_platform_manifest
from importer.format.refs import familiar, normalize
from importer.input.opened import BundleRoot, bundle_folder
from importer.input.tarscan import ArchiveScan, hash_member, layer_bound, scan_tar
from importer.sinks import DeltaBase, ProgressFn, SinkBase, SinkCapabilities
from importer.sinks.containerd_delta import ContainerdPlan, parse_content_rows, plan_delta, write_unpacked_layer
from importer.sinks.ociarchive import write_oci_archive
from importer.streams.commands import StdinCommand, command_stdout, feed

DEFAULT_SNAPSHOTTER = "overlayfs"
UNTAGGED_REPO = "docker.io/sneakernet/untagged"
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
_STATUS_RE = re.compile(r"\b(complete|incomplete|missing|unavailable)\b(?: \(([0-9]+)/([0-9]+)\))?")


class ContainerdSink(SinkBase):
    kind = "containerd"
    capabilities = SinkCapabilities(loads_docker_archive=True, completes_deltas=True, lists_tags=True,
                                    lists_images=True, reexports=True)

    def __init__(self, address: Optional[str] = None, namespace: Optional[str] = None,
                 snapshotter: Optional[str] = None) -> None:
        self.client = CtrClient(address, namespace)
        self.address, self.namespace = self.client.address, self.client.namespace
        self.snapshotter = snapshotter or os.environ.get("CONTAINERD_SNAPSHOTTER") or DEFAULT_SNAPSHOTTER

    def argv(self, *args: str) -> List[str]:
        return self.client.argv(*args)

    # === probe
    def probe(self) -> EngineInfo:
        version = self.client.version()
        plugins = self.client.run("plugins", "ls", what="listing containerd's plugins", timeout=60)
        status = snapshotter_status(plugins)
        if status.get(self.snapshotter) != "ok":
            usable = sorted(name for name, st in status.items() if st == "ok")
            raise EngineUnavailable(
                f"choosing containerd snapshotter {self.snapshotter!r}: expected it loaded, found "
                f"{status.get(self.snapshotter, 'no such snapshotter')}",
                hint=f"pass --snapshotter with one of: {', '.join(usable) or 'none loaded'}",
            )
        return EngineInfo(
            kind="containerd",
            version=version,
            storage_driver=self.snapshotter,
            image_store=OCI,
            address=self.address,
            data_root=None,
            extra={"namespace": self.namespace, "snapshotter": self.snapshotter},
        )

    # === read back
    def lookup(self, name: str) -> Optional[EngineImage]:
        rows = self.client.rows(f"target.digest=={name}" if is_digest(name) else f"name=={normalize(name)}")
        if not rows:
            return None
        _, media_type, digest = rows[0]
        names = sorted(r[0] for r in self.client.rows(f"target.digest=={digest}"))
        image = self._describe(digest, media_type, names)
        image.problems.extend(self._check(names[0] if names else rows[0][0], image))
        return image

    def _describe(self, digest: str, media_type: str, names: List[str]) -> EngineImage:
        """Manifest -> config -> diff_ids of the image whose target is ``digest``."""
        manifest_digest = digest
        doc = self.client.content_json(digest, f"reading the manifest {digest[:19]} from containerd")
        if not isinstance(doc, dict):
            return EngineImage(digest, [], names, manifest_digest=digest,
                               problems=["the manifest is not a JSON object"])
        if media_type in _INDEX_TYPES or isinstance(doc.get("manifests"), list):
            chosen = pick_platform_manifest(doc)
            if chosen is None:
                return EngineImage(digest, [], names, manifest_digest=digest,
                                   problems=["the image is an index with no manifest for this platform"])
            manifest_digest = chosen
            doc = self.client.content_json(chosen, f"reading the manifest {chosen[:19]} from containerd")
        config = doc.get("config") if isinstance(doc, dict) else None
        config_digest = config.get("digest") if isinstance(config, dict) else None
        if not is_digest(config_digest):
            return EngineImage(digest, [], names, manifest_digest=manifest_digest,
                               problems=["the manifest names no config"])
        cfg = self.client.content_json(str(config_digest),
                                       f"reading the config {str(config_digest)[:19]} from containerd")
        rootfs = cfg.get("rootfs") if isinstance(cfg, dict) else None
        diff_ids = [str(x) for x in (rootfs.get("diff_ids") or [])] if isinstance(rootfs, dict) else []
        blobs: List[EngineBlob] = [
            {"mediaType": x.get("mediaType"), "digest": x.get("digest"), "size": x.get("size")}
            for x in (doc.get("layers") or []) if isinstance(x, dict)
        ]
        return EngineImage(digest, diff_ids, names, config_digest=str(config_digest),
                           manifest_digest=manifest_digest, blobs=blobs)

    def _check(self, name: str, image: EngineImage, snapshots: Optional[Set[str]] = None) -> List[str]:
        """Content present and unpacked (``ctr images check``), a snapshot per chain ID."""
        problems: List[str] = []
        out = self.client.run("images", "check", "--snapshotter", self.snapshotter, f"name=={name}",
                        what=f"checking {name} in containerd")
        checks = parse_check_rows(out)
        row = checks.get(name)
        if row is None:
            problems.append(f"`ctr images check` does not list {name}")
        else:
            status, have, want, unpacked = row
            if status != "complete" or have != want:
                problems.append(f"content: {status} ({have}/{want} blobs present)")
            if not unpacked:
                problems.append(f"not unpacked in snapshotter {self.snapshotter}")
        if snapshots is None:
            snapshots = self._snapshots()
        for i, chain in enumerate(chain_ids(image.diff_ids)):
            if chain not in snapshots:
                problems.append(f"layer {i + 1}: no {self.snapshotter} snapshot {chain[:19]} (chain ID)")
        return problems

    def _snapshots(self) -> Set[str]:
        out = self.client.run("snapshots", "--snapshotter", self.snapshotter, "ls",
                        what=f"listing containerd's {self.snapshotter} snapshots")
        return {line.split()[0] for line in out.splitlines()[1:] if line.strip()}

    # === load
    def prepare_delta(self, manifest: BundleManifest) -> ContainerdPlan:
        """How each layer a delta leaves out is completed from the content store; raises
        DeltaBaseMissing (nothing loaded) when one cannot be (importer/sinks/containerd_delta.py)."""
        out = self.client.run("content", "ls", what="listing containerd's content store")
        return plan_delta(manifest, parse_content_rows(out), f"containerd ({self.namespace})")

    def load(self, bundle_root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[DeltaBase] = None) -> None:
        """``external`` (delta bundles): from :meth:`prepare_delta`."""
        root = bundle_folder(bundle_root, f"loading into {self.kind}")
        writers: Dict[Digest, Optional[Callable[[tarfile.TarFile], None]]] = {}
        layers = {x.digest: x for image in images for x in image.layers}
        for digest, source in (external or {}).items():
            writers[digest] = None if source is None else functools.partial(
                write_unpacked_layer, ctr_argv=self.argv(), source=source, layer=layers[digest], on_bytes=on_bytes)
        named = [(image, normalize(ref)) for image in images for ref in image.refs]
        named += [(image, f"{UNTAGGED_REPO}@{image.manifest.digest}") for image in images if not image.refs]
        cmd = StdinCommand(self.argv("images", "import", "--snapshotter", self.snapshotter, "-"),
                           what="importing the bundle into containerd", hint=ctr_hint(self.address))
        feed(cmd, lambda out: write_oci_archive(out, root, named, on_bytes=on_bytes,
                                                external=writers if external else None))

    def archive_command(self, what: str) -> StdinCommand:
        """``ctr images import`` reading a docker-archive (or an OCI archive) from its stdin,
        unpacked into the chosen snapshotter; names come from the archive (``RepoTags``)."""
        return StdinCommand(self.argv("images", "import", "--snapshotter", self.snapshotter, "-"), what=what,
                            hint=ctr_hint(self.address))

    def _source_name(self, image_id: str) -> str:
        if not is_digest(image_id):
            return normalize(image_id)
        rows = self.client.rows(f"target.digest=={image_id}")
        if not rows:
            raise SinkError(f"tagging {image_id[:19]}: expected an image with that manifest in containerd, found none")
        return rows[0][0]

    def tag(self, image_id: str, ref: str) -> None:
        src = self._source_name(image_id)
        self.client.run("images", "tag", "--force", src, normalize(ref), what=f"tagging {src} as {normalize(ref)}",
                  timeout=120)

    def remove(self, image_id: str) -> None:
        if is_digest(image_id):
            names = [r[0] for r in self.client.rows(f"target.digest=={image_id}")]
            if len(names) != 1:
                raise SinkError(f"removing {image_id[:19]}: expected one name on it, found {len(names)}",
                                hint="remove the names you do not want with `ctr images rm NAME`")
            target = names[0]
        else:
            target = normalize(image_id)
        self.client.run("images", "rm", target, what=f"removing {target} from containerd", timeout=300)

    def list_tags(self, like: str = "") -> List[str]:
        """Every image name in the namespace, in Docker's short form (staging cleanup)."""
        return sorted({familiar(r[0]) for r in self.client.rows()})

    # === --deep and --inventory
    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> ArchiveScan:
        """``ctr export`` of the image. containerd checks each blob's digest while exporting and
        stops at the first damaged one without naming it; then every blob is read on its own
        (``ctr content get``, which does not check) so the damaged layer can be named."""
        name = found.tags[0] if found.tags else self._source_name(found.image_id)
        argv = self.argv("images", "export", "-", name)
        try:
            with command_stdout(argv, what=f"re-exporting {name} from containerd (ctr export)",
                                hint=ctr_hint(self.address)) as out:
                return scan_tar(out, f"ctr export {name}", bound=layer_bound(image), on_bytes=on_bytes)
        except CommandFailed as export_failed:
            scan = self._content_scan(found, image)
            damaged = [m for path, m in scan.members.items()
                       if path.startswith("blobs/") and str(m.digest) != "sha256:" + path.rsplit("/", 1)[-1]]
            if not damaged:
                raise export_failed from None
            scan.source += f" (after `ctr export` failed: {export_failed.stderr_tail.strip()[-200:]})"
            return scan

    def _content_scan(self, found: EngineImage, image: ImageRecord) -> ArchiveScan:
        """Every blob of the image read from the content store one by one."""
        scan = ArchiveScan(f"ctr content get (each blob of {found.tags[0] if found.tags else found.image_id})")
        digests = [found.image_id]
        if found.manifest_digest and found.manifest_digest != found.image_id:
            digests.append(found.manifest_digest)
        if found.config_digest:
            digests.append(found.config_digest)
        digests += [str(b["digest"]) for b in found.blobs if is_digest(b.get("digest"))]
        for digest in digests:
            path = Digest.parse(digest).blob_path
            with command_stdout(self.argv("content", "get", digest), what=f"reading {digest[:19]} from containerd",
                                hint=ctr_hint(self.address)) as out:
                facts, doc = hash_member(out, path, bound=layer_bound(image))
            scan.members[path] = facts
            if doc is not None:
                scan.docs[path] = doc
        entry = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                 "digest": found.manifest_digest or found.image_id}
        scan.docs["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode()
        return scan

    def inventory(self) -> List[EngineImage]:
        rows = self.client.rows()
        by_digest: Dict[str, Tuple[str, List[str]]] = {}
        for name, media_type, digest in rows:
            by_digest.setdefault(digest, (media_type, []))[1].append(name)
        checks = parse_check_rows(self.client.run("images", "check", "--snapshotter", self.snapshotter,
                                            what="checking containerd's images"))
        snapshots = self._snapshots()
        images: List[EngineImage] = []
        for digest, (media_type, names) in sorted(by_digest.items()):
            try:
                image = self._describe(digest, media_type, sorted(names))
            except BundleError as e:  # one image's content gone or unreadable: that image's problem, not the run's
                images.append(EngineImage(digest, [], sorted(names), manifest_digest=digest,
                                          problems=[f"could not be read: {e.message}"[:500]]))
                continue
            for name in image.tags:
                row = checks.get(name)
                if row is not None and (row[0] != "complete" or row[1] != row[2]):
                    image.problems.append(f"content: {row[0]} ({row[1]}/{row[2]} blobs present)")
                    break
            unpacked = all(chain in snapshots for chain in chain_ids(image.diff_ids))
            if not unpacked:
                image.problems.append(f"not unpacked in snapshotter {self.snapshotter}")
            images.append(image)
        return images


def snapshotter_status(out: str) -> Dict[str, str]:
    """snapshotter name -> status from ``ctr plugins ls``."""
    found: Dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "io.containerd.snapshotter.v1":
            found[parts[1]] = parts[-1]
    return found


def parse_check_rows(out: str) -> Dict[str, Tuple[str, int, int, bool]]:
    """REF -> (status, blobs present, blobs wanted, unpacked) from ``ctr images check``."""
    rows: Dict[str, Tuple[str, int, int, bool]] = {}
    for line in out.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4 or not is_digest(parts[2]):
            continue
        m = _STATUS_RE.search(line)
        status = m.group(1) if m else "unknown"
        have = int(m.group(2)) if m and m.group(2) else 0
        want = int(m.group(3)) if m and m.group(3) else -1
        rows[parts[0]] = (status, have, want, parts[-1] == "true")
    return rows
