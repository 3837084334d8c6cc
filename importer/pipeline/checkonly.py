"""``bundle-import BUNDLE --check-only``: prove that an engine already holds the bundle's images,
exactly, without loading, tagging or removing anything.

The nodes of a cluster get their images from a registry (``bundle push``, ``bundle-import serve``),
not from an import; this is the proof afterwards. The ``check-only`` route of a plan
(importer/pipeline/plan.py), walked by importer/pipeline/walk.py ``run_import`` after its front
steps (the bundle opened, the signature and trust policy, the schema): the engine answers, every
byte of the bundle verified (as ``--verify-only``), then for
every image every name it should have in the engine is looked up (the sinks' ``lookup``) and
compared with what bundle.json pins, with the same identity rules as the check after an import
(importer/pipeline/postload.py: image ID, config digest, diff_ids); ``deep``: the images are
exported back out of the engine and every layer hashed again (importer/verify/deep.py). No
lock is taken, no staging tag made, nothing removed: the engine's image list is the same after.

The names looked up (:func:`names_for`):

- without ``name_prefix``: each ref of the image as the bundle gives it (``my/train:1``; the
  engine's own rule makes it ``docker.io/my/train:1`` where it spells names in full);
- with ``name_prefix`` ``HOST[:PORT]/NS``: the name ``bundle push BUNDLE HOST[:PORT]/NS`` gives
  the ref in that registry (importer/registry/client.py ``map_ref``), which is the name a node
  that pulled from there holds: a registry host in the ref is dropped, the rest goes under
  ``HOST[:PORT]/NS/`` (``my/train:1`` -> ``HOST:PORT/NS/my/train:1``,
  ``registry.example/team/app:1.0`` -> ``HOST:PORT/NS/team/app:1.0``, ``app:1`` ->
  ``HOST:PORT/NS/app:1``); a ref without a tag is looked up by the bundle's manifest digest
  (``HOST:PORT/NS/repo@sha256:...``), as the push stores it;
- an image without a ref: by the ID the identity rule predicts (importer/format/identity.py).

A name the engine does not hold: :class:`CheckOnlyMissing`; a name on another image:
:class:`CheckOnlyMismatch` (both exit 8, like a post-load mismatch); a layer whose stored bytes
differ (``deep``): :class:`DeepMismatch`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from importer.errors import CheckOnlyMismatch, CheckOnlyMissing, DeepMismatch, UsageError
from importer.format.identity import lookup_name
from importer.format.manifest import ImageRecord
from importer.input.opened import OpenedBundle
from importer.pipeline.importing import ImportResult
from importer.pipeline.plan import CHECK_ONLY_RECEIPT, DEEP, ImportPlan
from importer.pipeline.postload import ImageCheck, check_image
from importer.pipeline.preflight import select_platform
from importer.registry.client import map_ref, parse_target
from importer.sinks import Sink, reexporting
from importer.verify.deep import run_deep
from importer.verify.opened import verify_or_raise

ProgressFactory = Callable[[str, int], Callable[[int], None]]
KIND = CHECK_ONLY_RECEIPT  # the receipt's kind
STATUS = "checked"  # ImageCheck.status of every image of a check-only receipt


@dataclass
class NameCheck:
    """One name looked up in the engine, and what it named."""

    name: str
    ref: Optional[str]  # the bundle's ref it stands for (None: an untagged image, looked up by ID)
    check: ImageCheck

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "ref": self.ref, "result": self.check.result,
                "imageId": self.check.found.image_id if self.check.found is not None else None,
                "detail": self.check.detail}


@dataclass
class CheckedImage(ImageCheck):
    """The ImageCheck of one bundle image (the first name that failed, else the first name), and
    every name looked up for it (``names`` in the receipt)."""

    names: List[NameCheck] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {**super().to_dict(), "names": [n.to_dict() for n in self.names]}


@dataclass
class CheckOnlyResult(ImportResult):
    name_prefix: Optional[str] = None
    deep_requested: bool = False

    def section(self) -> Dict[str, Any]:
        """The receipt's ``checkOnly`` section."""
        return {"namePrefix": self.name_prefix, "deep": self.deep_requested,
                "names": sum(len(getattr(c, "names", [])) for c in self.checks)}


def receipt_sections(res: ImportResult) -> Dict[str, Any]:
    """What a check-only receipt adds to the import receipt's fields: its kind and section."""
    section = res.section() if isinstance(res, CheckOnlyResult) else {"namePrefix": None, "deep": False, "names": 0}
    return {"kind": KIND, "checkOnly": section}


