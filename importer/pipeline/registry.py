"""Importing into a registry (``bundle-import BUNDLE --engine registry --registry HOST:PORT``).

The multi-node path: the offline host's registry receives the verified bundle and every node
pulls from it. The sink is importer/registry/sink.py, an ordinary sink that ``pushes``
(importer/sinks/__init__.py ``Pushing``), its push the same code as ``bundle push``
(importer/registry/push.py). The check after "loading" is the read-back: the registry keeps the
bundle's own manifests, so the image ID is the bundle's manifest digest (identity rule
``manifest-digest``) and the config and diff_ids must be the bundle's. Tags already naming
another manifest are refused without ``--force``. A delta bundle completes from the registry:
its left-out layers must be there or be mounted from another repository
(importer/registry/delta.py), else exit 9 with nothing pushed. The ``registry`` route of a plan
(importer/pipeline/plan.py), walked by importer/pipeline/walk.py ``run_import``."""

from __future__ import annotations

import sys
import time
from typing import Callable, Dict, List, Optional

from importer.engines import EngineImage
from importer.errors import PolicyRejected, PostLoadMismatch
from importer.format.identity import OCI
from importer.input.opened import OpenedBundle
from importer.pipeline.importing import ImportResult
from importer.pipeline.plan import ImportPlan
from importer.pipeline.postload import ImageCheck, check_image
from importer.registry.push import PushedRef, PushReport
from importer.registry.transcode import (
    has_zstd,
    new_workdir,
    remove_workdir,
    signatures_lost,
    signed_and_rewritten,
    transcode,
    zstd_warning,
)
from importer.sinks import Pushing
from importer.verify.opened import verify_or_raise

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def checks_from_push(report: PushReport) -> List[ImageCheck]:
    """One ImageCheck per bundle image, from what the registry gave back for its tags."""
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
        check.status = "already-present" if all(r.status == "already-present" for r in refs) else "loaded"
        check.tags_applied = [r.pullable for r in refs if r.status != "already-present"]
        checks.append(check)
    return checks


def import_to_registry(bundle: OpenedBundle, sink: Pushing, plan: ImportPlan, result: ImportResult, *,
                       progress: Optional[ProgressFactory] = None) -> ImportResult:
    """The ``registry`` route of ``plan``: probe first (the registry answers and takes the login:
    cheap checks before a long verification), verify every byte of the opened bundle (against the
    bundle.json the signature step judged), push (``--force``: the plan's), read back and
    compare; ``result`` is filled in as work proceeds."""
    started = time.monotonic()
    res = result
    root = bundle
    force = plan.force
    _refuse_lost_signatures(bundle, plan)
    res.ran("probe")
    res.engine = sink.probe()
    res.ran("verify")
    res.report = verify_or_raise(bundle, progress=progress)
    res.timings["verifySeconds"] = time.monotonic() - started
    verified = res.report.manifest
    assert verified is not None
    workdir = new_workdir("sneakernet-import-") if plan.compression != "keep" else ""
    t_push = time.monotonic()
    res.ran("push")
    try:
        done = transcode(root, verified, plan.compression, workdir)
        manifest = done.manifest(verified)
        if progress is not None and any(has_zstd(image) for image in manifest.images):  # not --quiet
            sys.stderr.write(f"note: {zstd_warning('--engine registry')}\n")
        # schema 3.5: attached artifacts handed on before the tags, read back after them; schema 3.6:
        # the file artifacts after the images, each under its ref's tag, read back
        pushed = sink.push(root, manifest, move_tags=force, progress=progress, local=done.files)
    finally:
        sink.close()
        remove_workdir(workdir)
    report, files, artifacts = pushed.report, pushed.files, pushed.handed_on
    res.registry_push = {**report.to_dict(), "artifacts": artifacts,  # the receipt's "push" section
                         "fileArtifacts": [p.to_dict() for p in files],
                         "compression": plan.compression, "renamedManifests": dict(done.renamed)}
    if not manifest.images:
        res.registry_push["ok"] = all(p.ok for p in files)
    res.artifacts_taken = [p.artifact.ref for p in files if p.ok]
    res.timings["loadSeconds"] = time.monotonic() - t_push
    res.ran("read-back")
    res.checks = checks_from_push(report)
    bad = [c for c in res.checks if not c.ok]
    bad_files = [p for p in files if not p.ok]
    if bad_files:
        raise PostLoadMismatch(
            "reading back what the registry holds: expected every file artifact to match bundle.json, "
            f"found {len(bad_files)} mismatch(es)",
            context="\n".join(f"{p.pullable}: {'; '.join(p.problems)}" for p in bad_files),
            hint="push again (blobs already there are skipped); report this with the receipt if it persists",
        )
    if report.untagged:
        bad_names = ", ".join(d[:19] for d in report.untagged)
        raise PostLoadMismatch(
            f"pushing to {res.engine.address}: expected every image to have a name, found {len(report.untagged)} "
            f"untagged ({bad_names})",
            hint="a registry names images by repository:tag; the tagged images were pushed and checked",
        )
    if bad:
        raise PostLoadMismatch(
            "reading back what the registry holds: expected every image to match bundle.json, "
            f"found {len(bad)} mismatch(es)",
            context="\n".join(f"{c.image.name}: {c.detail}" for c in bad),
            hint="push again (blobs already there are skipped); report this with the receipt if it persists",
        )
    res.timings["totalSeconds"] = time.monotonic() - started
    return res


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
