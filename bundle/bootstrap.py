"""``bundle export --for k3s|rke2|apptainer``: beside the bundle, the files a node that runs no
importer of ours takes its images from (docs/kubernetes.md, "Bootstrap formats").

- ``k3s`` (``rke2``: the same files, RKE2's paths): ``BUNDLE.k3s/images.tar``, one OCI archive
  holding every image with every platform the bundle carries, which k3s imports from
  ``/var/lib/rancher/k3s/agent/images/*.tar`` at start. k3s calls containerd's ``client.Import``
  with ``WithAllPlatforms(true)`` (k3s ``pkg/agent/containerd``), the ``ctr -n k8s.io images import
  --all-platforms`` path: every index entry is walked down to its layers (a manifest the archive
  lacks fails the import: an index names only the platforms written), and an entry is named by its
  ``io.containerd.image.name`` annotation, else by ``org.opencontainers.image.ref.name`` (which
  ``ctr`` prefixes with ``import-DATE/`` unless ``--base-name``; containerd's ``client/import.go``
  ``imageName``): both carry the full name (``docker.io/library/app:1``), as k3s's retagging
  parses it. A multi-platform image is its carried index byte for byte (its digest kept), or, when
  the bundle picked several platforms without one (``--platform a,b``), an OCI index of those
  written here. ``BUNDLE.k3s/registries.yaml``: one ``mirrors:`` entry per registry the images
  name, pointing at ``bundle-import serve`` (``--serve-address``), a ``configs:`` TLS stanza for an
  https one, and for Docker Hub names without a namespace a ``rewrite`` (``library/NAME`` ->
  ``NAME``: serve holds them as the bundle names them). ``README.txt`` says where each goes.
- ``apptainer``: ``BUNDLE.apptainer/NAME.oci.tar`` per image, an OCI archive of one entry
  (``apptainer build NAME.sif oci-archive:NAME.oci.tar``; no ``:`` in NAME, which the transport
  would read as a reference).

Every archive is written from the bundle's own blobs, each streamed and its digest and size
checked as it passes (importer/sinks/ociarchive.py ``copy_blob``), never a layer in memory; the
folder is built as ``TARGET.partial-*`` and renamed into place when whole. A delta bundle (layers
left out) and schemas 1 and 2 are refused before the export starts."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from importer.errors import BundleError, DestinationInUse, UsageError
from importer.format.digest import Digest
from importer.format.limits import MAX_INDEX
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.mediatypes import OCI_INDEX, REF_NAME_ANNOTATION
from importer.format.reference import DOCKER_HUB, parse_reference, split_host_port, split_registry
from importer.format.refs import normalize
from importer.input.opened import read_bundle_file
from importer.pipeline.preflight import InsufficientSpace, SpaceNeed, check_space
from importer.serve.nodeconfig import upstreams_of
from importer.sinks.ociarchive import CONTAINERD_NAME_ANNOTATION, copy_blob
from importer.streams.progress import close_progress, human_bytes
from importer.streams.tarout import member_info, writing_tar

FORMATS = ("k3s", "rke2", "apptainer")
DEFAULT_SERVE_ADDRESS = "http://127.0.0.1:5000"  # bundle-import serve's default --listen, plain HTTP
K3S_ARCHIVE = "images.tar"
REGISTRIES = "registries.yaml"
README = "README.txt"
APPTAINER_SUFFIX = ".oci.tar"
#: where each file goes on a node: (images folder, registries.yaml, the mirror's CA)
NODE_PATHS = {
    "k3s": ("/var/lib/rancher/k3s/agent/images", "/etc/rancher/k3s/registries.yaml",
            "/etc/rancher/k3s/sneakernet-mirror-ca.crt"),
    "rke2": ("/var/lib/rancher/rke2/agent/images", "/etc/rancher/rke2/registries.yaml",
             "/etc/rancher/rke2/sneakernet-mirror-ca.crt"),
}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
ProgressFactory = Callable[[str, int], Callable[[int], None]]
Blob = Tuple[Digest, int, str]  # digest, size, what (for messages)


@dataclass
class Bootstrap:
    """What ``--for`` wrote: ``bundle export --json``'s ``bootstrap``."""
    kind: str
    path: str
    files: List[str]
    bytes: int
    serve_address: Optional[str] = None
    registries: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"for": self.kind, "path": self.path, "files": list(self.files), "bytes": self.bytes,
                "serveAddress": self.serve_address, "registries": list(self.registries), "notes": list(self.notes)}

    def lines(self) -> List[str]:
        out = [f"wrote {self.path} for {self.kind}: {', '.join(self.files)} ({human_bytes(self.bytes)}); "
               f"{os.path.join(self.path, README)} says where each goes"]
        return out + [f"note: {n}" for n in self.notes]


