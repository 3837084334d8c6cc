"""The ``import`` route of a plan (importer/pipeline/plan.py ``ROUTE_STEPS``): a schema 3 bundle
into an engine. :func:`import_bundle` runs the one load route (importer/pipeline/load.py) over
the bundle's images (:class:`BundlePayload`) once the walk (importer/pipeline/walk.py
``run_import``, the one caller) has opened the bundle, judged its signature and read its
schema: the engine answers (``probe``), one import per engine at a time (``lock``), free space
(``preflight``), every byte verified (``verify``, importer/verify/), the load under staging tags
(``staging-load``), the read-back (``read-back``), with ``--deep`` every image exported again
and hashed (``deep``), the bundle's tags (``tag``) and the staging tags runs killed earlier left
(``drop-stale-staging``). What runs, and with which options, is the plan's.

Images are loaded under a staging tag that only this run uses; the user's tags are applied
only after post-load verification passed. On any failure what this run loaded is removed."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from importer.engines import EngineInfo
from importer.errors import IntegrityError, PostLoadMismatch, UsageError
from importer.format.fileartifacts import FileArtifact
from importer.format.identity import lookup_name
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.platform import parse_platform
from importer.format.staging import new_run_id, staging_ref
from importer.input.opened import BundleRoot, OpenedBundle
from importer.pipeline.gpufit import host_fit
from importer.pipeline.load import load_route
from importer.pipeline.plan import ImportPlan
from importer.pipeline.postload import ImageCheck, check_image
from importer.pipeline.preflight import (
    PreflightReport,
    check_platforms,
    images_to_load,
    run_preflight,
    select_platform,
)
from importer.pipeline.steps import cleanup, deep_or_raise, find_held
from importer.pipeline.tagrule import TagConflict
from importer.sinks import DeltaBase, Sink, delta_completing, file_artifact_keeping, layer_streaming, load_counting
from importer.streams import testhooks
from importer.streams.progress import close_progress
from importer.verify.bundle import VerifyReport
from importer.verify.opened import verify_or_raise, verify_unstreamed_layers
from importer.verify.signature import SignatureCheck

ProgressFactory = Callable[[str, int], Callable[[int], None]]


@dataclass
class ImportResult:
    root: str
    bundle_digest: str
    report: VerifyReport
    engine: Optional[EngineInfo] = None
    checks: List[ImageCheck] = field(default_factory=list)
    timings: Dict[str, float] = field(default_factory=dict)
    leftovers: List[str] = field(default_factory=list)
    signature: Optional[SignatureCheck] = None
    preflight: Optional[PreflightReport] = None  # the receipt's "preflight" section (to_dict())
    staging_refs: List[str] = field(default_factory=list)  # this run's staging tags
    stale_removed: List[str] = field(default_factory=list)  # staging tags of killed runs, removed
    lock_file: Optional[str] = None
    gpu_fit: Optional[Dict[str, Any]] = None  # each image judged on this host's driver (docs/gpu-fit.md)
    registry_push: Optional[Dict[str, Any]] = None  # --engine registry: what the push did (the receipt's "push")
    image_signatures: Optional[List[Dict[str, Any]]] = None  # --require-signed: which key signed which image
    files: Optional[Dict[str, Any]] = None  # --files-to: the files written (the receipt's "files", 3.6)
    artifacts_taken: List[str] = field(default_factory=list)  # file artifacts (3.6) a layout or registry took
    steps: List[str] = field(default_factory=list)  # the plan's steps entered, in order (the last: where it stopped)

    def ran(self, step: str) -> None:
        """Report ``step`` (a name of the plan's, importer/pipeline/plan.py) as entered: each once, in the
        order first reached; tests/test_import_steps.py compares them with ``plan.steps`` for every route."""
        if step not in self.steps:
            self.steps.append(step)

    @property
    def ok(self) -> bool:
        if (self.files is not None or self.artifacts_taken) and not self.checks:  # files alone (3.6)
            return self.report.ok
        return self.report.ok and bool(self.checks) and all(c.ok for c in self.checks)


def _load_total(sink: Sink, manifest: BundleManifest, images: List[ImageRecord],
                external: Optional[DeltaBase]) -> int:
    """The bytes the sink's load reports: its own count where it copies stored blobs (the OCI
    layout), else the uncompressed layers it streams into the engine."""
    if sink.capabilities.counts_load_bytes:
        return load_counting(sink).load_total(images, external or None)
    return sum(x.uncompressed_size for x in manifest.unique_layers())


def import_bundle(bundle: OpenedBundle, sink: Sink, plan: ImportPlan, result: ImportResult, *,
                  signature: SignatureCheck, progress: Optional[ProgressFactory] = None,
                  on_notice: Optional[Callable[[str], None]] = None) -> ImportResult:
    """The ``import`` route of ``plan``: the one load route (importer/pipeline/load.py) over the
    schema 3 bundle the walk opened and whose ``signature`` it judged; its options (``--platform``,
    ``--require-fit``, ``--wait-lock``, ``--force``, ``--deep``) are the plan's. ``result`` is filled
    in as work proceeds, so the caller still writes a receipt when this raises. Order: docs/security.md."""
    payload = BundlePayload(bundle, plan, signature, on_notice)  # --platform: its error after the signature's
    load_route(payload, sink, plan, result, progress=testhooks.wrap_progress(progress), on_notice=on_notice)
    return result


class BundlePayload:
    """A schema 3 bundle's images for the load route: verified before the engine commits any (a sink
    whose load stream checks each layer blob it sends gets those blobs' bytes left to the stream:
    each layer read once and decompressed once), loaded as the sink loads OCI images (a tar or parts
    read in place where it ``reads_archives``), a delta completed from what the engine holds, an
    OCI layout's file artifacts (3.6) after the tags."""

    mismatch_hint = ("the images this run loaded were removed; report this with the receipt "
                     "(an engine that rewrites images cannot be verified this way)")

    def __init__(self, bundle: OpenedBundle, plan: ImportPlan, signature: SignatureCheck,
                 on_notice: Optional[Callable[[str], None]]) -> None:
        self.platform = parse_platform(plan.platform) if plan.platform else None
        self.bundle, self.plan, self.signature, self.on_notice = bundle, plan, signature, on_notice
        self.root = bundle.path
        self.manifest = bundle.manifest()  # the one typed object the opened bundle parsed (the bytes sig judged)
        self.engine: Optional[EngineInfo] = None
        self.deferred = False
        self.present: List[ImageCheck] = []
        self.staged_images: List[ImageRecord] = []
        self.staged: Dict[int, str] = {}
        self.layout_files: List[FileArtifact] = []
        self.external: Optional[DeltaBase] = None

    def refuse(self, sink: Sink) -> None:
        load_root(self.bundle, sink)  # a tar or parts into an engine that loads from folders only: refused now

    def probed(self, sink: Sink, engine: EngineInfo, result: Any) -> None:
        self.engine = engine
        self.manifest = select_platform(self.manifest, engine, self.platform)  # a multi-platform image: the one it runs
        check_platforms(self.manifest, engine, self.platform)  # an engine runs one platform: refuse others now
        # will the images run on this host's driver and GPUs (a warning; --require-fit: an error)
        result.gpu_fit = host_fit(self.manifest.images, engine.kind, require=self.plan.require_fit,
                                  on_notice=self.on_notice)

    def preflight(self, sink: Sink, engine: EngineInfo) -> PreflightReport:
        return run_preflight(self.manifest, engine, images_to_load(sink, self.manifest, engine),
                             signature_line=self.signature.line())

    def verify(self, sink: Sink, result: Any, progress: Optional[ProgressFactory]) -> None:
        streams = sink.capabilities.checks_layers_while_loading
        self.deferred = streams and not self.bundle.checked_whole
        result.report = verify_or_raise(self.bundle, progress=progress, deep=not streams, defer_layers=self.deferred)
        manifest = result.report.manifest
        assert manifest is not None and self.engine is not None
        self.manifest = select_platform(manifest, self.engine, self.platform)  # every platform verified

    def images(self) -> List[ImageRecord]:
        return list(self.manifest.images)

    def store(self) -> str:
        assert self.engine is not None, "the probe step runs first"
        return self.engine.image_store

    def to_load(self, sink: Sink, engine: EngineInfo) -> List[ImageRecord]:
        to_load: List[ImageRecord] = []
        for image in self.manifest.images:
            held = find_held(sink, image, engine)
            if held is not None:
                self.present.append(held)
            else:
                to_load.append(image)
        return to_load

    def prepare(self, sink: Sink, to_load: List[ImageRecord], result: Any, *, force: bool,
                progress: Optional[ProgressFactory]) -> None:
        self.layout_files = _layout_files(sink, self.manifest, force)  # a ref naming other bytes: refused first
        if self.deferred:
            # the layers the load stream will not send (held images, other platforms): read and
            # checked now, before anything is loaded
            with _listing_every_problem(self.bundle, progress):
                verify_unstreamed_layers(self.bundle, result.report, layer_streaming(sink).streamed_layers(to_load))
        self.external = _delta_base(sink, self.manifest, to_load)

    def load(self, sink: Sink, engine: EngineInfo, to_load: List[ImageRecord], result: Any,
             progress: Optional[ProgressFactory]) -> List[str]:
        self.staged_images = to_load
        with _listing_every_problem(self.bundle, progress, self.deferred):
            self.staged = _load_staged(sink, load_root(self.bundle, sink), self.manifest, to_load, self.external,
                                       result, progress)
        return list(self.staged.values())

    def read_back(self, sink: Sink, engine: EngineInfo, result: Any) -> List[ImageCheck]:
        if not self.staged_images:
            return list(self.present)
        t_check = time.monotonic()
        checks = [check_image(image, sink.lookup(self.staged.get(n, lookup_name(engine.image_store, image))),
                              engine.image_store) for n, image in enumerate(self.staged_images)]
        result.timings["postLoadSeconds"] = time.monotonic() - t_check
        return self.present + checks

    def deep(self, sink: Sink, checks: List[ImageCheck], staged: List[str], result: Any,
             progress: Optional[ProgressFactory]) -> None:
        deep_or_raise(sink, checks, self.root, staged, result, progress=progress,
                      hint="the engine's stored copy of those layers is damaged: remove the image (and every "
                      "image sharing the layer) from the engine and import again; nothing was tagged by this run")

    def tagged(self, sink: Sink, result: Any, progress: Optional[ProgressFactory]) -> None:
        if self.layout_files:
            _load_layout_files(sink, load_root(self.bundle, sink), self.layout_files, result, progress)

    def finish(self, result: Any) -> None:
        if result.report.manifest is not None:
            result.report.signature = self.signature.to_dict()


