"""Atomic file writes (temp file in the same directory, fsync, rename) and reads that trust no
link: :func:`open_regular` opens a bundle's file only if it is a regular file reached without
following any symbolic link below the bundle's root."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from typing import BinaryIO, Iterator, List, Optional

from importer.errors import MissingBlob, NotRegularFile, SizeMismatch, UnreadableFile, name_write_error

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows
_HINT_LINK = "a bundle holds regular files only, never links or special files: re-copy it from the source medium"


@contextlib.contextmanager
def atomic_writer(path: str, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield a file that appears under ``path`` only if the block completes."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    done = False  # past the block: any error is this file's (flush, fsync, rename)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            done = True
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):  # write() names no file: an out-of-space error names this one
            name_write_error(e, path, any_errno=done)
        raise


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    with atomic_writer(path, mode) as f:
        f.write(data)


def fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def describe_mode(mode: int) -> str:
    """What an ``lstat`` mode is, in words."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
                        (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return f"a file of unknown type (mode {oct(mode)})"


def _describe(path: str) -> str:
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"nothing readable ({e.strerror})"
    words = describe_mode(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):
            words += f" to {os.readlink(path)}"
    return words


def _refuse(path: str, what: str, expected: str) -> NotRegularFile:
    return NotRegularFile(f"{what}: expected {expected} at {path}, found {_describe(path)}", hint=_HINT_LINK)


def _open_error(e: OSError, path: str, what: str, expected: str) -> Exception:
    """The typed error for a failed open of ``path`` (what was there, when something was)."""
    if e.errno == errno.ENOENT:
        return MissingBlob(f"{what}: expected {expected} at {path}, found none",
                           hint="the bundle is incomplete: re-copy the whole bundle from the source medium")
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.EMLINK):
        return _refuse(path, what, expected)
    return UnreadableFile(f"{what}: expected a readable file at {path}, found it unreadable ({e.strerror})",
                          hint="fix its permissions, or the medium (an I/O error): then run the copy again")


def _walk_folders(root: str, parts: List[str], what: str) -> int:
    """An fd of root/parts[0]/.../parts[-1], opened one folder at a time without following a link."""
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    here = root
    try:
        for name in parts:
            here = os.path.join(here, name)
            try:
                nxt = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as e:
                raise _open_error(e, here, what, "a folder") from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str, what: str, expected_size: Optional[int] = None, *,
                 root: Optional[str] = None) -> BinaryIO:
    """Open ``path`` for reading, only if it is a regular file (and, with ``expected_size``, only
    if it has that size); ``what`` says what is being done, for the messages (e.g. "copying X").

    Nothing is followed: the last component is opened with ``O_NOFOLLOW`` and, with ``root``, every
    folder between ``root`` (which the caller named, so it may be reached through a link) and the
    file is opened one by one with ``O_NOFOLLOW|O_DIRECTORY``. A FIFO cannot block the open
    (``O_NONBLOCK``, cleared again for a regular file), and a device is never opened: the type is
    checked with ``lstat`` before, and with ``fstat`` after the open (same file, still regular).

    Raises :class:`MissingBlob` (nothing there), :class:`NotRegularFile` (a link, a folder, a
    FIFO, a device, a socket, or a link among the folders), :class:`SizeMismatch` and
    :class:`UnreadableFile` (permissions, I/O); never a bare OSError. Read it with
    :func:`read_exactly` to stay within the size."""
    if root is not None:
        rel = os.path.relpath(path, root)
        parts = rel.split(os.sep)
        if rel == os.curdir or os.pardir in parts or os.path.isabs(rel):
            raise ValueError(f"open_regular: {path} is not below {root}")
        dir_fd: Optional[int] = None
        if os.open in os.supports_dir_fd:
            try:
                dir_fd = _walk_folders(root, parts[:-1], what)
            except OSError as e:
                raise _open_error(e, root, what, "a folder") from None
            name = parts[-1]
        else:  # no openat(): check each folder with lstat (racy, but nothing is followed on the way)
            here = root
            for part in parts[:-1]:
                here = os.path.join(here, part)
                try:
                    if not stat.S_ISDIR(os.lstat(here).st_mode):
                        raise _refuse(here, what, "a folder")
                except OSError as e:
                    raise _open_error(e, here, what, "a folder") from None
            name = path
    else:
        dir_fd, name = None, path
    try:
        try:
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as e:
            raise _open_error(e, path, what, "a regular file") from None
        if not stat.S_ISREG(before.st_mode):
            raise _refuse(path, what, "a regular file")
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC | _BINARY, dir_fd=dir_fd)
        except OSError as e:
            raise _open_error(e, path, what, "a regular file") from None
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotRegularFile(f"{what}: expected a regular file at {path}, found {describe_mode(st.st_mode)} "
                                 "(it was swapped while it was opened)", hint=_HINT_LINK)
        if expected_size is not None and st.st_size != expected_size:
            raise SizeMismatch(f"{what}: expected {expected_size} bytes at {path}, found {st.st_size}",
                               hint="the file was truncated, extended or swapped: re-copy the bundle")
        if _NONBLOCK:
            import fcntl  # POSIX only, as O_NONBLOCK

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_exactly(f: BinaryIO, size: int, path: str, what: str, *, chunk: int = 1024 * 1024) -> Iterator[bytes]:
    """Yield the next ``size`` bytes of ``f`` in chunks, then check that the file ends there: never
    more than ``size`` + 1 bytes are read. A file shorter or longer than ``size`` (it changed after
    it was opened) raises :class:`SizeMismatch`; a read error :class:`UnreadableFile`."""
    left = size
    try:
        while left > 0:
            data = f.read(min(chunk, left))
            if not data:
                raise SizeMismatch(f"{what}: expected {size} bytes at {path}, found {size - left}",
                                   hint="the file is shorter than recorded (or shrank during the read): re-copy it")
            left -= len(data)
            yield data
        if f.read(1):
            raise SizeMismatch(f"{what}: expected {size} bytes at {path}, found more",
                               hint="the file is longer than recorded (or grew during the read): re-copy it")
    except OSError as e:
        raise UnreadableFile(f"{what}: expected a readable file at {path}, found a read error ({e.strerror})",
                             hint="fix the medium (an I/O error), then run the copy again") from None