def add_bootstrap_options(e: argparse.ArgumentParser) -> None:
    e.add_argument("--for", dest="bootstrap_for", choices=FORMATS, metavar="k3s|rke2|apptainer",
                   help="also write, beside the bundle, what such nodes import without bundle-import: k3s/rke2: "
                   "DIR.k3s/images.tar (every image and platform, for agent/images/) and registries.yaml (mirrors "
                   "at --serve-address); apptainer: DIR.apptainer/NAME.oci.tar per image (apptainer build "
                   "X.sif oci-archive:FILE). Not for delta bundles (--have). docs/kubernetes.md")
    e.add_argument("--serve-address", metavar="[http://|https://]HOST:PORT", default=None,
                   help=f"--for k3s/rke2: where the nodes reach `bundle-import serve` (default "
                   f"{DEFAULT_SERVE_ADDRESS}: serve's default, on the node itself); http unless https:// is given")


def parse_serve_address(text: str) -> Tuple[str, str]:
    """(scheme, HOST:PORT) of ``--serve-address``; UsageError naming what is wrong."""
    def bad(found: str) -> UsageError:
        return UsageError(f"reading --serve-address {text!r}: expected [http://|https://]HOST:PORT, found {found}",
                          hint="the address the nodes dial for `bundle-import serve`, e.g. http://10.0.0.5:5000")

    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
    if scheme not in ("http", "https"):
        raise bad(f"the scheme {scheme!r}")
    host, path = split_registry(rest)
    if path or rest.endswith("/"):
        raise bad("a path (serve answers at the root)")
    name, port = split_host_port(host)
    if not name or port is None or not 0 < port < 65536:
        raise bad("no port" if port is None else f"the port {port}")
    try:
        parse_reference(f"{host}/probe", what="reading --serve-address")
    except BundleError:
        raise bad(f"the host {name!r}") from None
    return scheme, host


def bootstrap_target(args: argparse.Namespace, images: Sequence[str]) -> Optional[str]:
    """``--for``'s folder (``-o DIR`` + ``.k3s``; with ``--archive`` alone the archive's name
    without ``.tar``), every option checked before the export starts; None without ``--for``."""
    kind = getattr(args, "bootstrap_for", None)
    if not kind:
        if getattr(args, "serve_address", None):
            raise UsageError("exporting with --serve-address: expected --for k3s or --for rke2 with it, found none")
        return None
    if args.schema != 3:
        raise UsageError(f"exporting with --for {kind} and --schema {args.schema}: expected schema 3 (the archives "
                         "are written from its OCI blobs)", hint="drop --schema")
    if args.have:
        raise UsageError(f"exporting with --for {kind} and --have: a delta bundle leaves out layers the node "
                         f"holds, and {kind} imports whole images", hint="export without --have for --for, or "
                         "import the delta with bundle-import on each node")
    if not images:
        raise UsageError(f"exporting with --for {kind}: expected at least one image, found none",
                         hint="--for writes images; files and charts are served by `bundle-import serve`")
    if args.serve_address is not None:
        if kind == "apptainer":
            raise UsageError("exporting with --for apptainer and --serve-address: expected --for k3s or rke2 "
                             "(apptainer nodes take the archives, no mirror)")
        parse_serve_address(args.serve_address)
    base = os.path.abspath(args.output or args.archive).rstrip(os.sep)
    if not args.output and base.endswith(".tar"):
        base = base[: -len(".tar")]
    target = f"{base}.{kind}"
    if os.path.lexists(target):
        _check_replaceable(target, kind, args.force)
    return target