def refuse_unchecked(plan: ImportPlan, sink: Sink) -> None:
    """A schema 1/2 bundle or a registry cannot be checked; a bad ``--name-prefix`` HOST[:PORT]/NS
    is a usage error before anything is read."""
    if plan.legacy_major is not None or sink.kind == "registry":
        found = f"a schema {plan.legacy_major} bundle" if plan.legacy_major is not None else "--engine registry"
        raise UsageError(
            f"checking what the engine holds (--check-only): expected a schema 3 bundle and an engine "
            f"(docker, containerd, podman, oci), found {found}",
            hint="for a registry, `bundle-import --inventory --registry HOST:PORT/NS` lists what it holds; "
            "nothing was changed")
    if plan.name_prefix:
        parse_target(plan.name_prefix)


def mirror_name(ref: str, prefix: str, image: ImageRecord) -> str:
    """The name ``bundle push BUNDLE PREFIX`` gives ``ref`` (see the module's docstring)."""
    target = parse_target(prefix)
    dest = map_ref(ref, target)
    name = dest.ref(target)
    return name if dest.tag else f"{name}@{image.manifest.digest}"


def names_for(image: ImageRecord, image_store: str, prefix: Optional[str]) -> List[Any]:
    """(name to look up, the bundle ref it stands for) of every name the engine should hold."""
    if not image.refs:
        return [(lookup_name(image_store, image), None)]
    return [(mirror_name(ref, prefix, image) if prefix else ref, ref) for ref in image.refs]


def check_only(bundle: OpenedBundle, sink: Sink, plan: ImportPlan, result: ImportResult, *,
               progress: Optional[ProgressFactory] = None) -> ImportResult:
    """Engine, verify every byte, look up and compare every name (``--deep``: re-export and
    re-hash); ``--name-prefix`` and ``--deep`` are the plan's. ``result`` is filled in as work
    proceeds (the caller writes the receipt when this raises). Changes nothing in the engine."""
    started = time.monotonic()
    root = bundle.path
    res = result
    name_prefix, deep = plan.name_prefix, plan.runs(DEEP)
    if isinstance(res, CheckOnlyResult):
        res.name_prefix, res.deep_requested = name_prefix, deep
    refuse_unchecked(plan, sink)
    bundle.manifest()  # the schema 3 model, the one object the opened bundle parsed (raises for a bad one)
    res.ran("probe")
    engine = sink.probe()
    res.engine = engine
    res.ran("verify")
    res.report = verify_or_raise(bundle, progress=progress, deep=True)
    res.timings["verifySeconds"] = time.monotonic() - started
    manifest = res.report.manifest
    assert manifest is not None
    manifest = select_platform(manifest, engine)  # a multi-platform image: the platform this engine runs

    res.ran("read-back")
    t_check = time.monotonic()
    for image in manifest.images:
        named = [NameCheck(name, ref, check_image(image, sink.lookup(name), engine.image_store))
                 for name, ref in names_for(image, engine.image_store, name_prefix)]
        first = next((n.check for n in named if not n.check.ok), named[0].check)
        res.checks.append(CheckedImage(first.image, first.found, first.identity_rule, first.result, first.detail,
                                       status=STATUS, id_verified=first.id_verified, names=named))
    res.timings["checkSeconds"] = time.monotonic() - t_check

    bad = [n for c in res.checks for n in getattr(c, "names", []) if not n.check.ok]
    if bad:
        differs = [n for n in bad if n.check.result != "missing"]
        error = CheckOnlyMismatch if differs else CheckOnlyMissing
        found = (f"{len(differs)} name(s) on another image" if differs else "") + \
                (", " if differs and len(differs) < len(bad) else "") + \
                (f"{len(bad) - len(differs)} name(s) missing" if len(differs) < len(bad) else "")
        raise error(
            f"checking what {engine.kind} at {engine.address} holds (--check-only): expected every image of "
            f"{root} under its name{' with prefix ' + name_prefix if name_prefix else ''}, found {found}",
            context="\n".join(f"{n.name}: {n.check.detail}" for n in bad),
            hint="nothing was loaded, tagged or removed; import the bundle on this host (bundle-import BUNDLE), "
            "or pull the image again from the registry the nodes use, then check again",
        )

    if deep:
        res.ran(DEEP)
        t_deep = time.monotonic()
        failures = run_deep(reexporting(sink).reexport, res.checks, root, progress)
        res.timings["deepSeconds"] = time.monotonic() - t_deep
        if failures:
            raise DeepMismatch(
                "re-exporting the images from the engine (--check-only --deep): expected every layer to hash "
                f"to its diff_id, found {sum(1 for c in res.checks if c.deep and not c.deep.ok)} image(s) where "
                "one differs",
                context="\n".join(failures),
                hint="the engine's stored copy of those layers is damaged: remove the image (and every image "
                "sharing the layer) from the engine and pull or import it again; nothing was changed by this run",
            )
    res.timings["totalSeconds"] = time.monotonic() - started
    return res
