"""Importing a schema 1 or 2 bundle (one docker-archive, importer/verify/legacy.py) into an engine:
the ``legacy-import`` route of a plan (importer/pipeline/plan.py), walked by
importer/pipeline/walk.py ``run_import`` once its schema step found schema 1 or 2.

The same route as a schema-3 import (importer/pipeline/load.py ``load_route``, over
:class:`ArchivePayload`): the engine answers, one import per
engine at a time (its lock), free space (preflight), every byte verified, tag conflicts refused,
the archive's own ``manifest.json`` compared with bundle.json (configs, ``RepoTags``, layers);
then the archive streamed into the engine's docker-archive loader (``docker load`` over the
Engine API or the CLI, ``podman load``, ``ctr images import``) under staging tags, as schema 3
loads (importer/pipeline/staging.py): a rewriting pass copies every member's bytes unchanged but replaces
``RepoTags`` in manifest.json with ``sneakernet-staging/<run>:<n>`` and drops the members that
could name images otherwise (``index.json``, ``oci-layout``, ``repositories``), checking the
archive's digests again before the engine sees manifest.json. Then each image is read back
under its staging tag and compared, only then tagged with the bundle's refs, and the staging
tags are dropped; on any failure what this run loaded is removed.

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

from importer.engines import EngineInfo
from importer.errors import UsageError
from importer.format.identity import CLASSIC, CONTAINERD, DOCKER_ARCHIVE
from importer.format.legacy import LegacyManifest
from importer.format.manifest import ImageRecord
from importer.format.refs import normalize
from importer.format.staging import new_run_id, staging_ref
from importer.input.opened import OpenedBundle
from importer.pipeline.load import ProgressFactory, load_route
from importer.pipeline.plan import ImportPlan
from importer.pipeline.postload import ImageCheck, check_image
from importer.pipeline.preflight import PreflightReport, run_preflight
from importer.pipeline.steps import cleanup, deep_or_raise, find_held
from importer.sinks import Sink, docker_archive_loading
from importer.streams import testhooks
from importer.streams.commands import FedCommand, feed
from importer.verify.legacyarchive import archive_pass, open_archive
from importer.verify.opened import verify_legacy_or_raise


def import_legacy_bundle(bundle: OpenedBundle, sink: Sink, plan: ImportPlan, result: Any, *,
                         signature_line: str, on_notice: Optional[Callable[[str], None]] = None) -> Any:
    """The ``legacy-import`` route of ``plan`` (the schema step set its ``legacy_major``): the one load
    route (importer/pipeline/load.py) over the bundle's docker-archive (see the module doc);
    ``--force``, ``--wait-lock`` and ``--deep`` are the plan's. ``result`` (an importing.ImportResult)
    is filled in as work proceeds, so a receipt can still be written when this raises. ``bundle``: a
    folder, opened once; its bundle.json parsed once (``OpenedBundle.legacy_manifest``)."""
    load_route(ArchivePayload(bundle, plan, signature_line), sink, plan, result, on_notice=on_notice)
    return result


class ArchivePayload:
    """A schema 1/2 bundle's one docker-archive for the load route: verified whole before the engine
    sees any of it, streamed into the engine's docker-archive loader through the rewriting pass
    (staging tags as ``RepoTags``), each image read back by the identity rule of the engine's store."""

    mismatch_hint = "the images this run loaded were removed; nothing was tagged"

    def __init__(self, bundle: OpenedBundle, plan: ImportPlan, signature_line: str) -> None:
        major = plan.legacy_major
        assert major is not None, "the schema step found a schema 1/2 bundle"
        self.bundle, self.major, self.signature_line = bundle, major, signature_line
        self.root = bundle.path
        self.manifest = bundle.legacy_manifest(major)
        self.engine: Optional[EngineInfo] = None
        self.identity = ""
        self.present: Dict[Any, bool] = {}
        self.staged: Dict[int, str] = {}

    def refuse(self, sink: Sink) -> None:
        major, root, kind = self.major, self.root, sink.kind
        if not sink.capabilities.loads_docker_archive:
            raise UsageError(
                f"importing the schema {major} bundle {root} into {kind}: expected an engine that loads a "
                f"docker-archive (docker, podman, containerd), found {kind}",
                hint="nothing was changed; import it into docker, podman or containerd, or re-export the images "
                "with `bundle export --schema 3` (the format for OCI layouts and registries)")
        untagged = [image.name for image in self.manifest.images if not image.refs]
        if untagged and kind == "containerd":
            raise UsageError(
                f"importing the schema {major} bundle {root} into containerd: expected every image named, "
                f"found {len(untagged)} untagged ({', '.join(untagged[:3])})",
                hint="nothing was changed; `ctr images import` drops unnamed images from a docker-archive: "
                "re-export them with a tag, or with --schema 3")

    def probed(self, sink: Sink, engine: EngineInfo, result: Any) -> None:
        self.engine, self.identity = engine, _identity_store(engine)

    def preflight(self, sink: Sink, engine: EngineInfo) -> PreflightReport:
        manifest = self.manifest
        self.present = {image.config.digest: find_held(sink, image, engine, self.identity) is not None
                        for image in manifest.images}
        to_load = [image for image in manifest.images if not self.present[image.config.digest]]
        return run_preflight(manifest, engine, to_load, signature_line=self.signature_line,
                             data_root_bytes=2 * manifest.uncompressed_bytes() if to_load else None)

    def verify(self, sink: Sink, result: Any, progress: Optional[ProgressFactory]) -> None:
        testhooks.reached("verify")
        report = result.report = verify_legacy_or_raise(self.bundle, self.major)
        if report.archive_images:  # the archive's sizes: the containerd store's ID is predictable
            self.manifest = dataclasses.replace(self.manifest, images=report.archive_images)

    def images(self) -> List[ImageRecord]:
        return list(self.manifest.images)

    def store(self) -> str:
        return self.identity

    def to_load(self, sink: Sink, engine: EngineInfo) -> List[ImageRecord]:
        return [image for image in self.manifest.images if not self.present[image.config.digest]]

    def prepare(self, sink: Sink, to_load: List[ImageRecord], result: Any, *, force: bool,
                progress: Optional[ProgressFactory]) -> None:
        return None  # the whole archive was verified; a legacy bundle is never a delta

    def load(self, sink: Sink, engine: EngineInfo, to_load: List[ImageRecord], result: Any,
             progress: Optional[ProgressFactory]) -> List[str]:
        """Every image with a ref under a staging tag (untagged ones are found by config)."""
        manifest, kind = self.manifest, sink.kind
        t_load = time.monotonic()
        if to_load:
            run_id = new_run_id()
            self.staged = {n: staging_ref(run_id, n) for n, image in enumerate(manifest.images) if image.refs}
            result.staging_refs = list(self.staged.values())
            # podman names a docker-archive tag without a registry localhost/...: hand it the full form
            spell = normalize if kind == "podman" else (lambda ref: ref)
            names = [[spell(self.staged[n])] if n in self.staged else None for n in range(len(manifest.images))]
            try:
                _load(docker_archive_loading(sink).archive_command, self.root, manifest, kind, names)
            except BaseException:
                result.leftovers = cleanup(sink, list(self.staged.values()), [])
                raise
            testhooks.reached("loaded")
        result.timings["loadSeconds"] = time.monotonic() - t_load
        return list(self.staged.values())

    def read_back(self, sink: Sink, engine: EngineInfo, result: Any) -> List[ImageCheck]:
        checks: List[ImageCheck] = []
        for n, image in enumerate(self.manifest.images):
            check = check_image(image, sink.lookup(self.staged.get(n) or _lookup_name(image, engine)), self.identity)
            if self.present[image.config.digest]:
                check.status = "already-present"
            checks.append(check)
        return checks

    def deep(self, sink: Sink, checks: List[ImageCheck], staged: List[str], result: Any,
             progress: Optional[ProgressFactory]) -> None:
        _deep_check(sink, self.root, self.manifest, checks, self.staged, result)

    def tagged(self, sink: Sink, result: Any, progress: Optional[ProgressFactory]) -> None:
        return None

    def finish(self, result: Any) -> None:
        return None