def _layout_files(sink: Sink, manifest: BundleManifest, force: bool) -> List[FileArtifact]:
    """The file artifacts (3.6) an engine that keeps OCI artifacts takes (``takes_file_artifacts``:
    the OCI layout), each ref free or naming the same manifest unless ``force``."""
    if not sink.capabilities.takes_file_artifacts or not manifest.file_artifacts:
        return []
    keeper = file_artifact_keeping(sink)
    for art in manifest.file_artifacts:
        found = keeper.ref_digest(art.ref)
        if found is not None and found != str(art.manifest.digest) and not force:
            raise TagConflict(f"naming the artifact {art.ref}: expected the name free or on "
                              f"{art.manifest.digest.short}, found it on {found[:19]}",
                              hint="nothing was written for it; pass --force to move the name")
    return list(manifest.file_artifacts)


def _load_layout_files(sink: Sink, root: BundleRoot, artifacts: List[FileArtifact], res: ImportResult,
                       progress: Optional[ProgressFactory]) -> None:
    """Copy the file artifacts into the engine (after the images' tags), then read them back."""
    t_files = time.monotonic()
    on_bytes = progress("files", sum(b.size for a in artifacts for b in a.every_blob())) if progress else None
    problems = file_artifact_keeping(sink).load_files(root, artifacts, on_bytes)
    close_progress(on_bytes)
    if problems:
        raise PostLoadMismatch("reading back the file artifacts: expected each named with its blobs, found "
                               f"{len(problems)} problem(s)", context="\n".join(problems),
                               hint="import again (blobs already there are kept); report this if it persists")
    res.artifacts_taken = [a.ref for a in artifacts]
    res.timings["filesSeconds"] = time.monotonic() - t_files


