"""Staging names: what a run loads images under before they are verified
(``sneakernet-staging/<run id>:<n>``; importer/pipeline/staging.py says how they are used and
removed). Only names of exactly this form are ever removed, never a user's tag."""

from __future__ import annotations

import re
import uuid

STAGING_REPO = "sneakernet-staging"
_STAGING_RE = re.compile(r"sneakernet-staging/([0-9a-f]{12}):[0-9]{1,6}")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def staging_ref(run_id: str, n: int) -> str:
    return f"{STAGING_REPO}/{run_id}:{n}"


def is_staging_ref(ref: str) -> bool:
    return _STAGING_RE.fullmatch(ref) is not None


def sibling_staging_ref(ref: str, n: int) -> str:
    """Another staging name of the run that made ``ref`` (a staging name)."""
    found = _STAGING_RE.fullmatch(ref)
    if found is None:
        raise ValueError(f"expected a staging name, found {ref!r}")
    return staging_ref(found.group(1), n)