def _ours(kind: str, name: str) -> bool:
    if kind == "apptainer":
        return name == README or name.endswith(APPTAINER_SUFFIX)
    return name in (README, K3S_ARCHIVE, REGISTRIES)


def _check_replaceable(target: str, kind: str, force: bool) -> None:
    """An existing ``--for`` folder: replaced with ``--force`` when it holds only what ``--for``
    writes (or nothing); anything else is refused."""
    if os.path.isdir(target) and not os.path.islink(target):
        names = sorted(os.listdir(target))
        if all(_ours(kind, n) for n in names):
            if force or not names:
                return
            raise UsageError(f"exporting with --for {kind}: expected a new folder at {target}, found one",
                             hint="pass --force to replace it, or choose another -o")
        found = f"a folder holding other files ({', '.join(n for n in names if not _ours(kind, n))[:200]})"
    else:
        found = "a link" if os.path.islink(target) else "a file"
    raise DestinationInUse(f"exporting with --for {kind}: expected a new folder at {target}, found {found}",
                           hint="choose another -o; --force replaces only a folder --for wrote")


def write_bootstrap(bundle_dir: str, manifest: BundleManifest, kind: str, target: str, *,
                    serve_address: Optional[str] = None, progress: Optional[ProgressFactory] = None,
                    name: Optional[str] = None) -> Bootstrap:
    """Write ``target`` (a folder) for ``kind`` from the bundle at ``bundle_dir`` (whole, not a
    delta). ``name``: what the README calls the bundle (default: its folder's name)."""
    if kind not in FORMATS:
        raise UsageError(f"exporting with --for {kind!r}: expected one of {', '.join(FORMATS)}")
    if manifest.is_delta:
        raise UsageError(f"writing the {kind} files: expected a whole bundle, found a delta bundle "
                         f"({len(manifest.external_layers())} layer(s) left out)",
                         hint="export without --have for --for")
    images = [image for image in manifest.images if image.refs]
    if not images:
        raise UsageError(f"writing the {kind} files: expected a named image in the bundle, found none")
    name = name or os.path.basename(bundle_dir.rstrip(os.sep))
    parent = os.path.dirname(os.path.abspath(target))
    plans = _apptainer_plans(bundle_dir, images) if kind == "apptainer" else [_k3s_plan(bundle_dir, images)]
    _check_space(parent, kind, sum(p.size for p in plans))
    staging = tempfile.mkdtemp(prefix=os.path.basename(target) + ".partial-", dir=parent)
    try:
        on_bytes = progress(kind, sum(p.size for p in plans)) if progress else None
        for plan in plans:
            _write_archive(os.path.join(staging, plan.file), bundle_dir, plan, on_bytes)
        close_progress(on_bytes)
        boot = Bootstrap(kind, target, [p.file for p in plans], sum(p.size for p in plans),
                         notes=[n for p in plans for n in p.notes])
        if kind != "apptainer":
            scheme, host = parse_serve_address(serve_address or DEFAULT_SERVE_ADDRESS)
            text, boot.registries, rewritten = registries_yaml(images, scheme, host, NODE_PATHS[kind][2])
            _write_text(os.path.join(staging, REGISTRIES), text)
            boot.files.append(REGISTRIES)
            boot.serve_address = f"{scheme}://{host}"
            if rewritten:
                boot.notes.append(f"registries.yaml rewrites library/{{{','.join(rewritten)}}} to the names the "
                                  "bundle gives them (Docker Hub names without a namespace; k3s/rke2 1.21 or later)")
        _write_text(os.path.join(staging, README), readme(boot, name, plans))
        boot.files.append(README)
        os.chmod(staging, 0o755)  # noqa: S103 - world-readable like the bundle folder
        if os.path.lexists(target):
            _check_replaceable(target, kind, True)  # again: it may have changed meanwhile
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        raise
    return boot