@contextlib.contextmanager
def _listing_every_problem(bundle: OpenedBundle, progress: Optional[ProgressFactory],
                           deferred: bool = True) -> Iterator[None]:
    """Where a layer blob checked on its way into the engine (``deferred``) fails, nothing was
    loaded (the stream was cut before the blob was complete): the whole bundle is verified
    again to list every problem, as a verification before the load would have
    (``verification-failed``, exit 3); the first error stands where that finds none."""
    try:
        yield
    except IntegrityError:
        if deferred:
            verify_or_raise(bundle, progress=progress, deep=False)
        raise


def load_root(bundle: OpenedBundle, sink: Sink) -> BundleRoot:
    """What the sink's ``load`` reads: the opened bundle itself for a sink that ``reads_archives``
    (a tar or parts read in place: no unpacking, no concatenation), else the bundle's folder (a tar
    or parts refused before anything changes)."""
    if sink.capabilities.reads_archives:
        return bundle
    return bundle.require_folder(
        f"importing {bundle.describe()} into {sink.kind}: expected a bundle folder for this engine, "
        "found a tar/parts",
        hint="verify it here with --verify-only, or import it into docker or a registry; for this engine "
        "unpack it first (mkdir B && tar -xf FILE.tar -C B; for parts: cat FILE.tar.part[0-9]* | tar -x -C B) "
        "and import B",
    )


