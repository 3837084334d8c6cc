"""One import per engine at a time: an exclusive ``flock`` on a lock file named after the
engine address.

The lock file lives in the first usable of: ``$SNEAKERNET_LOCK_DIR``, ``/var/lib/sneakernet/locks``,
``$XDG_STATE_HOME/sneakernet/locks`` (default ``~/.local/state/sneakernet/locks``), the temp
dir. The kernel drops a ``flock`` when its holder exits, even on SIGKILL, so a lock is never
stale; the file itself stays (it holds the last holder's pid, bundle and start time, which the
message shows to whoever waits).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from typing import Callable, Iterator, List, Optional

from importer.errors import SinkError

LOCK_DIR_ENV = "SNEAKERNET_LOCK_DIR"
SYSTEM_LOCK_DIR = "/var/lib/sneakernet/locks"


class EngineLocked(SinkError):
    """Another import into the same engine holds the lock."""

    reference = "engine-locked"


def lock_dirs() -> List[str]:
    """Candidate folders, best first."""
    env = os.environ.get(LOCK_DIR_ENV)
    if env:
        return [env]
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return [SYSTEM_LOCK_DIR, os.path.join(state, "sneakernet", "locks"), tempfile.gettempdir()]


def lock_path(address: str) -> str:
    """The lock file for the engine at ``address`` (created folder included)."""
    name = "sneakernet-engine-" + hashlib.sha256(address.encode("utf-8")).hexdigest()[:16] + ".lock"
    last: Optional[OSError] = None
    for d in lock_dirs():
        try:
            os.makedirs(d, mode=0o755, exist_ok=True)
        except OSError as e:
            last = e
            continue
        if os.access(d, os.W_OK) or os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    raise SinkError(f"locking the engine {address}: expected a writable lock folder, found none ({last})",
                    hint=f"set {LOCK_DIR_ENV} to a writable folder shared by everyone importing into this engine")


def _open(path: str) -> int:
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, os.O_RDWR | flags, 0o644)
    except PermissionError:  # someone else's file (e.g. in the temp dir): a read-only fd locks too
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        doc = json.loads(os.read(fd, 64 * 1024).decode("utf-8") or "{}")
    except (OSError, ValueError):
        doc = {}
    if not isinstance(doc, dict) or not doc.get("pid"):
        return "another import"
    return (f"pid {doc.get('pid')} on {doc.get('host')}, importing {doc.get('bundle')}, "
            f"since {doc.get('since')}")


@contextlib.contextmanager
def engine_lock(address: str, *, bundle: str, wait: float = 0.0,
                on_wait: Optional[Callable[[str], None]] = None) -> Iterator[str]:
    """Hold the engine's lock for the block; yields the lock file path.

    ``wait`` seconds: 0 fails at once when another import holds it, otherwise keep trying
    that long. ``on_wait`` is told once who holds it."""
    path = lock_path(address)
    fd = _open(path)
    try:
        deadline = time.monotonic() + max(0.0, wait)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            holder = _holder(fd)
            if time.monotonic() >= deadline:
                waited = f" after waiting {wait:.0f}s" if wait > 0 else ""
                raise EngineLocked(
                    f"locking the engine {address} for this import: expected no other import into it, "
                    f"found one{waited} ({holder})",
                    context=f"lock file: {path}",
                    hint="nothing was changed; wait for that import to end (or pass --wait-lock SECONDS); "
                    "the lock is released by the kernel when that process exits",
                )
            if on_wait is not None and not told:
                on_wait(f"waiting for the engine lock {path} ({holder})")
                told = True
            time.sleep(0.2)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "bundle": os.path.abspath(bundle),
                "engine": address,
                "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        with contextlib.suppress(OSError):  # read-only fd: the lock holds, the note is skipped
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
