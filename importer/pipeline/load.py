"""The one load route (issue 41 point 1): every import into an engine or a registry runs these
steps, in this order, over a :class:`Payload`: what the bundle gives the engine and how the sink loads it. A
schema 3 bundle's images stream as the sink loads OCI images (importer/pipeline/importing.py
``BundlePayload``, the ``import`` route); a schema 1/2 bundle's one docker-archive streams into the
engine's docker-archive loader (importer/pipeline/legacy.py ``ArchivePayload``, the
``legacy-import`` route); a schema 3 bundle into a registry is pushed by digest, read back by digest
and only then tagged (importer/pipeline/registry.py ``RegistryPayload``, the ``registry`` route:
what each step means for a registry is said there). The steps are the plan's
(importer/pipeline/plan.py ``ROUTE_STEPS``), each reported as it is entered (``ImportResult.ran``):

``probe`` (the engine answers; what the payload cannot go into is refused before it is asked),
``lock`` (one import per engine at a time, importer/pipeline/steps.py ``engine_run``),
``preflight`` (free space for what the engine does not hold yet), ``verify`` (every byte,
importer/verify/), ``staging-load`` (under this run's staging tags, importer/pipeline/staging.py;
tag conflicts refused and what is already held found before it), ``read-back`` (each image
compared with bundle.json, importer/pipeline/postload.py), ``deep`` (with ``--deep``: every image
exported again and hashed), ``tag`` (the bundle's tags, only now) and ``drop-stale-staging`` (the
staging tags runs killed earlier left, when the lock is let go). On any failure what this run
loaded is removed."""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Protocol

from importer.engines import EngineInfo
from importer.format.manifest import ImageRecord
from importer.pipeline.plan import DEEP, ImportPlan
from importer.pipeline.postload import ImageCheck
from importer.pipeline.preflight import PreflightReport
from importer.pipeline.steps import apply_tags, cleanup, engine_run, refuse_mismatches
from importer.pipeline.tagrule import refuse_tag_conflicts
from importer.sinks import Sink

ProgressFactory = Callable[[str, int], Callable[[int], None]]
Notice = Callable[[str], None]


class LoadResult(Protocol):
    """What the route fills in (importer/pipeline/importing.py ``ImportResult``)."""

    engine: Optional[EngineInfo]
    checks: List[ImageCheck]
    preflight: Optional[PreflightReport]
    leftovers: List[str]
    timings: Dict[str, float]

    def ran(self, step: str) -> None: ...


class Payload(Protocol):
    """What one import gives the engine, and how the sink loads it; the route asks, in its order."""

    root: str  # the bundle's path (the lock names it)
    mismatch_hint: str  # what a post-load mismatch says was done

    def refuse(self, sink: Sink) -> None:
        """What this sink cannot take is refused before the engine is asked anything."""

    def probed(self, sink: Sink, engine: EngineInfo, result: LoadResult) -> None:
        """What the engine's answer decides (the platform, the GPU fit, the identity rule)."""

    def preflight(self, sink: Sink, engine: EngineInfo) -> PreflightReport:
        """Free space for what the engine does not hold yet (nothing read but bundle.json)."""

    def verify(self, sink: Sink, result: LoadResult, progress: Optional[ProgressFactory]) -> None:
        """Every byte (what the sink's load stream checks itself may be left to it); the report in ``result``."""

    def images(self) -> List[ImageRecord]:
        """The images of this import, as verified (the engine's platform)."""

    def store(self) -> str:
        """The identity rule images are compared by (importer/format/identity.py)."""

    def to_load(self, sink: Sink, engine: EngineInfo) -> List[ImageRecord]:
        """The images the engine does not hold exactly yet (those it holds are checked as found)."""

    def prepare(self, sink: Sink, to_load: List[ImageRecord], result: LoadResult, *, force: bool,
                progress: Optional[ProgressFactory]) -> None:
        """What must hold before anything is written (what the load stream will not check, a delta's base)."""

    def load(self, sink: Sink, engine: EngineInfo, to_load: List[ImageRecord], result: LoadResult,
             progress: Optional[ProgressFactory]) -> List[str]:
        """Load ``to_load`` under this run's staging tags (removed again when it fails); those tags."""

    def read_back(self, sink: Sink, engine: EngineInfo, result: LoadResult) -> List[ImageCheck]:
        """Every image of the import as the engine now holds it, compared with bundle.json."""

    def deep(self, sink: Sink, checks: List[ImageCheck], staged: List[str], result: LoadResult,
             progress: Optional[ProgressFactory]) -> None:
        """``--deep``: every image exported again and hashed (what this run loaded removed before it raises)."""

    def tagged(self, sink: Sink, result: LoadResult, progress: Optional[ProgressFactory]) -> None:
        """After the tags: what else the engine takes (a layout's file artifacts)."""

    def finish(self, result: LoadResult) -> None:
        """When the route ends, passed or raised (the signature into the verification report)."""


def load_route(payload: Payload, sink: Sink, plan: ImportPlan, result: LoadResult, *,
               progress: Optional[ProgressFactory] = None, on_notice: Optional[Notice] = None) -> None:
    """Run the load steps of ``plan`` (see the module doc) for ``payload`` into ``sink``; ``--force``,
    ``--wait-lock`` and ``--deep`` are the plan's. ``result`` is filled in as work proceeds, so the
    caller still writes a receipt when this raises."""
    started = time.monotonic()
    res = result
    payload.refuse(sink)
    res.ran("probe")
    engine = sink.probe()
    res.engine = engine
    payload.probed(sink, engine, res)
    with engine_run(sink, engine, payload.root, res, lock_wait=plan.lock_wait, on_notice=on_notice):
        try:
            res.ran("preflight")
            preflight = res.preflight = payload.preflight(sink, engine)
            res.timings["preflightSeconds"] = time.monotonic() - started
            preflight.raise_if_short()

            res.ran("verify")
            t_verify = time.monotonic()
            payload.verify(sink, res, progress)
            res.timings["verifySeconds"] = time.monotonic() - t_verify

            to_load = payload.to_load(sink, engine)
            for image in payload.images():
                refuse_tag_conflicts(sink, image, payload.store(), plan.force)
            payload.prepare(sink, to_load, res, force=plan.force, progress=progress)

            res.ran("staging-load")
            staged = payload.load(sink, engine, to_load, res, progress)
            res.ran("read-back")
            res.checks = payload.read_back(sink, engine, res)
            refuse_mismatches(sink, res.checks, staged, res, hint=payload.mismatch_hint)

            if plan.runs(DEEP):
                res.ran(DEEP)
                t_deep = time.monotonic()
                try:
                    payload.deep(sink, res.checks, staged, res, progress)
                finally:
                    res.timings["deepSeconds"] = time.monotonic() - t_deep

            res.ran("tag")
            apply_tags(sink, res.checks)
            res.leftovers = cleanup(sink, staged, [])
            payload.tagged(sink, res, progress)
        finally:
            payload.finish(res)
    res.timings["totalSeconds"] = time.monotonic() - started
