"""Layer decompression, bounded by the recorded uncompressed size.

zstd uses the ``zstandard`` module when importable, else ``compression.zstd`` (3.14+), else the
``zstd`` command-line tool; with none of them it stops with a clear error. gzip uses the stdlib.
Every reader stops one byte past the bound, so a decompression bomb cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import shutil
import subprocess
import tempfile
import threading
from typing import Any, BinaryIO, Iterator, Optional

from importer.digest import CHUNK
from importer.errors import BundleError, DecompressFailed, LimitExceeded

_NO_ZSTD_HINT = (
    "install one of: the Python module 'zstandard' (pip install zstandard), "
    "the 'zstd' command (apt-get install zstd / dnf install zstd), or Python 3.14+"
)


class DecompressorUnavailable(BundleError):
    reference = "no-decompressor"
    exit_code = 2


def _zstd_module() -> Optional[Any]:
    for name in ("zstandard", "compression.zstd"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def zstd_backend() -> str:
    """Which zstd implementation this host would use: module name, 'zstd-cli' or 'none'."""
    mod = _zstd_module()
    if mod is not None:
        return str(mod.__name__)
    return "zstd-cli" if shutil.which("zstd") else "none"


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
    raw: BinaryIO, compression: str, *, bound: int, what: str
) -> Iterator[BoundedReader]:
    """Yield a reader of the decompressed bytes of ``raw``. The caller closes ``raw``."""
    if compression == "none":
        yield BoundedReader(raw, bound, what)
    elif compression == "gzip":
        with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
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
            raise DecompressorUnavailable(
                f"decompressing {what}: expected a zstd decompressor, found none on this host",
                hint=_NO_ZSTD_HINT,
            )
    else:
        raise BundleError(f"decompressing {what}: unknown compression {compression!r}")


@contextlib.contextmanager
def _zstd_cli(raw: Any, what: str) -> Iterator[BinaryIO]:
    """Run ``zstd -dc``, fed from ``raw`` by a thread (so ``raw`` may hash what passes);
    stderr goes to a temp file."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(["zstd", "-dcq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdin is not None and proc.stdout is not None
        feeder = threading.Thread(target=_feed, args=(raw, proc.stdin), daemon=True)
        feeder.start()
        done = False
        try:
            yield proc.stdout  # type: ignore[misc]
            done = True
        finally:
            if not done:
                proc.kill()
            proc.stdout.close()
            rc = proc.wait()
            feeder.join()
        if rc != 0 and done:
            err.seek(0)
            raise DecompressFailed(
                f"decompressing {what}: zstd exited with status {rc}",
                context=err.read()[-2000:].decode("utf-8", "replace"),
                hint="the layer blob is damaged; re-copy the bundle",
            )


def _feed(raw: Any, stdin: BinaryIO) -> None:
    try:
        while True:
            chunk = raw.read(CHUNK)
            if not chunk:
                break
            stdin.write(chunk)
    except (BrokenPipeError, ValueError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            stdin.close()
