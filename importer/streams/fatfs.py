"""FAT targets: FAT32 holds no file of 4 GiB or more (the largest is 4 GiB - 1 byte).

:func:`fs_type` names the file system that holds a path (Linux: the longest mount point in
``/proc/self/mountinfo`` that holds the path's nearest existing folder, resolved; None where that
cannot be read, e.g. macOS, and then nothing is refused or changed). Used before any byte is
written by ``bundle pack`` / ``bundle export --archive`` (no ``--split``, or one of 4 GiB or more,
onto FAT: split at :data:`AUTO_SPLIT` and say so), ``bundle export -o DIR`` (a blob of 4 GiB or
more onto FAT: :class:`FileTooBigForFat`, the staging folder removed) and ``bundle copy`` /
``bundle-import copy`` (the largest file checked before the first copy).

Test hook: ``SNEAKERNET_TEST_FAT_LIMIT=<bytes>`` lowers :func:`file_limit` (the smallest file size
FAT refuses) so a test can use a small loop-mounted vfat image instead of a 4 GiB file; the
automatic split then becomes that limit minus one byte. ``SNEAKERNET_TEST_MOUNTINFO=<file>`` reads
that file instead of ``/proc/self/mountinfo`` (a kernel without vfat, e.g. in a container, cannot
mount a real one: the tests then declare a folder vfat). Never set either outside tests."""

from __future__ import annotations

import os
import re
from typing import Optional, Tuple

from importer.errors import UsageError

TEST_LIMIT_ENV = "SNEAKERNET_TEST_FAT_LIMIT"
FAT_LIMIT = 4 * 1024**3  # the smallest file FAT32 cannot hold
AUTO_SPLIT = 4000 * 1024**2  # parts written onto FAT when no (usable) --split was given
FAT_TYPES = frozenset({"vfat", "msdos", "fat", "umsdos"})
MOUNTINFO = "/proc/self/mountinfo"
TEST_MOUNTINFO_ENV = "SNEAKERNET_TEST_MOUNTINFO"
FIX = ("write parts instead (`bundle export --archive FILE.tar --split 3900M`, or `bundle pack DIR FILE.tar "
       "--split 3900M`), or format the drive as exFAT or ext4")


class FileTooBigForFat(UsageError):
    """A file of 4 GiB or more was about to be written onto a FAT file system (which cannot hold
    it): refused before it is written, nothing left behind."""

    reference = "fat-file-too-big"


def file_limit() -> int:
    raw = os.environ.get(TEST_LIMIT_ENV, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else FAT_LIMIT


def auto_split() -> int:
    return min(AUTO_SPLIT, file_limit() - 1)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def fs_type(path: str) -> Optional[str]:
    """The type of the file system holding ``path`` (``vfat``, ``ext4``...), or None if unknown."""
    here = os.path.abspath(path)
    while not os.path.exists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    here = os.path.realpath(here)
    try:
        with open(os.environ.get(TEST_MOUNTINFO_ENV) or MOUNTINFO, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: Tuple[int, Optional[str]] = (-1, None)
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        inside = here == point or here.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best[0]:  # later lines mount over earlier ones at the same point
            best = (len(point), tail[0])
    return best[1]


def is_fat(path: str) -> bool:
    return fs_type(path) in FAT_TYPES


def split_for(target: str, split: Optional[int]) -> Tuple[Optional[int], Optional[str]]:
    """(the part size to use, a note when it was chosen here): onto FAT, an archive with no
    ``--split`` or parts of 4 GiB or more is cut at :func:`auto_split` instead."""
    if (split is not None and split < file_limit()) or not is_fat(target):
        return split, None
    size = auto_split()
    asked = "no --split" if split is None else f"--split of {split} bytes"
    return size, (f"{os.path.dirname(os.path.abspath(target))} is on FAT ({fs_type(target)}), which holds no file "
                  f"of 4 GiB or more: {asked} given, writing parts of at most {size} bytes (--split {size})")


def check_fits(folder: str, name: str, size: int, doing: str) -> None:
    """Refuse ``name`` of ``size`` bytes bound for ``folder`` when that is on FAT and too big."""
    if size < file_limit() or not is_fat(folder):
        return
    raise FileTooBigForFat(
        f"{doing}: expected files under 4 GiB on {folder} (a FAT file system: {fs_type(folder)}), "
        f"found {name} of {size} bytes ({size / 1024**3:.2f} GiB)",
        hint=f"nothing was written; {FIX}")
