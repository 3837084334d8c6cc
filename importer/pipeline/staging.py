"""Staging tags: the names a run loads images under before they are verified.

A run loads each image as ``sneakernet-staging/<run id>:<n>`` and applies the user's tags only
after the engine's copy matched bundle.json. A run killed hard (SIGKILL, power loss) can leave
staging tags behind; the next successful import into that engine removes them, holding the
engine lock, so no other import is running. Only names of exactly this form are ever removed,
never a user's tag."""

from __future__ import annotations

import re
import uuid
from typing import Iterable, List, Sequence, Tuple

from importer.errors import BundleError
from importer.sinks import Sink, tag_listing

STAGING_REPO = "sneakernet-staging"
_STAGING_RE = re.compile(r"sneakernet-staging/[0-9a-f]{12}:[0-9]{1,6}")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def staging_ref(run_id: str, n: int) -> str:
    return f"{STAGING_REPO}/{run_id}:{n}"


def is_staging_ref(ref: str) -> bool:
    return _STAGING_RE.fullmatch(ref) is not None


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
