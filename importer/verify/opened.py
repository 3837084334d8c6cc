"""Verifying an opened bundle: the one entry every command uses (import, --verify-only,
--check-only, serve, push, sign, copy). A folder is checked file by file (in parallel), a tar or
parts in one sequential read, both against the bundle.json the bundle was opened with (the
signature step judged those bytes); a tar's or parts' importer copies are checked too
(importer/verify/importercopies.py)."""

from __future__ import annotations

from typing import Callable, Optional, Set

from importer.errors import BundleError, ManifestError, VerificationFailed
from importer.format.digest import Digest
from importer.format.manifest import BundleManifest
from importer.input.layers import check_layer
from importer.input.opened import Bundle
from importer.streams.progress import close_progress
from importer.verify.archive import verify_archive
from importer.verify.bundle import VerifyReport, verify_bundle
from importer.verify.importercopies import importer_copy_problems, pinned_importer
from importer.verify.legacy import raise_if_problems, verify_legacy

ProgressFn = Callable[[int], None]
ProgressFactory = Callable[[str, int], ProgressFn]


def verify_opened(bundle: Bundle, *, deep: bool = True, defer_layers: bool = False,
                  on_bytes: Optional[ProgressFn] = None) -> VerifyReport:
    """Verify an opened bundle: a folder (in parallel; ``deep``: decompress every layer;
    ``defer_layers``: layer blobs only checked for presence, kind and size, see
    :func:`verify_unstreamed_layers`), a tar or parts (one sequential read, always deep), against
    the bundle.json read when it was opened and the one typed object it was parsed into
    (``Bundle.manifest``): not parsed again here."""
    parsed = _parsed(bundle)
    report = bundle.either(
        lambda folder: verify_bundle(folder, deep=deep, on_bytes=on_bytes, raw_bundle_json=bundle.raw_bundle_json,
                                     manifest=parsed, defer_layers=defer_layers),
        lambda archive: verify_archive(archive, on_bytes=on_bytes, raw_bundle_json=bundle.raw_bundle_json,
                                       manifest=parsed))
    # the importer a user runs beside a tar or parts sits outside it: it must be the pinned member
    if report.manifest is not None:
        report.problems.extend(importer_copy_problems(bundle, pinned_importer(report.manifest.files)))
    return report


def _parsed(bundle: Bundle) -> Optional[BundleManifest]:
    """The opened bundle's typed bundle.json; None when it cannot be used (the verifier then reports
    that its own way, listing what else it found: a failed run, so the second parse costs nothing)."""
    try:
        return bundle.manifest()
    except ManifestError:
        return None


def verify_or_raise(bundle: Bundle, *, progress: Optional[ProgressFactory] = None,
                    deep: bool = True, defer_layers: bool = False) -> VerifyReport:
    """Verify the opened bundle against the bundle.json it was opened with (the signature step
    judged those bytes); raise VerificationFailed listing every problem. ``defer_layers`` (a
    folder; ignored for a tar or parts, always read whole): the layer blobs' bytes are left to the
    load stream and :func:`verify_unstreamed_layers`."""
    defer_layers = defer_layers and not bundle.checked_whole
    on_bytes = progress("verify", _verify_total(bundle, deep, defer_layers)) if progress is not None else None
    report = verify_opened(bundle, deep=deep, defer_layers=defer_layers, on_bytes=on_bytes)
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


def _verify_total(bundle: Bundle, deep: bool, defer_layers: bool = False) -> int:
    """Bytes verification reads: the whole tar or parts, or every file bundle.json lists (but the
    layer blobs, with ``defer_layers``)."""
    if bundle.checked_whole:
        return bundle.stored_size
    try:
        manifest = bundle.manifest()
    except BundleError:
        return 0  # verification raises the same error, with its message
    deferred = manifest.stored_layer_paths() if defer_layers else set()
    return sum(f.size for f in manifest.files if f.path not in deferred)


def verify_legacy_or_raise(bundle: Bundle, major: int) -> VerifyReport:
    """A schema 1/2 bundle (a folder, ``major``): its docker-archive and files against the
    bundle.json it was opened with (``Bundle.legacy_manifest``); raise VerificationFailed
    listing every problem."""
    report = verify_legacy(bundle.path, bundle.legacy_manifest(major), bundle.raw_bundle_json)
    raise_if_problems(bundle.path, report)
    return report


def verify_unstreamed_layers(bundle: Bundle, report: VerifyReport, streamed: Set[Digest]) -> None:
    """The rest of a verification that deferred the layer blobs (``verify_or_raise(defer_layers=True)``)
    to a load stream that checks each blob it sends (its digest, size and diff_id, the member's last
    chunk held back until they matched: importer/sinks/ociarchive.py, dockerarchive.py): every
    stored layer of the bundle, every platform, that the stream will not send (``streamed``: the
    blob digests it will) is read and checked here, before anything is loaded; ``report`` counts
    both kinds. A folder only (a tar or parts is always verified whole)."""
    manifest = report.manifest
    assert manifest is not None, "a verified report carries its bundle.json"
    names = {x.digest: f"layer {i + 1}/{len(image.layers)} of {image.name}"
             for image in reversed(manifest.images) for i, x in enumerate(image.layers)}
    for layer in manifest.stored_layers():
        if layer.digest in streamed:
            report.layers_checked_while_loading += 1
            report.bytes_checked_while_loading += layer.size
            continue
        check_layer(bundle, layer, names.get(layer.digest, str(layer.digest)))
        report.files_checked += 1
        report.layers_checked += 1
        report.bytes_checked += layer.size
