"""Importing into a registry (``bundle-import BUNDLE --engine registry --registry HOST:PORT``): the
``registry`` route of a plan (importer/pipeline/plan.py), the one load route
(importer/pipeline/load.py ``load_route``) over :class:`RegistryPayload`, walked by
importer/pipeline/walk.py ``run_import``.

The multi-node path: the offline host's registry receives the verified bundle and every node
pulls from it. The sink is importer/registry/sink.py, an ordinary sink that ``pushes``
(importer/sinks/__init__.py ``Pushing``), its push the same code as ``bundle push``
(importer/registry/push.py), cut into the route's steps. What each step means for a registry:

- ``probe``: the registry answers and takes the login (cheap, before a long verification);
  ``--compression`` that would drop signatures is refused (or noted) even before it.
- ``lock``: one import into this registry (``HOST:PORT/NAMESPACE``) from this host at a time,
  the engines' lock (importer/pipeline/lock.py keyed by the sink's address; ``--wait-lock``):
  a registry cannot check a tag and write it in one request, so two imports checking the same
  tags and then writing them would race; imports from other hosts are not seen by it.
- ``preflight``: a registry reports no free space, so that is said, not measured (a full registry
  refuses an upload: exit 6, no tag written); nor is the temp folder ``--compression`` writes
  into (the recompressed size is known only once written: a full one is named when it fills,
  exit 2, nothing sent).
- ``verify``: every byte, as for any engine, before anything is sent.
- then, before anything is sent: the layers recompressed (``--compression``), each tag free or on
  the bundle's image (``TagConflict``, exit 7, unless ``--force``; a multi-platform image's tag
  names its index), the file artifacts' tags, and a delta bundle's left-out layers found in the
  registry (importer/registry/delta.py; else exit 9).
- ``staging-load``: every blob and manifest pushed by digest, then the carried signatures and
  SBOMs (3.5): no tag is written, so nothing a puller sees changes (there are no staging tags).
- ``read-back``: every image read back by digest (manifest bytes, config and diff_ids, every layer
  with its size: the identity rule ``manifest-digest``); a mismatch leaves every tag where it was
  (exit 8; what went in by digest stays, named by no tag).
- ``tag``: only now each tag is written, with the bytes read back, and HEAD again.
- ``drop-stale-staging``: nothing to drop (a registry import writes no staging tag).
- the file artifacts (3.6) last, each under its tag, read back.

``--deep`` is refused when the arguments are read (a registry exports nothing again; the read-back
already compares every manifest, config and diff_id)."""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from importer.engines import EngineImage, EngineInfo
from importer.errors import PolicyRejected, PostLoadMismatch
from importer.format.identity import OCI
from importer.format.manifest import BundleManifest, ImageRecord
from importer.input.opened import OpenedBundle
from importer.pipeline.importing import ImportResult
from importer.pipeline.load import Notice, load_route
from importer.pipeline.plan import ImportPlan
from importer.pipeline.postload import ImageCheck, check_image
from importer.pipeline.preflight import PreflightReport
from importer.registry.push import NO_TAG_MOVED, PushedRef, PushReport, settle_statuses
from importer.registry.transcode import (
    Transcoded,
    has_zstd,
    new_workdir,
    remove_workdir,
    signatures_lost,
    signed_and_rewritten,
    transcode,
    zstd_warning,
)
from importer.sinks import PushOutcome, Sink, pushing, reexporting
from importer.verify.opened import verify_or_raise

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def checks_from_push(report: PushReport) -> List[ImageCheck]:
    """One ImageCheck per bundle image, from what the registry gave back for the manifest its tags name."""
    by_image: Dict[str, List[PushedRef]] = {}
    for r in report.refs:
        by_image.setdefault(str(r.image.manifest.digest), []).append(r)
    checks: List[ImageCheck] = []
    for refs in by_image.values():
        image = refs[0].image
        problems = [p for r in refs for p in r.readback.problems]
        first = next((r.readback for r in refs if r.readback.manifest_digest), refs[0].readback)
        # a multi-platform image: the tag names the index; the image is its primary platform's manifest
        found = EngineImage(image_id=first.platform_manifest or first.manifest_digest, diff_ids=list(first.diff_ids),
                            tags=[r.pullable for r in refs], config_digest=first.config_digest or None,
                            manifest_digest=first.platform_manifest or first.manifest_digest or None,
                            problems=problems)
        check = check_image(image, found if first.manifest_digest else None, OCI)
        if not first.manifest_digest and problems:  # nothing read back: say what the registry answered
            check.detail = "; ".join(problems)
        check.status = "loaded"  # until the tags are written (_settle_checks)
        checks.append(check)
    return checks


