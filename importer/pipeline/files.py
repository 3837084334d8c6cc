"""The ``write-files`` step of a plan (``--files-to DIR``, importer/pipeline/plan.py): the files a
bundle carries as OCI artifacts (schema 3.6) written below DIR by importer/transfer/filesout.py,
after every byte was verified: by the route before it (an import, a push), or here for the
``files`` route (``--files-only``, or a bundle of files alone), which needs no engine."""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional

from importer.errors import UsageError
from importer.input.opened import OpenedBundle
from importer.pipeline.importing import ImportResult
from importer.pipeline.plan import IMPORT, REGISTRY, WRITE_FILES, ImportPlan
from importer.streams.progress import close_progress
from importer.transfer.filesout import check_held, write_files
from importer.verify.opened import verify_or_raise

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def files_only(bundle: OpenedBundle, plan: ImportPlan, result: ImportResult, *,
               progress: Optional[ProgressFactory] = None) -> None:
    """The ``files`` route: verify every byte, then write the files."""
    started = time.monotonic()
    result.ran("verify")
    result.report = verify_or_raise(bundle, progress=progress, deep=not plan.shallow)
    result.timings["verify"] = time.monotonic() - started
    write_carried_files(bundle, plan, result, progress=progress)


def write_carried_files(bundle: OpenedBundle, plan: ImportPlan, result: ImportResult, *,
                        progress: Optional[ProgressFactory] = None) -> None:
    """The ``write-files`` step: every artifact's files below ``plan.files_to``; the receipt's ``files``."""
    assert plan.files_to, "the write-files step runs with --files-to"
    result.ran(WRITE_FILES)
    if plan.legacy_major is not None:
        raise UsageError(f"writing the files of {bundle.path} to {plan.files_to}: expected a schema 3.6 bundle, "
                         f"found schema {plan.legacy_major}, which carries no files", hint="drop --files-to")
    artifacts = bundle.manifest().file_artifacts
    section: Dict[str, object] = {"target": os.path.abspath(plan.files_to), "artifacts": [a.ref for a in artifacts],
                                  "files": []}
    result.files = section
    started = time.monotonic()
    on_bytes = progress("files", sum(a.size for a in artifacts)) if progress is not None and artifacts else None
    outcomes = write_files(bundle.open, artifacts, plan.files_to, bundle.digest.hex[:16], force=plan.force,
                           on_bytes=on_bytes)
    close_progress(on_bytes)
    files: List[Dict[str, object]] = [o.to_dict() for o in outcomes]
    section["files"] = files
    result.timings["files"] = time.monotonic() - started


def check_held_files(bundle: OpenedBundle, plan: ImportPlan) -> None:
    """Before anything is loaded, for a bundle carrying a file delta (3.8): every file it leaves out
    is below ``--files-to DIR`` with its bytes, else exit 9; the OCI layout target (which takes the
    artifacts themselves) does not complete one: refused (exit 2)."""
    if plan.legacy_major is not None or plan.mode not in (IMPORT, REGISTRY):
        return
    artifacts = bundle.manifest().file_artifacts
    held = [a for a in artifacts if a.held_files()]
    if held and plan.files_to_engine:
        art = held[0]
        raise UsageError(f"importing the artifact {art.ref} into the OCI layout: expected every file in the bundle, "
                         f"found a file delta leaving out {len(art.held_files())} file(s) "
                         f"({art.held_files()[0].title}, ...)",
                         hint="nothing was written; import it with --files-to DIR (the folder holding the base "
                         "version), or re-export without --have")
    if held and plan.files_to and plan.runs(WRITE_FILES):
        check_held(plan.files_to, artifacts)