def _deep_check(sink: Sink, root: str, manifest: LegacyManifest, checks: List[ImageCheck],
                staged: Dict[int, str], result: Any) -> None:
    """``--deep`` (steps.deep_or_raise). A legacy bundle records no per-layer sizes: the
    uncompressed archive bounds every layer."""
    bound = manifest.uncompressed_bytes()
    originals = [c.image for c in checks]
    for check in checks:
        layers = tuple(dataclasses.replace(x, uncompressed_size=bound) for x in check.image.layers)
        check.image = dataclasses.replace(check.image, layers=layers)
    try:
        deep_or_raise(sink, checks, root, list(staged.values()), result,
                      hint="the engine's stored copy of those layers is damaged: remove the image (and every image "
                      "sharing the layer) from the engine and import again; the images this run loaded were "
                      "removed, nothing was tagged")
    finally:
        for check, image in zip(checks, originals):
            check.image = image


def _identity_store(engine: EngineInfo) -> str:
    """Which identity rule checks a docker-archive load: the classic store's (ID = config digest);
    Docker's containerd store's (it reports no config digest: the diff_ids, and the ID predicted as
    the manifest the load makes); elsewhere (podman, containerd) the config digest the engine
    reports and the diff_ids."""
    if engine.image_store == CLASSIC:
        return CLASSIC
    if engine.kind == "docker" and engine.image_store == CONTAINERD:
        return CONTAINERD
    return DOCKER_ARCHIVE


def _lookup_name(image: ImageRecord, engine: EngineInfo) -> str:
    return str(image.config.digest) if engine.image_store == CLASSIC or not image.refs else image.refs[0]


def _load(new_command: Callable[[str], FedCommand], root: str, manifest: LegacyManifest, kind: str,
          names: List[Optional[List[str]]]) -> None:
    """Stream the archive (decompressed, hashed as it passes) into the engine's loader through
    the rewriting pass (importer/verify/legacy.py ``archive_pass``): every member's bytes unchanged,
    manifest.json last with the staging tags as ``RepoTags``, and only after the archive's
    digests matched; a mismatch aborts the loader before it sees a manifest.json."""
    def write(out: BinaryIO) -> None:
        with open_archive(root, manifest) as reader:
            archive_pass(reader, manifest, out=out, staged=names)

    feed(new_command(f"loading {manifest.archive.path} into {kind}"), write)
