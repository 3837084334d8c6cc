"""The importer copies a user may run: each must be the one the (signed) bundle.json pins.

A bundle folder carries ``bundle-import.pyz`` as one of its files, checked with every other file.
A tar or a set of parts carries it as a member *and* beside the archive (``bundle pack`` and
``bundle export --archive`` write it there, and the docs tell the user to run that copy): that
copy is not part of the archive, so nothing else compares it with the signed member. A swapped
copy next to a correctly signed tar must not pass: :func:`importer_copy_problems` hashes every
copy it can see (beside the tar, beside the parts index, the one the parts index names) and
reports each that is not the pinned file, so that a trusted importer verifying the bundle (and
``copy``, which verifies what it copied) fails loudly before anyone runs it
(docs/security.md, "Which importer to run")."""

from __future__ import annotations

import hashlib
import os
from typing import List, Optional, Sequence

from importer.errors import BundleError, MissingBlob
from importer.format.digest import CHUNK, Digest
from importer.format.manifest import IMPORTER_PYZ, FileRecord
from importer.format.problems import Problem
from importer.input.opened import Bundle
from importer.streams.fsutil import open_regular, read_exactly

PROBLEM_ID = "importer-mismatch"


def pinned_importer(files: Sequence[FileRecord]) -> Optional[FileRecord]:
    """bundle.json's record of ``bundle-import.pyz``, if it lists one."""
    return next((f for f in files if f.path == IMPORTER_PYZ), None)


def importer_copy_problems(bundle: Bundle, pinned: Optional[FileRecord]) -> List[Problem]:
    """One ``importer-mismatch`` problem per importer copy beside the bundle that is not byte for
    byte the pinned ``bundle-import.pyz`` (another size or digest, a link or special file, an
    unreadable file, or no pinned importer to compare it with). Copies that are absent are fine."""
    problems: List[Problem] = []
    label = os.path.basename(bundle.path)
    for path in bundle.importers_beside():
        if not os.path.lexists(path):
            continue
        shown = f"{os.path.basename(path)} beside {label}"
        found = _differs(path, pinned)
        if found is not None:
            pins = f"{pinned.digest}, {pinned.size} bytes" if pinned is not None else "no importer"
            problems.append(Problem(
                PROBLEM_ID, shown,
                f"expected the importer this bundle's bundle.json pins ({pins}), found {found}: do NOT run it; "
                f"delete it and take the importer out of the archive ({_extract_hint(bundle)})"))
    return problems


def _differs(path: str, pinned: Optional[FileRecord]) -> Optional[str]:
    """None when ``path`` is a regular file holding exactly the pinned bytes, else what was found.
    Read without following a link (a FIFO cannot block, a device is never opened) and never past
    the pinned size."""
    if pinned is None:
        return "a copy that nothing pins"
    try:
        with open_regular(path, f"checking the importer copy {path}") as f:
            size = os.fstat(f.fileno()).st_size
            if size != pinned.size:
                return f"a file of {size} bytes"
            h = hashlib.sha256()
            for data in read_exactly(f, size, path, f"checking the importer copy {path}", chunk=CHUNK):
                h.update(data)
    except MissingBlob:
        return None  # removed while we looked: nothing there to run
    except BundleError as e:  # a link, FIFO, device, or unreadable: typed by open_regular/read_exactly
        return f"something that cannot be checked ({e.reference})"
    got = Digest("sha256", h.hexdigest())
    return None if got == pinned.digest else str(got)


def _extract_hint(bundle: Bundle) -> str:
    return f"{bundle.extract_command(IMPORTER_PYZ)}, after checking it as docs/security.md says"