@dataclass
class _Plan:
    """One archive: its file name, index.json, the blobs in order, the ones made here (bytes)."""
    file: str
    index: bytes
    blobs: List[Blob]
    made: Dict[Digest, bytes]
    labels: List[str]  # the names it holds
    notes: List[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(size for _, size, _ in self.blobs)


def _k3s_plan(root: str, images: Sequence[ImageRecord]) -> _Plan:
    plan = _Plan(K3S_ARCHIVE, b"", [], {}, [])
    entries: List[Dict[str, Any]] = []
    for image in images:
        names = [normalize(ref) for ref in image.refs]
        entries += _entries(root, image, names, plan)
        plan.labels += names
    plan.index = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
    return plan


def _apptainer_plans(root: str, images: Sequence[ImageRecord]) -> List[_Plan]:
    """One archive per image, named by its first ref (``/``, ``:`` and ``@`` made ``_``), a short
    config digest added where two would get one name."""
    plans: List[_Plan] = []
    taken: Dict[str, int] = {}
    for image in images:
        base = _UNSAFE.sub("_", image.refs[0]).lstrip(".") or image.config.digest.hex[:12]
        taken[base] = taken.get(base, 0) + 1
    used = set()
    for image in images:
        base = _UNSAFE.sub("_", image.refs[0]).lstrip(".") or image.config.digest.hex[:12]
        if taken[base] > 1 or base in used:
            base = f"{base}-{image.config.digest.hex[:12]}"
        used.add(base)
        plan = _Plan(base + APPTAINER_SUFFIX, b"", [], {}, [image.refs[0]])
        entries = _entries(root, image, [image.refs[0]], plan)
        plan.index = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
        plans.append(plan)
    return plans


def _entries(root: str, image: ImageRecord, names: Sequence[str], plan: _Plan) -> List[Dict[str, Any]]:
    """The index.json entries naming ``image`` (one per name, both annotations), its blobs added
    to ``plan`` (each once, small ones before the layers of this image)."""
    have = {d for d, _, _ in plan.blobs}
    small: List[Blob] = []
    if image.index is not None and _complete(root, image):
        target: Dict[str, Any] = image.index.to_dict()
        small.append((image.index.digest, image.index.size, f"the index of {image.name}"))
    elif image.others or image.index is not None:  # several platforms picked: an index of those
        listed = [{"mediaType": v.manifest.media_type, "digest": str(v.manifest.digest), "size": v.manifest.size,
                   **({"platform": dict(v.platform)} if v.platform.get("os") else {})} for v in image.variants]
        raw = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed})
        digest = Digest.of_bytes(raw)
        plan.made[digest] = raw
        target = {"mediaType": OCI_INDEX, "digest": str(digest), "size": len(raw)}
        small.append((digest, len(raw), f"the index written for {image.name}"))
        plan.notes.append(f"{image.name}: carried as {len(image.variants)} platforms without their source's "
                          f"index; {plan.file} names an index of them written here ({digest.short})")
    else:
        target = image.manifest.to_dict()
        if image.platform.get("os") and image.platform.get("architecture"):
            target["platform"] = dict(image.platform)
    layers: List[Blob] = []
    for v in image.variants:
        label = f"{image.name} ({v.platform_text()})" if image.others else image.name
        small += [(v.manifest.digest, v.manifest.size, f"the manifest of {label}"),
                  (v.config.digest, v.config.size, f"the config of {label}")]
        layers += [(x.digest, x.size, f"layer {i + 1}/{len(v.layers)} of {label}") for i, x in enumerate(v.layers)]
    for blob in small + layers:
        if blob[0] not in have:
            have.add(blob[0])
            plan.blobs.append(blob)
    return [{**target, "annotations": {REF_NAME_ANNOTATION: n, CONTAINERD_NAME_ANNOTATION: n}} for n in names]


