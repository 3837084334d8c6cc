"""Layer decompression, bounded by the recorded uncompressed size.

zstd uses the ``zstandard`` module when importable, else ``compression.zstd`` (3.14+), else the
``zstd`` command-line tool, else the pure-Python decoder in :mod:`importer.streams.zstdpure` (slow, a few
MB/s, but it needs nothing beyond python3: a bundle always imports). The first layer decoded by
the pure-Python decoder prints one note on stderr with the expected time. gzip uses zlib through
:class:`importer.streams.gzipread.GzipReader` (GzipFile's semantics, 1 MiB reads).
Every reader stops one byte past the bound, so a decompression bomb cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import sys
from typing import Any, BinaryIO, ContextManager, Iterator, List, Optional

from importer.errors import BundleError, DecompressFailed, LimitExceeded
from importer.format.digest import CHUNK
from importer.streams.commands import child_stdout
from importer.streams.gzipread import GzipReader
from importer.streams.progress import human_bytes
from importer.streams.readers import Readable
from importer.streams.zstdpure import PureZstdReader

# Output rate of the pure-Python decoder measured on the benchmark machine (docs/benchmarks.md),
# used for the expected time in the fallback note.
PURE_ZSTD_BYTES_PER_S = 5_000_000
_noted = False


def _zstd_module() -> Optional[Any]:
    for name in ("zstandard", "compression.zstd"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


FAST_ZSTD_DECODERS = ("zstandard", "compression.zstd", "zstd-cli")


def host_decoders() -> List[str]:
    """Every layer decoder this host has, for the inventory's ``decoders``: ``gzip`` (stdlib)
    and ``zstd-pure-python`` always, plus whichever of :data:`FAST_ZSTD_DECODERS` is there."""
    found = ["gzip"]
    for name in ("zstandard", "compression.zstd"):
        try:
            importlib.import_module(name)
            found.append(name)
        except ImportError:
            pass
    if shutil.which("zstd"):
        found.append("zstd-cli")
    return [*found, "zstd-pure-python"]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _note_pure_fallback(size: int, what: str) -> None:
    """One stderr line per process, the first time a layer takes the slow path."""
    global _noted
    if _noted:
        return
    _noted = True
    rate = PURE_ZSTD_BYTES_PER_S
    sys.stderr.write(
        f"note: decoding zstd layers with the built-in pure-Python decoder (no zstandard module, "
        f"no zstd command, Python < 3.14 on this host): about {human_bytes(rate)}/s, so "
        f"{what} ({human_bytes(size)}) takes about {_duration(size / rate)} and every GiB about "
        f"{_duration((1 << 30) / rate)}; faster: the zstd command or the zstandard module on this "
        f"host, or a bundle exported with --compression gzip (or with --have this host's "
        f"`bundle-import --inventory`)\n"
    )
    sys.stderr.flush()


class BoundedReader:
    """Read from ``raw`` but fail once more than ``bound`` bytes came out."""

    def __init__(self, raw: Any, bound: int, what: str) -> None:
        self._raw = raw
        self._bound = bound
        self._n = 0
        self._what = what

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = CHUNK
        budget = self._bound + 1 - self._n
        data = self._raw.read(min(n, budget)) if budget > 0 else b""
        self._n += len(data)
        if self._n > self._bound:
            raise LimitExceeded(
                f"decompressing {self._what}: expected at most {self._bound} bytes "
                f"(the recorded uncompressed size), found more",
                hint="the layer is not what bundle.json records (possibly a decompression bomb); "
                "do not import this bundle",
            )
        return bytes(data)

    @property
    def count(self) -> int:
        return self._n


@contextlib.contextmanager
def open_decompressed(
    raw: Readable, compression: str, *, bound: int, what: str
) -> Iterator[BoundedReader]:
    """Yield a reader of the decompressed bytes of ``raw``. The caller closes ``raw``."""
    if compression == "none":
        yield BoundedReader(raw, bound, what)
    elif compression == "gzip":
        with GzipReader(raw) as gz:
            yield BoundedReader(gz, bound, what)
    elif compression == "zstd":
        mod = _zstd_module()
        if mod is not None and mod.__name__ == "zstandard":
            dctx = mod.ZstdDecompressor()
            with dctx.stream_reader(raw, read_size=CHUNK, read_across_frames=True, closefd=False) as r:
                yield BoundedReader(r, bound, what)
        elif mod is not None:
            with mod.ZstdFile(raw, "rb") as r:
                yield BoundedReader(r, bound, what)
        elif shutil.which("zstd"):
            with _zstd_cli(raw, what) as r:
                yield BoundedReader(r, bound, what)
        else:
            _note_pure_fallback(bound, what)
            pure = PureZstdReader(raw)
            try:
                yield BoundedReader(pure, bound, what)
            finally:
                pure.close()
    else:
        raise BundleError(f"decompressing {what}: unknown compression {compression!r}")


def _zstd_cli(raw: Readable, what: str) -> ContextManager[BinaryIO]:
    """Run ``zstd -dc``, fed from ``raw`` by a thread (so ``raw`` may hash what passes)."""
    return child_stdout(["zstd", "-dcq"], what=f"decompressing {what}", stdin_from=raw,
                        on_failure=lambda rc, tail: DecompressFailed(
                            f"decompressing {what}: zstd exited with status {rc}", context=tail[-2000:],
                            hint="the layer blob is damaged; re-copy the bundle"))
