"""The synthetic benchmark image: ~1/3 random bytes, ~1/2 library-like bytes, many small files.

Built FROM scratch in a private dockerd (no pulls). Sizes scale with ``total_bytes``; the default
3 GiB matches the issue's reference measurements (1 GiB random, 1.5 GiB library-like, 50k small
files)."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/usr/bin", "/usr/share")


def _library_files() -> list[Path]:
    files: list[Path] = []
    for d in LIB_DIRS:
        for root, _, names in os.walk(d):
            for n in names:
                p = Path(root) / n
                if p.is_file() and not p.is_symlink():
                    files.append(p)
            if len(files) > 20000:
                break
    files.sort()
    return files


RECIPES = ("mixed", "incompressible")


def write_context(ctx: Path, total_bytes: int, busybox: str, *, small_files: int | None = None,
                  recipe: str = "mixed") -> Path:
    """Write a docker build context for the benchmark image; return it.

    ``mixed``: the default above. ``incompressible``: the field case of issue 30 (a CUDA/PyTorch
    image is mostly already-compressed or random-looking weights and kernels): ~7/8 random bytes
    in two layers plus ~1/8 real shared libraries, no small-file layer."""
    if recipe not in RECIPES:
        raise ValueError(f"bench recipe: expected one of {', '.join(RECIPES)}, found {recipe!r}")
    ctx.mkdir(parents=True, exist_ok=True)
    if recipe == "incompressible":
        return _incompressible(ctx, total_bytes, busybox)
    shutil.copy(busybox, ctx / "busybox")
    random_bytes = total_bytes // 3
    lib_bytes = total_bytes // 2
    _write_random(ctx / "random.bin", random_bytes)
    _write_libraries(ctx / "lib", lib_bytes)
    n_small = small_files if small_files is not None else max(100, int(50000 * total_bytes / (3 << 30)))
    # layer 3: many small files
    small = ctx / "small"
    small.mkdir(exist_ok=True)
    rng = random.Random(0)
    for k in range(n_small):
        d = small / f"{k % 256:02x}"
        d.mkdir(exist_ok=True)
        (d / f"f{k}.txt").write_bytes(rng.randbytes(rng.randint(16, 2048)))
    (ctx / "Dockerfile").write_text(
        "FROM scratch\n"
        "COPY busybox /bin/busybox\n"
        "COPY random.bin /data/random.bin\n"
        "COPY lib /data/lib\n"
        "COPY small /data/small\n"
    )
    return ctx


def _write_random(path: Path, size: int) -> None:
    """Random (incompressible) bytes, written in 16 MiB pieces."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n


def _write_libraries(lib: Path, lib_bytes: int) -> None:
    """Library-like bytes: real binaries and data from this machine, repeated to size."""
    lib.mkdir(exist_ok=True)
    written = 0
    files = _library_files()
    i = 0
    while written < lib_bytes and files:
        src = files[i % len(files)]
        size = src.stat().st_size
        if size and written + size <= lib_bytes + (1 << 20):
            dst = lib / f"{i // len(files)}" / str(i % len(files))
            dst.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dst)
            written += size
        i += 1
        if i > 50 * len(files):
            break


def _incompressible(ctx: Path, total_bytes: int, busybox: str) -> Path:
    shutil.copy(busybox, ctx / "busybox")
    _write_random(ctx / "weights.bin", total_bytes // 2)
    _write_random(ctx / "kernels.bin", total_bytes * 3 // 8)
    _write_libraries(ctx / "lib", total_bytes // 8)
    (ctx / "Dockerfile").write_text(
        "FROM scratch\n"
        "COPY busybox /bin/busybox\n"
        "COPY lib /usr/lib/sn\n"
        "COPY kernels.bin /opt/kernels.bin\n"
        "COPY weights.bin /opt/weights.bin\n"
    )
    return ctx
