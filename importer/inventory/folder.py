"""``bundle-import --inventory --files-to DIR [BUNDLE]``: the files a folder holds, by digest
(inventory 1.5), the input of a file delta (``bundle export --files ... --have``, docs/files.md).

Hashing a folder of weights costs a read of every byte, so what is read is bounded and explicit:
with a BUNDLE, only the paths its artifacts' titles name (the files a delta of that model could
leave out); without one, every regular file below DIR, at most :data:`MAX_LISTED` of them. Nothing
is followed: a link (as a file or among the folders), a device, a FIFO or a socket is skipped and
counted (``skipped``), never read; the importer's staging folders are not listed. Each file is
listed with its ``title`` (its path below DIR), ``size`` and ``digest`` (what ``sha256sum`` prints).
The document is an inventory like an engine's (its ``checksum`` covers it) with ``engine.kind``
``folder`` and no images, so ``bundle export --have`` reads it the same way: a file of the bundle
is left out when the folder holds that digest at that title."""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any, Dict, List, Optional, Sequence, Tuple

from importer.errors import BundleError, UsageError
from importer.format.digest import CHUNK
from importer.format.fileartifacts import STAGING_PREFIX, title_issue
from importer.inventory.engine import checksum, inventory_head
from importer.streams.fsutil import open_regular

#: without a BUNDLE: at most this many files are read (a folder of more is refused: name the bundle)
MAX_LISTED = 100_000
FOLDER_KIND = "folder"


def _walk(target: str) -> Tuple[List[str], int]:
    """The titles of every regular file below ``target`` (links never followed, staging folders
    left out) and how many other entries (links, devices, FIFOs, sockets) were skipped."""
    titles: List[str] = []
    skipped = 0
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(os.path.join(target, rel) if rel else target) as entries:
            for entry in entries:
                title = f"{rel}/{entry.name}" if rel else entry.name
                if not rel and entry.name.startswith(STAGING_PREFIX):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    pending.append(title)
                elif entry.is_file(follow_symlinks=False) and title_issue(title) is None:
                    titles.append(title)
                    if len(titles) > MAX_LISTED:
                        raise UsageError(
                            f"taking the inventory of {target}: expected at most {MAX_LISTED} files, found more",
                            hint="name the bundle whose files to look for (bundle-import BUNDLE --inventory "
                            "--files-to DIR): only its titles are read")
                else:
                    skipped += 1
    return sorted(titles), skipped


def _entry(target: str, title: str) -> Optional[Dict[str, Any]]:
    """``title``'s size and digest, read through no link; None when it is not a regular file there."""
    path = os.path.join(target, title)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        with open_regular(path, f"taking the inventory of {target}", root=target) as f:
            hasher, size = hashlib.sha256(), 0
            for chunk in iter(lambda: f.read(CHUNK), b""):
                hasher.update(chunk)
                size += len(chunk)
    except BundleError:  # a link among the folders, changed meanwhile: not held
        return None
    return {"title": title, "size": size, "digest": "sha256:" + hasher.hexdigest()}


def folder_files(target: str, titles: Optional[Sequence[str]] = None) -> Tuple[List[Dict[str, Any]], int]:
    """(every file ``target`` holds among ``titles``, or below it when None, each title, size and
    digest; how many entries were skipped: not regular files, or missing when titles are given)."""
    skipped = 0
    if titles is None:
        titles, skipped = _walk(target)
    files = []
    for title in titles:
        found = _entry(target, title)
        if found is None:
            skipped += 1
        else:
            files.append(found)
    return files, skipped


def take_folder_inventory(target: str, titles: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The inventory (1.5) of the files below ``target`` (only ``titles`` when given)."""
    target = os.path.abspath(target)
    if not os.path.isdir(target):
        raise UsageError(f"taking the inventory of --files-to {target}: expected a folder, found "
                         f"{'nothing' if not os.path.lexists(target) else 'something else'}",
                         hint="name the folder the files were written to (bundle-import BUNDLE --files-to DIR)")
    files, skipped = folder_files(target, titles)
    doc: Dict[str, Any] = {
        **inventory_head(),
        "engine": {"kind": FOLDER_KIND, "version": "", "storageDriver": "", "imageStore": FOLDER_KIND,
                   "address": target, "dataRoot": target,
                   "selectedBy": "--files-to with a bundle: its titles only" if titles is not None
                   else "--files-to: every regular file below it"},
        "images": [],
        "files": files,
        "skipped": skipped,
    }
    doc["checksum"] = checksum(doc)
    return doc
