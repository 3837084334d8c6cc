"""Small file systems for out-of-space tests: a tmpfs of a given size mounted by the test (root),
unmounted however the test ends. Under CI=true a host that cannot mount one fails the test."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.kit import engines


@contextlib.contextmanager
def small_fs(path: Path, size: str, *, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (``4m``; ``inodes``: at most that many files and folders) mounted at
    ``path`` (made when missing) for the block. tmpfs fails a write with a real ENOSPC."""
    engines.require_root("mounting a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0755" + (f",nr_inodes={inodes}" if inodes else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        engines.unavailable(f"cannot mount a tmpfs at {path}: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int) -> Path:
    """A file ``path`` that takes the free space of its file system down to about ``leave`` bytes
    (a disk that filled up while a command ran); remove it to free the space again."""
    with open(path, "wb") as f:
        f.truncate(0)
        want = max(0, free_bytes(path.parent) - leave)
        block = b"\0" * (1 << 20)
        while want > 0:
            want -= f.write(block[:min(len(block), want)])
    return path


def everything_under(path: Path) -> list[str]:
    """Every file and folder below ``path`` (relative, sorted): what a failed run left."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@contextlib.contextmanager
def vfat_fs(path: Path, size_mb: int = 64) -> Iterator[Path]:
    """A real FAT32-family file system (mkfs.vfat on a ``size_mb`` MiB image, loop-mounted at
    ``path``) for the block: what a USB stick often is. Needs root and dosfstools."""
    engines.require_root("loop-mounting a vfat image")
    image = path.parent / f"{path.name}.img"
    path.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    try:
        made = subprocess.run(["mkfs.vfat", str(image)], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        engines.unavailable("mkfs.vfat is missing (install dosfstools)")
    if made.returncode != 0:
        engines.unavailable(f"mkfs.vfat failed: {made.stderr.strip()}")
    proc = subprocess.run(["mount", "-o", "loop", str(image), str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        image.unlink()
        engines.unavailable(f"cannot loop-mount a vfat image at {path}: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        image.unlink()
