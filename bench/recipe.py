"""The synthetic benchmark image: ~1/3 random bytes, ~1/2 library-like bytes, many small files.

Built FROM scratch in a private dockerd (no pulls). Sizes scale with ``total_bytes``; the default
3 GiB matches the issue's reference measurements (1 GiB random, 1.5 GiB library-like, 50k small
files). ``layers`` spreads the same mix over that many layers (issue 44 point 4: the per-layer
costs of a CUDA image's ~80 layers); left out, each recipe keeps its 4 layers."""

from __future__ import annotations

import functools
import os
import random
import shutil
from pathlib import Path
from typing import Callable

LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/usr/bin", "/usr/share")
DOCKERFILE = "Dockerfile"
BLOCK = 16 << 20


@functools.lru_cache(maxsize=1)
def _library_files() -> tuple[Path, ...]:
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
    return tuple(files)


RECIPES = ("mixed", "incompressible")


def write_context(ctx: Path, total_bytes: int, busybox: str, *, small_files: int | None = None,
                  recipe: str = "mixed", layers: int | None = None) -> Path:
    """Write a docker build context for the benchmark image; return it.

    ``mixed``: the default above. ``incompressible``: the field case of issue 30 (a CUDA/PyTorch
    image is mostly already-compressed or random-looking weights and kernels): ~7/8 random bytes
    in two layers plus ~1/8 real shared libraries, no small-file layer.

    ``layers`` (at least 2): busybox, then ``layers - 1`` layers that each hold an equal slice
    of the recipe's mix (its random bytes, its libraries and, for ``mixed``, its small files), so
    the image has exactly that many layers and every layer costs the same."""
    if recipe not in RECIPES:
        raise ValueError(f"bench recipe: expected one of {', '.join(RECIPES)}, found {recipe!r}")
    if layers is not None and layers < 2:
        raise ValueError(f"bench recipe: expected at least 2 layers (busybox and the mix), found {layers}")
    ctx.mkdir(parents=True, exist_ok=True)
    n_small = small_files if small_files is not None else max(100, int(50000 * total_bytes / (3 << 30)))
    if layers is not None:
        return _layered(ctx, total_bytes, busybox, recipe, layers, n_small)
    if recipe == "incompressible":
        return _incompressible(ctx, total_bytes, busybox)
    shutil.copy(busybox, ctx / "busybox")
    random_bytes = total_bytes // 3
    lib_bytes = total_bytes // 2
    _write_random(ctx / "random.bin", random_bytes)
    _write_libraries(ctx / "lib", lib_bytes)
    # layer 3: many small files
    _write_small(ctx / "small", n_small)
    (ctx / "Dockerfile").write_text(
        "FROM scratch\n"
        "COPY busybox /bin/busybox\n"
        "COPY random.bin /data/random.bin\n"
        "COPY lib /data/lib\n"
        "COPY small /data/small\n"
    )
    return ctx


def _layered(ctx: Path, total_bytes: int, busybox: str, recipe: str, layers: int, n_small: int) -> Path:
    """``layers - 1`` folders ``lNNN``, each a slice of the mix and one ``COPY`` (one layer)."""
    shutil.copy(busybox, ctx / "busybox")
    n = layers - 1
    rand_share, lib_share = (total_bytes // 3, total_bytes // 2) if recipe == "mixed" else \
        (total_bytes * 7 // 8, total_bytes // 8)
    lines = ["FROM scratch", "COPY busybox /bin/busybox"]
    for k in range(n):
        d = ctx / f"l{k:03d}"
        d.mkdir()
        _write_libraries(d / "lib", lib_share // n, start=k * 997)
        _write_random(d / "random.bin", rand_share // n, seed=k + 1)
        if recipe == "mixed":
            _write_small(d / "small", max(1, n_small // n), seed=k)
        lines.append(f"COPY {d.name} /data/{d.name}")
    (ctx / DOCKERFILE).write_text("\n".join(lines) + "\n")
    return ctx


def _write_small(small: Path, count: int, seed: int = 0) -> None:
    """``count`` files of 16-2048 random bytes in up to 256 folders."""
    small.mkdir(exist_ok=True)
    rng = random.Random(seed)
    for k in range(count):
        d = small / f"{k % 256:02x}"
        d.mkdir(exist_ok=True)
        (d / f"f{k}.txt").write_bytes(rng.randbytes(rng.randint(16, 2048)))


def _random_blocks(seed: int) -> Callable[[int], bytes]:
    """Incompressible bytes fast: AES-256-CTR of zeros under a key from ``seed`` (several GB/s with
    AES-NI, against about 0.5 GB/s for os.urandom: a 10 GiB context is mostly these); os.urandom
    where the cryptography package is missing. Every seed gives other bytes (no two layers share
    a blob)."""
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        return os.urandom
    key = seed.to_bytes(8, "big") + os.urandom(24)  # fresh per context: nothing cached between runs
    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    zeros = bytes(BLOCK)
    return lambda n: enc.update(zeros[:n])


def _write_random(path: Path, size: int, seed: int = 0) -> None:
    """Random (incompressible) bytes, written in 16 MiB pieces."""
    block = _random_blocks(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, BLOCK)
            f.write(block(n))
            left -= n


def _write_libraries(lib: Path, lib_bytes: int, start: int = 0) -> None:
    """Library-like bytes: real binaries and data from this machine, repeated to size (from the
    ``start``-th file on, so that the layers of a layered image do not all begin alike)."""
    lib.mkdir(exist_ok=True)
    written = 0
    files = _library_files()
    i = start % len(files) if files else 0
    tried = 0
    while written < lib_bytes and files:
        src = files[i % len(files)]
        size = src.stat().st_size
        if size and written + size <= lib_bytes + (1 << 20):
            dst = lib / f"{i // len(files)}" / str(i % len(files))
            dst.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dst)
            written += size
        i += 1
        tried += 1
        if tried > 50 * len(files):
            break


def _incompressible(ctx: Path, total_bytes: int, busybox: str) -> Path:
    shutil.copy(busybox, ctx / "busybox")
    _write_random(ctx / "weights.bin", total_bytes // 2, seed=1)
    _write_random(ctx / "kernels.bin", total_bytes * 3 // 8, seed=2)
    _write_libraries(ctx / "lib", total_bytes // 8)
    (ctx / "Dockerfile").write_text(
        "FROM scratch\n"
        "COPY busybox /bin/busybox\n"
        "COPY lib /usr/lib/sn\n"
        "COPY kernels.bin /opt/kernels.bin\n"
        "COPY weights.bin /opt/weights.bin\n"
    )
    return ctx
