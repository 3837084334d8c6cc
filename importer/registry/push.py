"""push_bundle(): the images of a verified bundle into a registry, then proof by reading back.

A delta bundle first has every layer it leaves out found in the registry (importer/registry/delta.py:
HEAD, else a repository to mount it from; none anywhere: exit 9, nothing pushed), then mounted.
Order (``bundle push`` and ``bundle-import --engine registry`` alike, the phases below): every blob
the registry lacks (HEAD each; a blob shared by several repositories is uploaded once and mounted
into the others), then each manifest by its digest with its exact bytes and media type, then the
carried signatures and SBOMs (3.5, importer/registry/push_artifacts.py), all with no tag written;
then every image read back by digest (the manifest's bytes must hash to the bundle's manifest
digest, the config must be the bundle's config, its diff_ids too, and every layer must be there
with its size) and every carried artifact's manifest by its digest: a mismatch (exit 8) leaves
every tag where it was; only then each tag, written with the bytes read back and HEAD again
(:func:`write_tag`: it must name that digest)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Set, Tuple

from importer.errors import DigestMismatch, PolicyRejected, PostLoadMismatch, UsageError
from importer.format.digest import Digest
from importer.format.limits import MAX_CONFIG, MAX_MANIFEST
from importer.format.manifest import BlobRef, BundleManifest, ImageRecord
from importer.input.opened import BundleRoot, open_bundle_file, read_bundle_file
from importer.registry.client import Destination, RegistryClient, map_ref
from importer.registry.delta import DeltaPlan, external_blobs, mount_external, plan_external
from importer.registry.push_artifacts import push_artifacts, read_back_artifacts
from importer.streams.threads import each as _each

ProgressFactory = Callable[[str, int], Callable[[int], None]]


class RegistryTagConflict(PolicyRejected):
    reference = "tag-conflict"


@dataclass
class ReadBack:
    """What the registry holds under one tag, as read back after the push."""

    manifest_digest: str = ""
    config_digest: str = ""
    diff_ids: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    #: a multi-platform image (bundle schema 3.2): the tag names its index (``manifest_digest``);
    #: this is the primary platform's manifest read back through it
    platform_manifest: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> Dict[str, Any]:
        return {"manifestDigest": self.manifest_digest, "configDigest": self.config_digest,
                "diffIds": list(self.diff_ids), "problems": list(self.problems), "ok": self.ok}


@dataclass
class PushedRef:
    image: ImageRecord
    source_ref: str
    destination: Destination
    pullable: str  # REGISTRY/NAMESPACE/repo:tag as the registry's own host names it
    tag_was: Optional[str] = None  # manifest digest the tag named before the push
    status: str = "pushed"  # "pushed", "already-present", "tag-moved"
    readback: ReadBack = field(default_factory=ReadBack)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "ref": self.source_ref,
            "pushedTo": self.pullable,
            "repository": self.destination.repository,
            "tag": self.destination.tag,
            "manifestDigest": str(self.image.manifest.digest),
            "configDigest": str(self.image.config.digest),
            "status": self.status,
            "tagWas": self.tag_was,
            "readBack": self.readback.to_dict(),
        }


@dataclass
class PushReport:
    target: str
    refs: List[PushedRef] = field(default_factory=list)
    untagged: List[str] = field(default_factory=list)
    blobs_uploaded: int = 0
    blobs_mounted: int = 0
    blobs_present: int = 0
    bytes_uploaded: int = 0
    seconds: float = 0.0
    stats: Dict[str, int] = field(default_factory=dict)
    delta: Optional[DeltaPlan] = None  # a delta bundle: where its external layers were found

    @property
    def ok(self) -> bool:
        return bool(self.refs) and all(r.readback.ok for r in self.refs)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "ok": self.ok,
            "target": self.target,
            "images": [r.to_dict() for r in self.refs],
            "untagged": list(self.untagged),
            "blobs": {"uploaded": self.blobs_uploaded, "mounted": self.blobs_mounted, "present": self.blobs_present,
                      "bytesUploaded": self.bytes_uploaded},
            "requests": dict(self.stats),
            "seconds": round(self.seconds, 3),
            "delta": self.delta.to_dict() if self.delta is not None else None,
        }


def plan_refs(manifest: BundleManifest, client: RegistryClient) -> Tuple[List[PushedRef], List[str]]:
    """Where every ref of every image goes; images without a ref cannot be named in a registry."""
    refs: List[PushedRef] = []
    untagged: List[str] = []
    for image in manifest.images:
        if not image.refs:
            untagged.append(str(image.config.digest))
            continue
        for ref in image.refs:
            dest = map_ref(ref, client.target)
            refs.append(PushedRef(image, ref, dest, dest.ref(client.target)))
    return refs, untagged


def top_digest(image: ImageRecord) -> Digest:
    """What a tag of ``image`` names: its image index when the bundle carries it (schema 3.2:
    every platform is pushed, the index's digest unchanged), else its manifest."""
    return image.index.digest if image.index is not None else image.manifest.digest


def _manifest_blobs(image: ImageRecord) -> List[Tuple[BlobRef, str]]:
    """The manifests a push of ``image`` puts: every platform's, then the index (the tag's)."""
    out = [(v.manifest, f"the manifest of {image.name}" + (f" ({_plat(v.platform)})" if image.index else ""))
           for v in (image.variants if image.index is not None else [image])]
    if image.index is not None:
        out.append((image.index, f"the index of {image.name}"))
    return out


def _plat(platform: Dict[str, str]) -> str:
    return "/".join(platform[k] for k in ("os", "architecture", "variant") if platform.get(k))


def _carried(image: ImageRecord) -> List[Any]:
    """The platforms whose blobs a push of ``image`` sends: all of them when the index goes too."""
    return list(image.variants) if image.index is not None else [image]


def _opener(root: BundleRoot, local: Dict[str, str]) -> Callable[[Digest], BinaryIO]:
    """Opens a blob: from ``local`` (recompressed for this push, transcode.py), else the bundle."""
    def open_blob(digest: Digest) -> BinaryIO:
        path = local.get(str(digest))
        return open(path, "rb") if path is not None else open_bundle_file(root, digest.blob_path)
    return open_blob


def _manifest_bytes(root: BundleRoot, blob: BlobRef, what: str, local: Dict[str, str]) -> Tuple[bytes, str]:
    path = local.get(str(blob.digest))
    if path is not None:
        with open(path, "rb") as f:
            raw = f.read(MAX_MANIFEST + 1)
    else:
        raw = read_bundle_file(root, blob.digest.blob_path, MAX_MANIFEST, what)
    got = Digest.of_bytes(raw)
    if got != blob.digest:
        raise DigestMismatch(f"reading {what}: expected {blob.digest}, found {got}",
                             hint="the bundle changed after it was verified; re-copy it")
    media_type = blob.media_type
    try:
        doc = json.loads(raw.decode("utf-8"))
        if isinstance(doc, dict) and isinstance(doc.get("mediaType"), str):
            media_type = doc["mediaType"]
    except ValueError:
        pass
    return raw, media_type


@dataclass
class PushPlan:
    """One push, planned before anything is sent (:func:`plan_push`): where every ref goes and what
    its tag names now (conflicts refused), the manifests' exact bytes, a delta's base found; then
    filled in by :func:`send_by_digest` (what was missing and sent, the carried artifacts handed on)
    and :func:`read_back_all`."""

    root: BundleRoot
    manifest: BundleManifest
    refs: List[PushedRef]
    raw_manifests: Dict[Digest, Tuple[bytes, str]]
    report: PushReport
    workers: int
    local: Dict[str, str]
    started: float
    sizes: Dict[Digest, int] = field(default_factory=dict)
    missing: List[Tuple[str, Digest]] = field(default_factory=list)
    #: the carried signatures and SBOMs (3.5) pushed by :func:`send_by_digest`: the receipt's records
    handed_on: List[Dict[str, Any]] = field(default_factory=list)

    def tag_target(self, manifest_digest: str) -> Optional[Tuple[str, bytes, str]]:
        """What a tag of the image whose manifest is ``manifest_digest`` names: (digest, its exact
        bytes, media type): the image's index for a multi-platform image (3.2), else its manifest."""
        for r in self.refs:
            if str(r.image.manifest.digest) == manifest_digest:
                top = top_digest(r.image)
                raw, media_type = self.raw_manifests[top]
                return str(top), raw, media_type
        return None


def plan_push(root: BundleRoot, manifest: BundleManifest, client: RegistryClient, *, concurrency: int = 4,
              move_tags: bool = True, local: Optional[Dict[str, str]] = None) -> PushPlan:
    """Everything checked before the first byte is sent: every tagged image of ``manifest``
    (already verified) mapped to its repository, its manifests read (``local``: recompressed for
    this push, digest -> file), each tag's current manifest (``move_tags=False``: one naming another
    manifest refused), and a delta's left-out layers found in the registry (exit 9 otherwise)."""
    started = time.monotonic()
    report = PushReport(target=str(client.target))
    refs, report.untagged = plan_refs(manifest, client)
    if not refs:
        raise UsageError("pushing: expected at least one image with a name, found only untagged images",
                         hint="a registry names images by repository:tag; re-export them tagged")
    local = dict(local or {})
    raw_manifests = {blob.digest: _manifest_bytes(root, blob, what, local)
                     for r in refs for blob, what in _manifest_blobs(r.image)}
    workers = max(1, concurrency)
    _check_tags(client, refs, workers, move_tags)
    # a delta: every layer the bundle leaves out is in place or can be mounted, before any upload
    outside = external_blobs([(r.destination, r.image.name, r.image.layers) for r in refs])
    if outside:
        report.delta = plan_external(client, outside, workers=workers)
    return PushPlan(root, manifest, refs, raw_manifests, report, workers, local, started)


def send_by_digest(plan: PushPlan, client: RegistryClient, *, progress: Optional[ProgressFactory] = None) -> None:
    """Every blob the registry lacks, then every manifest by its digest, then the carried signatures
    and SBOMs (3.5, into ``plan.handed_on``): no image tag is written or moved, so nothing a puller
    sees changes."""
    report, refs, workers = plan.report, plan.refs, plan.workers
    elsewhere = set()
    if report.delta is not None:
        mount_external(client, report.delta, workers=workers)
        elsewhere = {(b.repository, b.layer.digest) for b in report.delta.blobs}
    plan.sizes, plan.missing = _missing_blobs(client, refs, elsewhere, workers, report)
    _send_blobs(_opener(plan.root, plan.local), client, plan.missing, plan.sizes, workers, progress, report)
    if report.delta is not None:
        report.blobs_present += report.delta.count("present")
        report.blobs_mounted += report.delta.count("mounted")
        plan.missing += report.delta.pairs("mounted")
    _put_manifests(client, refs, plan.raw_manifests)
    plan.handed_on.extend(push_artifacts(plan.root, plan.manifest, client))


def read_back_all(plan: PushPlan, client: RegistryClient, *, by_digest: bool) -> None:
    """Read every ref back (``by_digest``: the manifest its tag will name, before the tag is
    written; else the tag itself) into ``plan.report``, and every carried artifact handed on by its
    digest: one the registry lacks is a problem of the first ref of its image in that repository."""
    def one(r: PushedRef) -> ReadBack:
        return read_back(client, r, plan.sizes, by_digest=by_digest)

    for r, rb in zip(plan.refs, _each(plan.workers, one, plan.refs, client.cancel)):
        r.readback = rb
    for image_name, repo, problem in read_back_artifacts(client, plan.handed_on):
        owner = next((r for r in plan.refs if r.image.name == image_name and r.destination.repository == repo),
                     plan.refs[0])
        owner.readback.problems.append(problem)
    plan.report.refs = plan.refs
    plan.report.stats = client.stats.to_dict()
    plan.report.seconds = time.monotonic() - plan.started


def settle_statuses(plan: PushPlan) -> None:
    """Each ref's status once its tag names the image: ``already-present`` (the tag named it
    before and nothing of it was sent), ``tag-moved`` or ``pushed``."""
    _settle(plan.refs, plan.missing, plan.report)
    plan.report.seconds = time.monotonic() - plan.started


def push_bundle(
    root: BundleRoot,
    manifest: BundleManifest,
    client: RegistryClient,
    *,
    concurrency: int = 4,
    move_tags: bool = True,
    progress: Optional[ProgressFactory] = None,
    local: Optional[Dict[str, str]] = None,
    handed_on: Optional[List[Dict[str, Any]]] = None,
) -> PushReport:
    """Push every tagged image of ``manifest`` (already verified) from ``root`` to the client's
    registry (``bundle push``), in the registry import's order (importer/pipeline/registry.py runs
    the same phases as the load route's steps): :func:`plan_push`, :func:`send_by_digest`,
    :func:`read_back_all` by digest (:func:`refuse_read_back`: a mismatch raises, exit 8, with no tag
    written or moved), then :func:`write_tag` for each tag. ``move_tags=False`` refuses to move a
    tag that names another manifest. ``local``: blobs recompressed for this push (digest -> file;
    ``manifest`` then names them). ``handed_on``: extended with the carried artifacts pushed."""
    plan = plan_push(root, manifest, client, concurrency=concurrency, move_tags=move_tags, local=local)
    if handed_on is not None:
        plan.handed_on = handed_on
    send_by_digest(plan, client, progress=progress)
    read_back_all(plan, client, by_digest=True)
    refuse_read_back(plan.report)
    for r in plan.refs:
        target = plan.tag_target(str(r.image.manifest.digest))
        if r.destination.tag and target is not None:
            write_tag(client, r.destination.repository, r.destination.tag, target, r.pullable)
    settle_statuses(plan)
    return plan.report


#: what a mismatch found by digest before any tag means (``bundle push`` and ``--engine registry``)
NO_TAG_MOVED = ("no tag was written or moved: each names what it named before; push again (blobs already "
                "there are skipped); report this with the receipt if it persists")


def refuse_read_back(report: PushReport) -> None:
    """Raise (exit 8) when an image or carried artifact read back by digest differs, before any tag."""
    bad = [f"{r.pullable}: {'; '.join(r.readback.problems)}" for r in report.refs if not r.readback.ok]
    if bad:
        raise PostLoadMismatch(
            f"reading back from {report.target} by digest: expected every pushed image and its signatures and "
            f"SBOMs to match bundle.json, found {len(bad)} mismatch(es)",
            context="\n".join(bad), hint=NO_TAG_MOVED)


def write_tag(client: RegistryClient, repo: str, tag: str, target: Tuple[str, bytes, str], named: str) -> None:
    """Write ``repo:tag`` onto ``target`` (digest, exact bytes, media type: what this push sent by
    digest, :meth:`PushPlan.tag_target`) unless it names it already, then HEAD it: it must name that
    digest (else exit 8, naming ``named``)."""
    digest, raw, media_type = target
    if client.manifest_digest(repo, tag) != digest:
        client.put_manifest(repo, tag, raw, media_type)
    found = client.manifest_digest(repo, tag)
    if found != digest:
        raise PostLoadMismatch(f"tagging {named}: expected the tag to name {digest}, found {found or 'nothing'}",
                               hint="every manifest was read back by digest before; push again, and report this "
                               "with the receipt if it persists")


def _check_tags(client: RegistryClient, refs: List[PushedRef], workers: int, move_tags: bool) -> None:
    """Where the tags point now (``tag_was``); refuse to move one unless allowed."""
    def tag_now(r: PushedRef) -> Optional[str]:
        return client.manifest_digest(r.destination.repository, r.destination.tag) if r.destination.tag else None

    for r, digest in zip(refs, _each(workers, tag_now, refs, client.cancel)):
        r.tag_was = digest
    conflicts = [r for r in refs if r.tag_was and r.tag_was != str(top_digest(r.image))]
    if conflicts and not move_tags:
        first = conflicts[0]
        raise RegistryTagConflict(
            f"tagging {first.pullable}: expected it free or on {top_digest(first.image).short}, "
            f"found it on another manifest ({first.tag_was})",
            context="\n".join(f"{r.pullable}: {r.tag_was}" for r in conflicts),
            hint="nothing was pushed; re-run with --force to move the tag",
        )


def _missing_blobs(client: RegistryClient, refs: List[PushedRef], elsewhere: Set[Tuple[str, Digest]],
                   workers: int, report: PushReport) -> Tuple[Dict[Digest, int], List[Tuple[str, Digest]]]:
    """Every blob's size, and the (repository, blob) pairs the registry lacks (never an external
    blob: it is mounted or in place already)."""
    sizes: Dict[Digest, int] = {}
    needed: Dict[Tuple[str, Digest], None] = {}
    for r in refs:
        blobs = [(v.config.digest, v.config.size) for v in _carried(r.image)]
        blobs += [(x.digest, x.size) for v in _carried(r.image) for x in v.layers]
        for blob_digest, blob_size in blobs:
            sizes[blob_digest] = blob_size
            if (r.destination.repository, blob_digest) not in elsewhere:  # never upload an external blob
                needed.setdefault((r.destination.repository, blob_digest), None)
    pairs = list(needed)

    def present(pair: Tuple[str, Digest]) -> bool:
        found = client.blob_size(*pair)
        return found is not None and (found < 0 or found == sizes[pair[1]])

    missing = [pair for pair, here in zip(pairs, _each(workers, present, pairs, client.cancel)) if not here]
    report.blobs_present = len(pairs) - len(missing)
    return sizes, missing


def _send_blobs(open_blob: Callable[[Digest], BinaryIO], client: RegistryClient, missing: List[Tuple[str, Digest]],
                sizes: Dict[Digest, int], workers: int, progress: Optional[ProgressFactory],
                report: PushReport) -> None:
    """Upload each missing blob once, then into the other repositories: mount, else upload."""
    first_repo: Dict[Digest, str] = {}
    for repo, blob_digest in missing:
        first_repo.setdefault(blob_digest, repo)
    uploads = list(first_repo.items())
    on_bytes = progress("push", sum(sizes[d] for d, _ in uploads)) if progress is not None else None

    def upload(item: Tuple[Digest, str]) -> None:
        digest, repo = item
        client.upload_blob(repo, digest, sizes[digest], lambda: open_blob(digest), on_bytes)

    _each(workers, upload, uploads, client.cancel)
    report.blobs_uploaded = len(uploads)
    report.bytes_uploaded = sum(sizes[d] for d, _ in uploads)
    others = [(repo, digest) for repo, digest in missing if first_repo[digest] != repo]

    def mount(pair: Tuple[str, Digest]) -> bool:
        repo, digest = pair
        if client.mount_blob(repo, digest, first_repo[digest]):
            return True
        client.upload_blob(repo, digest, sizes[digest], lambda: open_blob(digest), on_bytes)
        return False

    mounted = _each(workers, mount, others, client.cancel)
    report.blobs_mounted = sum(1 for m in mounted if m)
    report.blobs_uploaded += sum(1 for m in mounted if not m)
    report.bytes_uploaded += sum(sizes[d] for (_, d), m in zip(others, mounted) if not m)


def _put_manifests(client: RegistryClient, refs: List[PushedRef],
                   raw_manifests: Dict[Digest, Tuple[bytes, str]]) -> None:
    """Every manifest by its digest (every platform's before the index naming them)."""
    sent_manifests = set()
    for r in refs:
        for blob, _ in _manifest_blobs(r.image):  # every platform's manifest before the index naming them
            key = (r.destination.repository, blob.digest)
            if key in sent_manifests:
                continue
            sent_manifests.add(key)
            if client.manifest_digest(r.destination.repository, str(blob.digest)) is None:
                raw, media_type = raw_manifests[blob.digest]
                client.put_manifest(r.destination.repository, str(blob.digest), raw, media_type)


def _settle(refs: List[PushedRef], missing: List[Tuple[str, Digest]], report: PushReport) -> None:
    for r in refs:
        want = str(top_digest(r.image))
        r.status = "already-present" if r.tag_was == want else "tag-moved" if r.tag_was else "pushed"
    if report.blobs_uploaded or report.blobs_mounted:
        for r in refs:
            if r.status == "already-present" and _uses_any(r, missing):
                r.status = "pushed"


def _uses_any(r: PushedRef, pairs: List[Tuple[str, Digest]]) -> bool:
    mine = {v.config.digest for v in _carried(r.image)} | {x.digest for v in _carried(r.image) for x in v.layers}
    return any(repo == r.destination.repository and d in mine for repo, d in pairs)


def read_back(client: RegistryClient, r: PushedRef, sizes: Dict[Digest, int], *, by_digest: bool = False) -> ReadBack:
    """Read the tag back (``by_digest``: the manifest the tag is to name, by its digest): exact
    manifest bytes, config and diff_ids, every layer present."""
    rb = ReadBack()
    repo = r.destination.repository
    reference = str(top_digest(r.image)) if by_digest or not r.destination.tag else r.destination.tag
    got = client.get_manifest(repo, reference, MAX_MANIFEST)
    if got is None:
        named = r.pullable if reference == r.destination.tag else f"{repo}@{reference}"
        rb.problems.append(f"{named}: the registry does not have it")
        return rb
    raw, _media_type, header_digest = got
    rb.manifest_digest = str(Digest.of_bytes(raw))
    want = str(top_digest(r.image))
    if rb.manifest_digest != want:
        rb.problems.append(f"manifest: expected {want}, found {rb.manifest_digest}")
    if header_digest and header_digest != rb.manifest_digest:
        rb.problems.append(f"manifest: the registry names it {header_digest}, its bytes hash to {rb.manifest_digest}")
    if r.image.index is not None:  # the index: every platform's manifest by digest, the primary's compared
        for v in r.image.others:
            if client.manifest_digest(repo, str(v.manifest.digest)) is None:
                rb.problems.append(f"manifest {v.manifest.digest.short} ({_plat(v.platform)}): missing from {repo}")
        for v in r.image.others:
            for layer in v.layers:
                if client.blob_size(repo, layer.digest) is None:
                    rb.problems.append(f"layer {layer.digest.short} ({_plat(v.platform)}): missing from {repo}")
        got = client.get_manifest(repo, str(r.image.manifest.digest), MAX_MANIFEST)
        if got is None:
            rb.problems.append(f"manifest {r.image.manifest.digest.short}: missing from {repo}")
            return rb
        raw = got[0]
        rb.platform_manifest = str(Digest.of_bytes(raw))
        if rb.platform_manifest != str(r.image.manifest.digest):
            rb.problems.append(f"manifest: expected {r.image.manifest.digest}, found {rb.platform_manifest}")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        rb.problems.append("manifest: not JSON")
        return rb
    config: Dict[str, Any] = doc["config"] if isinstance(doc, dict) and isinstance(doc.get("config"), dict) else {}
    rb.config_digest = str(config.get("digest", ""))
    try:
        cfg_raw = client.get_blob(repo, r.image.config.digest, MAX_CONFIG)
        if Digest.of_bytes(cfg_raw) != r.image.config.digest:
            rb.problems.append(f"config: expected {r.image.config.digest}, found {Digest.of_bytes(cfg_raw)}")
        cfg = json.loads(cfg_raw.decode("utf-8"))
        rootfs: Dict[str, Any] = cfg["rootfs"] if isinstance(cfg, dict) and isinstance(cfg.get("rootfs"), dict) else {}
        ids: List[Any] = rootfs["diff_ids"] if isinstance(rootfs.get("diff_ids"), list) else []
        rb.diff_ids = [str(x) for x in ids]
    except ValueError:
        rb.problems.append("config: not JSON")
    for layer in r.image.layers:
        size = client.blob_size(repo, layer.digest)
        if size is None:
            rb.problems.append(f"layer {layer.digest.short}: missing from {repo}")
        elif size >= 0 and size != sizes.get(layer.digest, layer.size):
            rb.problems.append(f"layer {layer.digest.short}: expected {layer.size} bytes, found {size}")
    return rb