def _delta_base(sink: Sink, manifest: BundleManifest, to_load: List[ImageRecord]) -> Optional[DeltaBase]:
    """A delta bundle: the engine must hold every layer it leaves out (nothing loaded otherwise);
    what the sink's load needs to complete it (None: not a delta, or nothing to load)."""
    if not (manifest.is_delta and to_load):
        return None
    if not sink.capabilities.completes_deltas:
        raise UsageError(f"importing a delta bundle into {sink.kind}: "
                         "expected an engine that can complete it (docker, podman, containerd, an OCI "
                         f"layout, a registry), found {sink.kind}",
                         hint="nothing was loaded; re-export without --have for this host")
    return delta_completing(sink).prepare_delta(manifest)  # raises DeltaBaseMissing (exit 9) before anything is loaded


def _load_staged(sink: Sink, root: BundleRoot, manifest: BundleManifest, to_load: List[ImageRecord],
                 external: Optional[DeltaBase], res: ImportResult,
                 progress: Optional[ProgressFactory]) -> Dict[int, str]:
    """Load ``to_load`` under this run's staging tags (untagged images untagged, found by the ID
    the identity rule predicts): those tags, by the image's place in ``to_load``."""
    staged: Dict[int, str] = {}
    if not to_load:
        return staged
    t_load = time.monotonic()
    run_id = new_run_id()
    staged_images = []
    for n, image in enumerate(to_load):
        if not image.refs:  # untagged in the bundle: loaded untagged, found by config digest
            staged_images.append(image)
            continue
        staged[n] = staging_ref(run_id, n)
        staged_images.append(_with_refs(image, (staged[n],)))
    res.staging_refs = list(staged.values())
    on_bytes = progress("load", _load_total(sink, manifest, staged_images, external)) if progress else None
    try:
        if external:
            sink.load(root, staged_images, on_bytes, external=external)
        else:
            sink.load(root, staged_images, on_bytes)
    except BaseException:
        res.leftovers = cleanup(sink, list(staged.values()), [])
        raise
    close_progress(on_bytes)
    res.timings["loadSeconds"] = time.monotonic() - t_load
    testhooks.reached("loaded")
    return staged


def _with_refs(image: ImageRecord, refs: Tuple[str, ...]) -> ImageRecord:
    """``image`` under other names (its index and other platforms kept: an OCI layout stores them)."""
    return dataclasses.replace(image, refs=refs, label=image.name)