def _complete(root: str, image: ImageRecord) -> bool:
    """The carried index lists only manifests the bundle holds (containerd's import walks each)."""
    assert image.index is not None
    raw = read_bundle_file(root, image.index.digest.blob_path, MAX_INDEX, f"the index of {image.name}")
    try:
        listed = {str(m.get("digest")) for m in json.loads(raw)["manifests"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return Digest.of_bytes(raw) == image.index.digest and listed <= {str(v.manifest.digest) for v in image.variants}


def _write_archive(path: str, root: str, plan: _Plan, on_bytes: Optional[Callable[[int], None]]) -> None:
    with open(path, "wb") as f:
        with writing_tar(f) as tar:
            for member, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", plan.index)):
                tar.addfile(member_info(member, len(data)), io.BytesIO(data))
            for digest, size, what in plan.blobs:
                made = plan.made.get(digest)
                if made is not None:
                    tar.addfile(member_info(digest.blob_path, len(made)), io.BytesIO(made))
                    if on_bytes is not None:
                        on_bytes(len(made))
                else:
                    copy_blob(tar, root, digest, size, what, on_bytes)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o644)


def registries_yaml(images: Sequence[ImageRecord], scheme: str, host: str,
                    ca_path: str) -> Tuple[str, List[str], List[str]]:
    """(k3s/rke2's registries.yaml text, the registries mirrored, the Docker Hub names rewritten).
    Serve answers each image under its repository path without the registry host (``nvcr.io/nvidia/x``
    as ``nvidia/x``), which is what containerd asks a mirror for; a Docker Hub name without a
    namespace (``busybox:1``) is held as ``busybox`` where containerd asks for ``library/busybox``:
    a ``rewrite`` of exactly those names takes it back."""
    found = upstreams_of([ref for image in images for ref in image.refs])
    url = f"{scheme}://{host}"
    mirrors: Dict[str, Any] = {}
    single = sorted(r for r in found.get(DOCKER_HUB, []) if "/" not in r)
    for upstream in found:
        mirrors[upstream] = {"endpoint": [url]}
        if upstream == DOCKER_HUB and single:
            names = "|".join(n.replace(".", "\\.") for n in single)
            mirrors[upstream]["rewrite"] = {f"^library/({names})$": "$1"}
    doc: Dict[str, Any] = {"mirrors": mirrors}
    if scheme == "https":
        doc["configs"] = {host: {"tls": {"ca_file": ca_path}}}
    head = (f"# written by bundle export --for: pulls of {', '.join(found)} go to bundle-import serve at {url}\n")
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False), list(found), single


def readme(boot: Bootstrap, name: str, plans: Sequence[_Plan]) -> str:
    """README.txt: one line per file, where it goes on the node."""
    lines = [f"sneakernet bootstrap for {boot.kind}, from the bundle {name}", ""]
    if boot.kind == "apptainer":
        for plan in plans:
            lines.append(f"{plan.file}: {plan.labels[0]}; apptainer build "
                         f"{plan.file[: -len(APPTAINER_SUFFIX)]}.sif oci-archive:{plan.file}")
        lines += ["", "zstd layers need an apptainer that reads them; export with --compression gzip otherwise."]
    else:
        images_dir, registries, ca = NODE_PATHS[boot.kind]
        tar = _UNSAFE.sub("_", name) + ".tar"
        lines += [f"{K3S_ARCHIVE}: copy to {images_dir}/{tar} on every node ({boot.kind} imports each .tar there "
                  "when it starts, all platforms, into containerd's k8s.io namespace; restart it to import now)",
                  f"{REGISTRIES}: copy to {registries} on every node (merge it into one already there), then "
                  f"restart {boot.kind}: pulls of {', '.join(boot.registries)} go to {boot.serve_address}, "
                  f"where `bundle-import serve {name} --listen ADDR:PORT` answers"]
        if boot.serve_address and boot.serve_address.startswith("https://"):
            lines.append(f"the mirror's CA certificate (serve --tls-self-signed DIR: DIR/ca.crt): copy to {ca}")
        lines += ["", "images:"] + [f"  {label}" for plan in plans for label in plan.labels]
    return "\n".join(lines) + "\n"


def _check_space(parent: str, kind: str, size: int) -> None:
    need = SpaceNeed(parent, f"the --for {kind} files", size + 1024 * 1024)
    short = [c for c in check_space([need]) if not c.ok]
    if short:
        raise InsufficientSpace(f"writing the --for {kind} files: expected enough free space, found too little on "
                                + "; ".join(c.text() for c in short),
                                hint="the bundle is whole; free space there and export again with --force")


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o644)


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()
