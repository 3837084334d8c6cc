"""The steps every import shares, written once and run by the one load route
(importer/pipeline/load.py): schema 3 (importer/pipeline/importing.py) and schemas 1/2
(importer/pipeline/legacy.py) differ only in their payload (how the bytes reach the engine); the preflight and
``--check-only`` ask the same "already here?" question.

- :func:`engine_run`: one import per engine at a time (its lock); a run that fails or is stopped
  drops its own staging tags; a run that ends drops those that runs killed earlier left.
- :func:`find_held`: does the engine already hold this image, exactly (the one answer)?
- :func:`refuse_mismatches` and :func:`deep_or_raise`: the post-load check and ``--deep``, each
  removing what this run loaded before it raises.
- :func:`apply_tags` and :func:`cleanup`: the bundle's tags, only once everything matched;
  staging tags and loaded images removed (what could not be is reported)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, List, Optional, Sequence

from importer.engines import EngineInfo
from importer.errors import BundleError, DeepMismatch, PostLoadMismatch
from importer.format.identity import CLASSIC, CONTAINERD, expected_image_id, lookup_name
from importer.format.manifest import ImageRecord
from importer.pipeline.lock import engine_lock
from importer.pipeline.postload import ImageCheck, check_image
from importer.pipeline.staging import find_stale, remove_refs
from importer.sinks import Sink, reexporting
from importer.streams import testhooks
from importer.verify.deep import run_deep


@contextlib.contextmanager
def engine_run(sink: Sink, engine: EngineInfo, root: str, result: Any, *, lock_wait: float = 0.0,
               on_notice: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Hold the engine's lock for the block. On any exit by an exception (SIGINT/SIGTERM
    included) this run's staging tags are dropped; on a normal exit, staging tags that runs killed
    earlier left (their images may just have served as "already present", so only now; the lock
    guarantees no other import is running)."""
    result.ran("lock")
    with engine_lock(engine.address, bundle=root, wait=lock_wait, on_wait=on_notice) as lock_file:
        result.lock_file = lock_file
        try:
            yield
        except BaseException:
            _, left = remove_refs(sink, result.staging_refs)
            result.leftovers = sorted(set(result.leftovers) | set(left))
            raise
        result.ran("drop-stale-staging")
        result.stale_removed, left = remove_refs(sink, find_stale(sink, exclude=result.staging_refs))
        result.leftovers += left


def held_names(image: ImageRecord, engine: EngineInfo) -> List[str]:
    """Where the engine would hold ``image`` already, in the order the stores can prove it: the
    config digest (the classic store's ID), the ID the identity rule predicts (Docker's containerd
    store: an image loaded by a run stopped before tagging), then its first ref; an untagged image
    by its predicted ID."""
    store = engine.image_store
    names: List[str] = []
    if store == CLASSIC:
        names.append(str(image.config.digest))
    predicted = expected_image_id(CONTAINERD, image) if store == CONTAINERD else None
    if predicted:
        names.append(predicted)
    if store != CLASSIC:
        names.append(image.refs[0] if image.refs else lookup_name(store, image))
    return names


def find_held(sink: Sink, image: ImageRecord, engine: EngineInfo, store: Optional[str] = None) -> Optional[ImageCheck]:
    """The check of ``image`` as the engine already holds it, when it holds it exactly (by the
    identity rule of ``store``, default the engine's image store); None: it must be loaded."""
    for name in held_names(image, engine):
        found = sink.lookup(name)
        if found is None:
            continue
        check = check_image(image, found, store or engine.image_store)
        if not check.ok:
            return None
        check.status = "already-present"
        return check
    return None


def loaded_ids(checks: Sequence[ImageCheck]) -> List[str]:
    """The image IDs this run loaded (not those already present)."""
    return [c.found.image_id for c in checks if c.found is not None and c.status != "already-present"]


def refuse_mismatches(sink: Sink, checks: Sequence[ImageCheck], staged: Sequence[str], result: Any,
                      *, hint: str) -> None:
    """After the load: every image read back must match bundle.json; else what this run loaded
    is removed and PostLoadMismatch (exit 8) raised."""
    bad = [c for c in checks if not c.ok]
    if not bad:
        return
    result.leftovers = cleanup(sink, staged, loaded_ids(checks))
    raise PostLoadMismatch(
        "checking what the engine holds after loading: expected every image to match bundle.json, "
        f"found {len(bad)} mismatch(es)",
        context="\n".join(f"{c.image.name}: {c.detail}" for c in bad),
        hint=hint,
    )


def deep_or_raise(sink: Sink, checks: Sequence[ImageCheck], root: str, staged: Sequence[str], result: Any, *,
                  progress: Optional[Callable[[str, int], Callable[[int], None]]] = None,
                  hint: str) -> None:
    """``--deep``: export every image back out of the engine and hash its layers again; on a
    mismatch remove what this run loaded and raise DeepMismatch."""
    failures = run_deep(reexporting(sink).reexport, checks, root, progress)
    if not failures:
        return
    result.leftovers = cleanup(sink, staged, loaded_ids(checks))
    raise DeepMismatch(
        "re-exporting the images from the engine (--deep): expected every layer to hash to its diff_id, "
        f"found {sum(1 for c in checks if c.deep and not c.deep.ok)} image(s) where one differs",
        context="\n".join(failures),
        hint=hint,
    )


def apply_tags(sink: Sink, checks: Sequence[ImageCheck]) -> None:
    """Every ref of the bundle names its image, now that it matched bundle.json (it may also have
    been present untagged); a ref already on it is left alone."""
    for check in checks:
        target = check.found.image_id if check.found else str(check.image.config.digest)
        for ref in check.image.refs:
            current = sink.lookup(ref)
            if current is not None and current.image_id == target:
                continue
            sink.tag(target, ref)
            check.tags_applied.append(ref)
            testhooks.reached("tagged")


def cleanup(sink: Sink, staging_refs: Sequence[str], image_ids: Sequence[str]) -> List[str]:
    """Remove staging tags (and images loaded by this run); return what could not be removed."""
    left: List[str] = []
    for name in [*staging_refs, *image_ids]:
        if sink.lookup(name) is None:
            continue
        try:
            sink.remove(name)
        except BundleError:
            left.append(name)
    return left
