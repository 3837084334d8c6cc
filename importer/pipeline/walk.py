"""``run_import``: the one import orchestrator. It walks an :class:`~importer.pipeline.plan.ImportPlan`:
the front steps every plan shares (open the bundle once, the signature and trust policy, the
schema, ``--require-signed``), then the plan's route, one step function per mode (:data:`ROUTES`):
``verify-only`` (verify/opened.py, verify/legacy.py), ``check-only`` (pipeline/checkonly.py),
``import`` (pipeline/importing.py), ``legacy-import`` (pipeline/legacy.py) and ``registry``
(pipeline/registry.py). The result passed in is filled in as the steps proceed, so the caller
writes a receipt when a step raises (importer/cli/main.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

from importer.input.opened import OpenedBundle, open_bundle
from importer.pipeline.checkonly import CheckOnlyResult, check_only
from importer.pipeline.files import check_held_files, files_only, write_carried_files
from importer.pipeline.importing import ImportResult, import_bundle
from importer.pipeline.legacy import import_legacy_bundle
from importer.pipeline.plan import (
    CHECK_ONLY,
    FILES,
    IMPORT,
    LEGACY_IMPORT,
    REGISTRY,
    VERIFY_ONLY,
    WRITE_FILES,
    ImportPlan,
)
from importer.pipeline.registry import import_to_registry
from importer.sinks import Sink
from importer.verify.bundle import VerifyReport
from importer.verify.cosign import images_signed
from importer.verify.opened import verify_legacy_or_raise, verify_or_raise
from importer.verify.signature import SignatureCheck, TrustPolicy, check_signature, load_trusted_keys

ProgressFactory = Callable[[str, int], Callable[[int], None]]
Notice = Callable[[str], None]
LEGACY_MAJORS = (1, 2)


@dataclass
class Walk:
    """What the steps of one run share: the plan (the schema step may refine it), what the front
    steps found, and where the route reports."""

    plan: ImportPlan
    sink: Optional[Sink]
    result: ImportResult
    progress: Optional[ProgressFactory]
    on_notice: Notice
    bundle: Optional[OpenedBundle] = None
    signature: Optional[SignatureCheck] = None
    make_sink: Optional[Callable[[], Sink]] = None

    def opened(self) -> OpenedBundle:
        assert self.bundle is not None, "the open step runs first"
        return self.bundle

    def sig(self) -> SignatureCheck:
        assert self.signature is not None, "the signature step runs before the route"
        return self.signature

    def engine(self) -> Sink:
        if self.sink is None and self.make_sink is not None:  # --files-to: made once the bundle said it has images
            self.sink = self.make_sink()
        assert self.sink is not None, f"a {self.plan.mode} plan needs a sink"
        return self.sink


def result_for(plan: ImportPlan) -> ImportResult:
    """The empty result a run of ``plan`` fills in (a check-only run's carries its receipt section)."""
    kind = CheckOnlyResult if plan.mode == CHECK_ONLY else ImportResult
    return kind(root=plan.bundle, bundle_digest="", report=VerifyReport(root=plan.bundle))


def run_import(plan: ImportPlan, sink: Optional[Sink], result: ImportResult, *,
               progress: Optional[ProgressFactory] = None, on_notice: Optional[Notice] = None,
               make_sink: Optional[Callable[[], Sink]] = None) -> ImportResult:
    """Walk ``plan``: its front steps, then its route (the plan as the schema step refined it).
    ``sink``: None for a plan that needs no engine (``verify-only``, ``files``); ``make_sink``: makes
    it when the route first asks (``--files-to``: a bundle of files alone needs none)."""
    walk = Walk(plan, sink, result, progress, on_notice or (lambda line: None), make_sink=make_sink)
    for step in walk.plan.steps:
        front = FRONT.get(step)
        if front is not None:
            walk.result.ran(step)
            front(walk)
    check_held_files(walk.opened(), walk.plan)  # a file delta's base (3.8): before any image is loaded
    ROUTES[walk.plan.mode](walk)
    if walk.plan.mode != FILES and walk.plan.runs(WRITE_FILES):  # after the images (the files route: its own)
        write_carried_files(walk.opened(), walk.plan, result, progress=walk.progress)
    return result


def open_step(walk: Walk) -> None:
    walk.bundle = open_bundle(walk.plan.bundle)


def signature_step(walk: Walk) -> None:
    """The trust policy, before anything else reads the bundle (docs/security.md)."""
    plan, bundle = walk.plan, walk.opened()
    policy = TrustPolicy(load_trusted_keys(plan.trust), plan.require_signature)
    sig = check_signature(bundle, policy)
    if not plan.quiet:
        walk.on_notice(sig.line())
    walk.signature = walk.result.signature = sig
    walk.result.bundle_digest = str(bundle.digest)


def schema_step(walk: Walk) -> None:
    """A schema 1/2 bundle (a folder only) refines the plan (:meth:`ImportPlan.for_schema`)."""
    walk.plan = walk.plan.for_schema(legacy_major(walk.opened()))
    if walk.plan.legacy_major is None and walk.plan.mode in (IMPORT, REGISTRY):  # 3.6: files alone need no engine
        walk.plan = walk.plan.for_images(len(walk.opened().manifest().images))


def image_signatures_step(walk: Walk) -> None:
    """``--require-signed``: the publisher's image signatures, before the engine is asked anything."""
    plan = walk.plan
    walk.result.image_signatures = images_signed(walk.opened(), plan.require_signed, plan.legacy_major,
                                                 quiet=plan.quiet_image_signatures, on_notice=walk.on_notice)


def legacy_major(bundle: OpenedBundle) -> Optional[int]:
    """The schema major of a schema 1/2 bundle (a folder only), else None."""
    major = bundle.schema_major()
    if major not in LEGACY_MAJORS:
        return None
    bundle.require_folder(
        f"reading {bundle.path}: expected a schema 3 bundle in a tar or parts, found schema {major}",
        hint="unpack it (mkdir B && tar -xf FILE.tar -C B; parts: cat FILE.tar.part[0-9]* | tar -x -C B) "
             "and import the folder B")
    return major


def verify_only(walk: Walk) -> None:
    """Verify every byte and stop (a schema 1/2 bundle: its archive against bundle.json)."""
    plan, bundle = walk.plan, walk.opened()
    walk.result.ran("verify")
    if plan.legacy_major is not None:
        report = verify_legacy_or_raise(bundle, plan.legacy_major)
    else:
        report = verify_or_raise(bundle, progress=walk.progress, deep=not plan.shallow)
    report.signature = walk.sig().to_dict()
    walk.result.report = report


def check(walk: Walk) -> None:
    check_only(walk.opened(), walk.engine(), walk.plan, walk.result, progress=walk.progress)


def legacy_import(walk: Walk) -> None:
    import_legacy_bundle(walk.opened(), walk.engine(), walk.plan, walk.result, signature_line=walk.sig().line(),
                         on_notice=walk.on_notice)


def registry_import(walk: Walk) -> None:
    """The load route into a registry: push by digest, read back, tag (pipeline/registry.py)."""
    import_to_registry(walk.opened(), walk.engine(), walk.plan, walk.result, signature_line=walk.sig().line(),
                       progress=walk.progress, on_notice=walk.on_notice)


def files_route(walk: Walk) -> None:
    """Verify every byte, write the files (``--files-only``, or a bundle of files alone: no engine)."""
    files_only(walk.opened(), walk.plan, walk.result, progress=walk.progress)


def engine_import(walk: Walk) -> None:
    import_bundle(walk.opened(), walk.engine(), walk.plan, walk.result, signature=walk.sig(), progress=walk.progress,
                  on_notice=walk.on_notice)


FRONT: Dict[str, Callable[[Walk], None]] = {
    "open": open_step, "signature": signature_step, "schema": schema_step, "image-signatures": image_signatures_step,
}
ROUTES: Dict[str, Callable[[Walk], None]] = {
    VERIFY_ONLY: verify_only, CHECK_ONLY: check, IMPORT: engine_import, LEGACY_IMPORT: legacy_import,
    REGISTRY: registry_import, FILES: files_route,
}
