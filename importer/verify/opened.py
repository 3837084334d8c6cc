"""Verifying an opened bundle: the one entry every command uses (import, --verify-only,
--check-only, serve, push, sign, copy). A folder is checked file by file (in parallel), a tar or
parts in one sequential read, both against the bundle.json the bundle was opened with (the
signature step judged those bytes); a tar's or parts' importer copies are checked too
(importer/verify/importercopies.py)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from importer.errors import BundleError, ManifestError, VerificationFailed
from importer.format.manifest import BundleManifest, ImageRecord
from importer.input.layers import check_layer
from importer.input.opened import OpenedBundle
from importer.streams.progress import close_progress
from importer.verify.archive import verify_archive
from importer.verify.bundle import VerifyReport, verify_bundle
from importer.verify.importercopies import importer_copy_problems, pinned_importer
from importer.verify.legacy import raise_if_problems, verify_legacy

ProgressFn = Callable[[int], None]
ProgressFactory = Callable[[str, int], ProgressFn]


def verify_opened(bundle: OpenedBundle, *, deep: bool = True,
                  on_bytes: Optional[ProgressFn] = None) -> VerifyReport:
    """Verify an opened bundle: a folder (in parallel; ``deep``: decompress every layer), a tar or
    parts (one sequential read, always deep), against the bundle.json read when it was opened and
    the one typed object it was parsed into (``OpenedBundle.manifest``): not parsed again here."""
    parsed = _parsed(bundle)
    if bundle.archive is None:
        report = verify_bundle(bundle.path, deep=deep, on_bytes=on_bytes, raw_bundle_json=bundle.raw_bundle_json,
                               manifest=parsed)
        return report
    report = verify_archive(bundle.archive, on_bytes=on_bytes, raw_bundle_json=bundle.raw_bundle_json,
                            manifest=parsed)
    # the importer a user runs sits beside the archive, outside it: it must be the pinned member
    if report.manifest is not None:
        report.problems.extend(importer_copy_problems(bundle, pinned_importer(report.manifest.files)))
    return report


def _parsed(bundle: OpenedBundle) -> Optional[BundleManifest]:
    """The opened bundle's typed bundle.json; None when it cannot be used (the verifier then reports
    that its own way, listing what else it found: a failed run, so the second parse costs nothing)."""
    try:
        return bundle.manifest()
    except ManifestError:
        return None


def verify_or_raise(bundle: OpenedBundle, *, progress: Optional[ProgressFactory] = None,
                    deep: bool = True) -> VerifyReport:
    """Verify the opened bundle against the bundle.json it was opened with (the signature step
    judged those bytes); raise VerificationFailed listing every problem."""
    on_bytes = progress("verify", _verify_total(bundle, deep)) if progress is not None else None
    report = verify_opened(bundle, deep=deep, on_bytes=on_bytes)
    close_progress(on_bytes)
    if not report.ok:
        raise VerificationFailed(
            f"verifying {bundle.path}: expected every file to match bundle.json, "
            f"found {len(report.problems)} problem(s)",
            report.problems,
            context="\n".join(str(p) for p in report.problems[:50]),
            hint="nothing was loaded; re-copy the bundle from the source medium (or re-export it) and retry",
        )
    return report


def _verify_total(bundle: OpenedBundle, deep: bool) -> int:
    """Bytes verification reads: the whole tar or parts, or every file bundle.json lists."""
    if bundle.archive is not None:
        return bundle.archive.size
    try:
        manifest = bundle.manifest()
    except BundleError:
        return 0  # verification raises the same error, with its message
    return sum(f.size for f in manifest.files)


def verify_legacy_or_raise(bundle: OpenedBundle, major: int) -> VerifyReport:
    """A schema 1/2 bundle (a folder, ``major``): its docker-archive and files against the
    bundle.json it was opened with (``OpenedBundle.legacy_manifest``); raise VerificationFailed
    listing every problem."""
    report = verify_legacy(bundle.path, bundle.legacy_manifest(major), bundle.raw_bundle_json)
    raise_if_problems(bundle.path, report)
    return report


def verify_unstreamed_layers(bundle: OpenedBundle, manifest: BundleManifest, to_load: Sequence[ImageRecord]) -> None:
    """The rest of a verification split with the load (``verify_or_raise(deep=False)`` for a sink
    whose load stream checks each layer's diff_id): the layers that will not pass through that
    stream (their images are already held) get their diff_id checked here, before anything is
    loaded. A folder only (a tar or parts is always verified whole)."""
    streamed = {x.digest for image in to_load for x in image.layers}
    for image in manifest.images:
        for i, layer in enumerate(image.layers):
            if layer.external or layer.digest in streamed:
                continue
            check_layer(bundle.path, layer, f"layer {i + 1}/{len(image.layers)} of {image.name}")
            streamed.add(layer.digest)
