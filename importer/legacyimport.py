"""Importing a schema 1 or 2 bundle (one docker-archive, importer/legacy.py) into an engine.

The same order as a schema-3 import (importer/importing.py): the engine answers, one import per
engine at a time (its lock), free space (preflight), every byte verified, tag conflicts refused,
then the archive streamed into the engine's docker-archive loader (``docker load`` over the
Engine API or the CLI, ``podman load``, ``ctr images import``) and checked again as it passes,
then read back and compared.

Identity: no manifest is pinned by a legacy bundle, so on Docker's classic store and podman the
image ID must be the config digest; elsewhere (containerd, Docker's containerd store) the engine's
config digest and diff_ids must be the bundle's, and where the engine lists layer blobs (an
archive load stores them uncompressed) each blob's digest must be its diff_id. Engines without a
docker-archive loader (an OCI layout, a registry) are refused before anything is read: schema 3
is the format for those.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, BinaryIO, Callable, Dict, List, Optional

from importer.deepcheck import run_deep
from importer.enginelock import engine_lock
from importer.engines import feed
from importer.errors import DeepMismatch, PostLoadMismatch, UsageError
from importer.identity import CLASSIC, DOCKER_ARCHIVE
from importer.legacy import LegacyManifest, load_legacy_manifest, open_archive, raise_if_problems, verify_legacy
from importer.manifest import ImageRecord
from importer.postload import ImageCheck, check_image
from importer.preflight import run_preflight
from importer.refs import has_domain, split_ref
from importer.sinks import EngineInfo, Sink

CHUNK = 1 << 20


def import_legacy_bundle(root: str, sink: Sink, *, force: bool, result: Any, raw_bundle_json: bytes, major: int,
                         lock_wait: float = 0.0, on_notice: Optional[Callable[[str], None]] = None,
                         signature_line: str = "signature: none (schema 1 and 2 bundles carry none)",
                         deep: bool = False) -> Any:
    """Probe, lock, preflight, verify, load, check, tag (see the module doc). ``result`` (an
    importing.ImportResult) is filled in as work proceeds, so a receipt can still be written
    when this raises."""
    from importer.importing import TagConflict

    started = time.monotonic()
    manifest = load_legacy_manifest(raw_bundle_json, major)
    kind = str(getattr(sink, "kind", "this engine"))
    new_command = getattr(sink, "archive_command", None)
    if new_command is None:
        raise UsageError(
            f"importing the schema {major} bundle {root} into {kind}: expected an engine that loads a "
            f"docker-archive (docker, podman, containerd), found {kind}",
            hint="nothing was changed; import it into docker, podman or containerd, or re-export the images "
            "with `bundle export --schema 3` (the format for OCI layouts and registries)")
    untagged = [image.name for image in manifest.images if not image.refs]
    if untagged and kind == "containerd":
        raise UsageError(
            f"importing the schema {major} bundle {root} into containerd: expected every image named, "
            f"found {len(untagged)} untagged ({', '.join(untagged[:3])})",
            hint="nothing was changed; `ctr images import` drops unnamed images from a docker-archive: "
            "re-export them with a tag, or with --schema 3")
    engine = sink.probe()
    result.engine = engine
    store = CLASSIC if engine.image_store == CLASSIC else DOCKER_ARCHIVE
    with engine_lock(engine.address, bundle=root, wait=lock_wait, on_wait=on_notice) as lock_file:
        result.lock_file = lock_file
        present = {image.config.digest: _held(sink, image, engine, store) for image in manifest.images}
        to_load = [image for image in manifest.images if not present[image.config.digest]]
        preflight = run_preflight(manifest, engine, to_load, signature_line=signature_line,
                                  data_root_bytes=2 * manifest.uncompressed_bytes() if to_load else None)
        result.preflight = preflight.to_dict()
        result.timings["preflightSeconds"] = time.monotonic() - started
        preflight.raise_if_short()

        report = verify_legacy(root, manifest, raw_bundle_json)
        result.report = report
        raise_if_problems(root, report)
        result.timings["verifySeconds"] = time.monotonic() - started
        for image in manifest.images:
            _refuse_tag_conflicts(sink, image, force, TagConflict)

        t_load = time.monotonic()
        names_before = {name: sink.lookup(name) is not None for name in _engine_spellings(sink, manifest)}
        if to_load:
            _load(new_command, root, manifest, kind)
        result.timings["loadSeconds"] = time.monotonic() - t_load

        checks: List[ImageCheck] = []
        for image in manifest.images:
            check = check_image(image, sink.lookup(_lookup_name(image, engine)), store)
            if present[image.config.digest]:
                check.status = "already-present"
            checks.append(check)
        result.checks = checks
        bad = [c for c in checks if not c.ok]
        if bad:
            result.leftovers = _remove_loaded(sink, checks, present)
            raise PostLoadMismatch(
                "checking what the engine holds after loading: expected every image to match bundle.json, "
                f"found {len(bad)} mismatch(es)",
                context="\n".join(f"{c.image.name}: {c.detail}" for c in bad),
                hint="the images this run loaded were removed",
            )
        if deep:
            t_deep = time.monotonic()
            _deep_check(sink, root, manifest, checks, present, result)
            result.timings["deepSeconds"] = time.monotonic() - t_deep
        _apply_tags(sink, checks, names_before)
    result.timings["totalSeconds"] = time.monotonic() - started
    return result


def _deep_check(sink: Sink, root: str, manifest: LegacyManifest, checks: List[ImageCheck],
                present: Dict[Any, bool], result: Any) -> None:
    """``--deep``: export every image back out of the engine and hash each layer again (as for
    schema 3, importer/deepcheck.py); on a mismatch remove what this run loaded. A legacy bundle
    records no per-layer sizes: the uncompressed archive bounds every layer."""
    bound = manifest.uncompressed_bytes()
    originals = [c.image for c in checks]
    for check in checks:
        layers = tuple(dataclasses.replace(x, uncompressed_size=bound) for x in check.image.layers)
        check.image = dataclasses.replace(check.image, layers=layers)
    try:
        failures = run_deep(sink, checks, root)
    finally:
        for check, image in zip(checks, originals):
            check.image = image
    if failures:
        result.leftovers = _remove_loaded(sink, checks, present)
        raise DeepMismatch(
            "re-exporting the images from the engine (--deep): expected every layer to hash to its diff_id, "
            f"found {sum(1 for c in checks if c.deep and not c.deep.ok)} image(s) where one differs",
            context="\n".join(failures),
            hint="the engine's stored copy of those layers is damaged: remove the image (and every image sharing "
            "the layer) from the engine and import again; the images this run loaded were removed",
        )


def _remove_loaded(sink: Sink, checks: List[ImageCheck], present: Dict[Any, bool]) -> List[str]:
    """Remove the images this run loaded (not those already present); what could not be removed."""
    from importer.importing import _cleanup

    loaded = [c.found.image_id for c in checks if c.found is not None and not present[c.image.config.digest]]
    return _cleanup(sink, [], loaded)


def _lookup_name(image: ImageRecord, engine: EngineInfo) -> str:
    return str(image.config.digest) if engine.image_store == CLASSIC or not image.refs else image.refs[0]


def _held(sink: Sink, image: ImageRecord, engine: EngineInfo, store: str) -> bool:
    """The engine already holds ``image`` in verified form."""
    found = sink.lookup(_lookup_name(image, engine))
    return found is not None and check_image(image, found, store).ok


def _refuse_tag_conflicts(sink: Sink, image: ImageRecord, force: bool, conflict: Any) -> None:
    """A tag of the bundle on another image (another config) is not moved without --force."""
    if force:
        return
    for ref in image.refs:
        current = sink.lookup(ref)
        if current is None:
            continue
        config = current.config_digest or current.image_id
        if config != str(image.config.digest):
            raise conflict(
                f"tagging {ref}: expected it free or on config {image.config.digest.short}, "
                f"found it on another image ({current.image_id[:19]})",
                hint=f"nothing was loaded; re-run with --force to move the tag, or remove it first ({ref})",
            )


def _load(new_command: Callable[[str], Any], root: str, manifest: LegacyManifest, kind: str) -> None:
    """Stream the archive (decompressed, hashed as it passes) into the engine's loader; a digest
    or size mismatch aborts the loader before it sees the end of the archive."""
    def write(out: BinaryIO) -> None:
        with open_archive(root, manifest) as reader:
            while True:
                chunk = reader.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
            reader.finish()

    feed(new_command(f"loading {manifest.archive.path} into {kind}"), write)


def _podman_spelling(ref: str) -> Optional[str]:
    """The name ``podman load`` gives a docker-archive tag without a registry (``localhost/...``)."""
    return None if has_domain(split_ref(ref)[0]) else "localhost/" + ref


def _engine_spellings(sink: Sink, manifest: LegacyManifest) -> List[str]:
    if getattr(sink, "kind", "") != "podman":
        return []
    names = (_podman_spelling(ref) for image in manifest.images for ref in image.refs)
    return [n for n in names if n]


def _apply_tags(sink: Sink, checks: List[ImageCheck], names_before: Dict[str, bool]) -> None:
    """Every ref of the bundle names its image (it may have been present untagged, or loaded by
    podman as ``localhost/REF``: renamed to the full form the schema-3 import uses)."""
    for check in checks:
        assert check.found is not None
        for ref in check.image.refs:
            current = sink.lookup(ref)
            if current is None or current.image_id != check.found.image_id:
                sink.tag(check.found.image_id, ref)
                check.tags_applied.append(ref)
        untag = getattr(sink, "untag", None)
        for ref in check.image.refs:
            spelled = _podman_spelling(ref) if untag is not None else None
            if spelled and not names_before.get(spelled, True):
                untag(check.found.image_id, spelled)  # type: ignore[misc]
