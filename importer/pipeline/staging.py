"""Staging tags: the names a run loads images under before they are verified.

A run loads each image as ``sneakernet-staging/<run id>:<n>`` and applies the user's tags only
after the engine's copy matched bundle.json. A run killed hard (SIGKILL, power loss) can leave
staging tags behind; the next successful import into that engine removes them, holding the
engine lock, so no other import is running. Only names of exactly this form are ever removed,
never a user's tag (the names: importer/format/staging.py)."""

from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

from importer.errors import BundleError
from importer.format.staging import STAGING_REPO, is_staging_ref
from importer.sinks import Sink, tag_listing


def find_stale(sink: Sink, exclude: Iterable[str] = ()) -> List[str]:
    """Staging tags in the engine not made by this run (empty when the sink cannot list tags)."""
    if not sink.capabilities.lists_tags:
        return []
    mine = set(exclude)
    found = tag_listing(sink).list_tags(f"{STAGING_REPO}/*")
    return sorted(ref for ref in found if is_staging_ref(ref) and ref not in mine)


def remove_refs(sink: Sink, refs: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Remove staging tags; returns (removed, left). Refuses anything but a staging tag."""
    removed: List[str] = []
    left: List[str] = []
    for ref in refs:
        if not is_staging_ref(ref):
            raise ValueError(f"refusing to remove {ref!r}: not a staging tag")
        try:
            if sink.lookup(ref) is None:
                continue
            sink.remove(ref)
            removed.append(ref)
        except BundleError:
            left.append(ref)
    return removed, left