def import_to_registry(bundle: OpenedBundle, sink: Sink, plan: ImportPlan, result: ImportResult, *,
                       signature_line: str, progress: Optional[ProgressFactory] = None,
                       on_notice: Optional[Notice] = None) -> ImportResult:
    """The ``registry`` route of ``plan``: the one load route over the opened bundle (see the module
    doc); ``--force``, ``--wait-lock`` and ``--compression`` are the plan's. ``result`` is filled in
    as work proceeds, so the caller still writes a receipt when this raises."""
    load_route(RegistryPayload(bundle, plan, signature_line), sink, plan, result, progress=progress,
               on_notice=on_notice)
    return result


class RegistryPayload:
    """A schema 3 bundle's images and files for a registry (see the module doc): pushed by digest,
    read back by digest, tagged by the route's ``tag`` step, the file artifacts after the tags."""

    mismatch_hint = NO_TAG_MOVED

    def __init__(self, bundle: OpenedBundle, plan: ImportPlan, signature_line: str) -> None:
        self.bundle, self.plan, self.signature_line = bundle, plan, signature_line
        self.root = bundle.path
        self.manifest: BundleManifest = bundle.manifest()
        self.done: Optional[Transcoded] = None
        self.workdir = ""
        self.outcome: Optional[PushOutcome] = None

    def refuse(self, sink: Sink) -> None:
        pushing(sink)  # the plan's mode came from the same arguments as the sink
        _refuse_lost_signatures(self.bundle, self.plan)

    def probed(self, sink: Sink, engine: EngineInfo, result: Any) -> None:
        """A registry holds every platform and runs nothing: no platform chosen, no GPU fit."""

    def preflight(self, sink: Sink, engine: EngineInfo) -> PreflightReport:
        report = PreflightReport()
        report.add("signature", True, self.signature_line)
        report.add("schema", True, f"bundle schema {self.manifest.schema_version} is supported")
        report.add("engine", True, f"registry {engine.address} answers ({engine.version})")
        report.add("registry-space", True, "not measurable: a registry reports no free space (one that is full "
                   "refuses an upload, and no tag is written before every image was read back)")
        if self.plan.compression != "keep":  # an ENOSPC there names the file and the folder, nothing sent
            report.add("temp-space", True, "not measured: --compression writes the recompressed layers under "
                       f"{tempfile.gettempdir()} (TMPDIR), whose size is known only once written")
        return report

    def verify(self, sink: Sink, result: Any, progress: Optional[ProgressFactory]) -> None:
        result.report = verify_or_raise(self.bundle, progress=progress)
        verified = result.report.manifest
        assert verified is not None
        self.manifest = verified

    def images(self) -> List[ImageRecord]:
        return list(self.manifest.images)

    def store(self) -> str:
        return OCI

    def to_load(self, sink: Sink, engine: EngineInfo) -> List[ImageRecord]:
        """Every image, as it will be pushed (``--compression``: its layers recompressed now, each
        diff_id checked; new manifest digests); the push skips each blob the registry holds."""
        self.workdir = new_workdir("sneakernet-import-") if self.plan.compression != "keep" else ""
        self.done = transcode(self.bundle, self.manifest, self.plan.compression, self.workdir)
        self.manifest = self.done.manifest(self.manifest)
        if not self.plan.quiet and any(has_zstd(image) for image in self.manifest.images):
            sys.stderr.write(f"note: {zstd_warning('--engine registry')}\n")
        return list(self.manifest.images)

    def prepare(self, sink: Sink, to_load: List[ImageRecord], result: Any, *, force: bool,
                progress: Optional[ProgressFactory]) -> None:
        """The push planned, nothing sent: the file artifacts' tags, every ref, a delta's base."""
        assert self.done is not None
        self.outcome = pushing(sink).plan_push(self.bundle, self.manifest, move_tags=force, local=self.done.files)

    def load(self, sink: Sink, engine: EngineInfo, to_load: List[ImageRecord], result: Any,
             progress: Optional[ProgressFactory]) -> List[str]:
        assert self.outcome is not None
        t_push = time.monotonic()
        pushing(sink).push_by_digest(self.outcome, progress)
        result.timings["loadSeconds"] = time.monotonic() - t_push
        return []  # no staging tag: nothing is named before it was read back

    def read_back(self, sink: Sink, engine: EngineInfo, result: Any) -> List[ImageCheck]:
        assert self.outcome is not None
        t_check = time.monotonic()
        pushing(sink).read_back(self.outcome)
        result.timings["postLoadSeconds"] = time.monotonic() - t_check
        self._report(result)
        return checks_from_push(self.outcome.report)

    def deep(self, sink: Sink, checks: List[ImageCheck], staged: List[str], result: Any,
             progress: Optional[ProgressFactory]) -> None:
        reexporting(sink)  # refused: plan_from_args refuses --deep with a registry first

    def tagged(self, sink: Sink, result: Any, progress: Optional[ProgressFactory]) -> None:
        """Each ref's status now its tag is written; the file artifacts (3.6), read back; then what
        could not be named refused."""
        outcome = self.outcome
        assert outcome is not None
        if outcome.plan is not None:
            settle_statuses(outcome.plan)
            _settle_checks(result.checks, outcome.report)
        pushing(sink).push_files(self.bundle, outcome, progress)
        self._report(result)
        if not self.manifest.images:
            result.registry_push["ok"] = all(p.ok for p in outcome.files)
        result.artifacts_taken = [p.artifact.ref for p in outcome.files if p.ok]
        bad_files = [p for p in outcome.files if not p.ok]
        if bad_files:
            raise PostLoadMismatch(
                "reading back what the registry holds: expected every file artifact to match bundle.json, "
                f"found {len(bad_files)} mismatch(es)",
                context="\n".join(f"{p.pullable}: {'; '.join(p.problems)}" for p in bad_files),
                hint="push again (blobs already there are skipped); report this with the receipt if it persists",
            )
        untagged = outcome.report.untagged
        if untagged:
            bad_names = ", ".join(d[:19] for d in untagged)
            raise PostLoadMismatch(
                f"pushing to {outcome.report.target}: expected every image to have a name, found {len(untagged)} "
                f"untagged ({bad_names})",
                hint="a registry names images by repository:tag; the tagged images were pushed and checked",
            )

    def finish(self, result: Any) -> None:
        remove_workdir(self.workdir)

    def _report(self, result: Any) -> None:
        """The receipt's "push" section, from what the push did so far."""
        assert self.outcome is not None and self.done is not None
        outcome = self.outcome
        result.registry_push = {**outcome.report.to_dict(), "artifacts": outcome.handed_on,
                                "fileArtifacts": [p.to_dict() for p in outcome.files],
                                "compression": self.plan.compression, "renamedManifests": dict(self.done.renamed)}


