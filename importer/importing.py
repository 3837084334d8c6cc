"""import_bundle(): verify every byte, then load, then prove what the engine holds, then tag.

Images are loaded under a staging tag that only this run uses; the user's tags are applied
only after post-load verification passed. On any failure what this run loaded is removed."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from importer.digest import Digest
from importer.errors import (
    BundleError,
    PolicyRejected,
    PostLoadMismatch,
    VerificationFailed,
)
from importer.limits import MAX_BUNDLE_JSON, read_file_limited
from importer.manifest import BUNDLE_JSON, ImageRecord
from importer.postload import ImageCheck, check_image
from importer.sinks import EngineInfo, Sink
from importer.verify import VerifyReport, verify_bundle

ProgressFactory = Callable[[str, int], Callable[[int], None]]

STAGING_REPO = "sneakernet-staging"


class TagConflict(PolicyRejected):
    reference = "tag-conflict"


@dataclass
class ImportResult:
    root: str
    bundle_digest: str
    report: VerifyReport
    engine: Optional[EngineInfo] = None
    checks: List[ImageCheck] = field(default_factory=list)
    timings: Dict[str, float] = field(default_factory=dict)
    leftovers: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.report.ok and bool(self.checks) and all(c.ok for c in self.checks)


def bundle_digest(root: str) -> str:
    return str(Digest.of_bytes(read_file_limited(os.path.join(root, BUNDLE_JSON), MAX_BUNDLE_JSON, BUNDLE_JSON)))


def verify_or_raise(root: str, *, progress: Optional[ProgressFactory] = None) -> VerifyReport:
    """Verify the bundle; raise VerificationFailed listing every problem."""
    on_bytes = None
    if progress is not None:
        total = 0
        try:
            total = sum(os.path.getsize(os.path.join(root, p)) for p in os.listdir(root))
        except OSError:
            total = 0
        on_bytes = progress("verify", total)
    report = verify_bundle(root, deep=True, on_bytes=on_bytes)
    if not report.ok:
        raise VerificationFailed(
            f"verifying {root}: expected every file to match bundle.json, found {len(report.problems)} problem(s)",
            report.problems,
            context="\n".join(str(p) for p in report.problems[:50]),
            hint="nothing was loaded; re-copy the bundle from the source medium (or re-export it) and retry",
        )
    return report


def import_bundle(
    root: str,
    sink: Sink,
    *,
    force: bool = False,
    progress: Optional[ProgressFactory] = None,
    result: Optional[ImportResult] = None,
) -> ImportResult:
    """Verify, load, check and tag. ``result`` (if given) is filled in as work proceeds, so a
    caller can still write a receipt when this raises."""
    started = time.monotonic()
    res = result or ImportResult(root=root, bundle_digest="", report=VerifyReport(root=root))
    res.bundle_digest = bundle_digest(root)

    # === verify every byte before touching the engine
    res.report = verify_or_raise(root, progress=progress)
    res.timings["verifySeconds"] = time.monotonic() - started
    manifest = res.report.manifest
    assert manifest is not None

    # === the engine answers; what does it already hold?
    engine = sink.probe()
    res.engine = engine
    to_load: List[ImageRecord] = []
    present: List[ImageCheck] = []
    for image in manifest.images:
        existing = sink.lookup(str(image.config.digest)) if engine.image_store == "classic" else None
        if existing is None and image.refs and engine.image_store != "classic":
            existing = sink.lookup(image.refs[0])
        check = check_image(image, existing, engine.image_store) if existing is not None else None
        if check is not None and check.ok:
            check.status = "already-present"
            present.append(check)
        else:
            to_load.append(image)
        _refuse_tag_conflicts(sink, image, engine, force)

    # === load under staging tags, then read back and compare
    t_load = time.monotonic()
    run_id = uuid.uuid4().hex[:12]
    staged: Dict[int, str] = {}
    loaded_checks: List[ImageCheck] = []
    if to_load:
        staged_images = []
        for n, image in enumerate(to_load):
            if not image.refs:  # untagged in the bundle: loaded untagged, found by config digest
                staged_images.append(image)
                continue
            ref = f"{STAGING_REPO}/{run_id}:{n}"
            staged[n] = ref
            staged_images.append(_with_refs(image, (ref,)))
        on_bytes = progress("load", sum(x.uncompressed_size for x in manifest.unique_layers())) if progress else None
        try:
            sink.load(root, staged_images, on_bytes)
        except BaseException:
            res.leftovers = _cleanup(sink, list(staged.values()), [])
            raise
        res.timings["loadSeconds"] = time.monotonic() - t_load
        t_check = time.monotonic()
        for n, image in enumerate(to_load):
            name = staged.get(n, str(image.config.digest))
            loaded_checks.append(check_image(image, sink.lookup(name), engine.image_store))
        res.timings["postLoadSeconds"] = time.monotonic() - t_check
    res.checks = present + loaded_checks
    bad = [c for c in loaded_checks if not c.ok]
    if bad:
        ids = [c.found.image_id for c in loaded_checks if c.found is not None]
        res.leftovers = _cleanup(sink, list(staged.values()), ids)
        raise PostLoadMismatch(
            "checking what the engine holds after loading: expected every image to match bundle.json, "
            f"found {len(bad)} mismatch(es)",
            context="\n".join(f"{c.image.name}: {c.detail}" for c in bad),
            hint="the images this run loaded were removed; report this with the receipt "
            "(an engine that rewrites images cannot be verified this way)",
        )

    # === tag only now, then drop the staging tags
    for check in res.checks:
        target = check.found.image_id if check.found else str(check.image.config.digest)
        for ref in check.image.refs:
            current = sink.lookup(ref)
            if current is not None and current.image_id == target:
                continue
            sink.tag(target, ref)
            check.tags_applied.append(ref)
    res.leftovers = _cleanup(sink, list(staged.values()), [])
    res.timings["totalSeconds"] = time.monotonic() - started
    return res


def _with_refs(image: ImageRecord, refs: tuple) -> ImageRecord:  # type: ignore[type-arg]
    return ImageRecord(refs, image.manifest, image.config, image.layers, image.platform)


def _refuse_tag_conflicts(sink: Sink, image: ImageRecord, engine: EngineInfo, force: bool) -> None:
    if force or engine.image_store != "classic":
        return
    for ref in image.refs:
        current = sink.lookup(ref)
        if current is not None and current.image_id != str(image.config.digest):
            raise TagConflict(
                f"tagging {ref}: expected it free or on {image.config.digest.short}, "
                f"found it on another image ({current.image_id[:19]})",
                hint="nothing was loaded; re-run with --force to move the tag, or remove it first "
                f"(docker image rm {ref})",
            )


def _cleanup(sink: Sink, staging_refs: List[str], image_ids: List[str]) -> List[str]:
    """Remove staging tags (and images loaded by this run); return what could not be removed."""
    left: List[str] = []
    for ref in staging_refs:
        if sink.lookup(ref) is None:
            continue
        try:
            sink.remove(ref)
        except BundleError:
            left.append(ref)
    for image_id in image_ids:
        if sink.lookup(image_id) is None:
            continue
        try:
            sink.remove(image_id)
        except BundleError:
            left.append(image_id)
    return left
