"""Bundles larger than the page cache, at any size (issue 44 point 4): ``bench/run.py --cold``.

A command that reads its input twice (``bundle-import --verify`` into Docker's containerd store:
every blob hashed before the engine is touched, then read again for the load) gets the second
read from memory whenever the host's page cache holds the bundle, which a 10-20 GB bundle on a
small host or a USB disk does not. Two things make a small bundle behave like that:

- :func:`evict` drops the input files' pages from the page cache before the command
  (``posix_fadvise(DONTNEED)`` after ``fsync``: only those files, nothing else of the machine's
  cache), so the first read comes from disk;
- :class:`MemoryCgroup` runs the command in a child memory cgroup of this process's own (cgroup
  v2 ``memory.max``, or the v1 memory hierarchy's ``memory.limit_in_bytes``): the page cache its
  reads fill is charged to that cgroup and reclaimed once the limit is reached, so a bundle
  larger than the limit minus the command's own memory is read from disk again on the second
  pass. The engine's daemons stay outside it (their writes are not limited).

Whether a read came from disk shows in the command's ``ru_inblock`` (bench/run.py's ``read MiB``:
the bytes its process tree had the block layer fetch, children included).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def evict(paths: list[Path]) -> int:
    """Drop the page-cache pages of every file under ``paths``; return the bytes of those files."""
    total = 0
    for top in paths:
        for p in [top] if top.is_file() else sorted(q for q in top.rglob("*") if q.is_file()):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages are not dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """(folder of this process's memory cgroup, "v2" or "v1"), or None where there is none."""
    own: dict[str, str] = {}  # controller ("" for v2) -> path
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            own[c] = path
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields, (fstype, _, opts) = left.split(), right.split()[:3]
        root, mount = fields[3], fields[4]
        if fstype == "cgroup2" and "" in own:
            controllers = Path(mount, "cgroup.controllers")
            if controllers.exists() and "memory" in controllers.read_text().split():
                return Path(mount) / os.path.relpath(own[""], root), "v2"
        elif fstype == "cgroup" and "memory" in opts.split(",") and "memory" in own:
            return Path(mount) / os.path.relpath(own["memory"], root), "v1"
    return None


class MemoryCgroup:
    """A child memory cgroup limited to ``limit`` bytes; :meth:`wrap` runs a command in it."""

    def __init__(self, limit: int) -> None:
        found = _own_memory_cgroup()
        if found is None:
            raise RuntimeError("bench --cold: expected a memory cgroup (cgroup v2 with the memory controller, "
                               "or cgroup v1's memory hierarchy), found none in /proc/self/mountinfo; run on a "
                               "host that has one")
        parent, self.version = found
        self.path = parent / f"sneakernet-bench-cold-{os.getpid()}"
        try:
            if self.version == "v2":
                with contextlib.suppress(OSError):  # may be on already; fails where the parent has processes
                    (parent / "cgroup.subtree_control").write_text("+memory")
            self.path.mkdir()
            limit_file = "memory.max" if self.version == "v2" else "memory.limit_in_bytes"
            (self.path / limit_file).write_text(str(limit))
        except OSError as e:
            self.close()
            raise RuntimeError(f"bench --cold: creating the memory cgroup {self.path} (limit {limit} bytes) "
                               f"failed: {e}; run as root on a host whose cgroup this user may write") from e
        self.limit = limit

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cgroup (the shell moves itself in, then execs: the same pid)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()  # its page-cache charges move to the parent