def _settle_checks(checks: List[ImageCheck], report: PushReport) -> None:
    """Each image's status and the tags this run wrote (as the registry names them), from its refs."""
    by_image: Dict[str, List[PushedRef]] = {}
    for r in report.refs:
        by_image.setdefault(str(r.image.manifest.digest), []).append(r)
    for check in checks:
        refs = by_image.get(str(check.image.manifest.digest), [])
        check.status = "already-present" if refs and all(r.status == "already-present" for r in refs) else "loaded"
        check.tags_applied = [r.pullable for r in refs if r.status != "already-present"]


def _refuse_lost_signatures(bundle: OpenedBundle, plan: ImportPlan) -> None:
    """``--compression`` that rewrites signed images (schema 3.5 artifacts) gives the registry manifests
    no signature names: said before anything is verified or sent, refused under ``--require-signed``
    unless ``--allow-recompressed-signed`` (as ``bundle push``)."""
    if plan.compression == "keep" or bundle.schema_major() != 3:
        return
    lost = signed_and_rewritten(bundle.manifest(), plan.compression)
    if lost and plan.require_signed and not plan.allow_recompressed_signed:
        raise PolicyRejected(signatures_lost("importing into a registry with --require-signed", plan.compression,
                                             lost),
                             hint="import with --compression keep (Docker before 23.0 reads no zstd: pull those nodes "
                             "through `bundle-import serve`), or pass --allow-recompressed-signed; nothing was sent")
    if lost and not plan.quiet:
        sys.stderr.write(f"note: {signatures_lost('--engine registry', plan.compression, lost)}\n")
