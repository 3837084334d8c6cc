"""Layer decoders side by side (docs/benchmarks.md, "Decoding zstd without zstd"): one layer
(default: the first 100 MiB of a tar of /usr/lib/x86_64-linux-gnu) compressed with zstd -3 the
way the exporter does it (all cores, stream writer) and with gzip -6, then decompressed by the
`zstandard` module, the zstd command, gzip (stdlib zlib) and importer/streams/zstdpure.py.

    python3 bench/decoders.py [LAYER.tar]
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tempfile
import time

import zstandard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from importer.streams import zstdpure


def _layer() -> bytes:
    if len(sys.argv) > 1:
        with open(sys.argv[1], "rb") as f:
            return f.read()
    tar = subprocess.run(["tar", "-C", "/", "-cf", "-", "--sort=name", "usr/lib/x86_64-linux-gnu"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False).stdout
    return tar[:100 << 20]


def main() -> None:
    raw = _layer()
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3, threads=-1, write_checksum=True).stream_writer(out, closefd=False) as w:
        w.write(raw)
    zst = out.getvalue()
    started = time.perf_counter()
    gz = gzip.compress(raw, 6, mtime=0)
    gzip_s = time.perf_counter() - started
    print(f"layer {len(raw) / 1e6:.1f} MB; zstd -3 {len(zst) / 1e6:.1f} MB; gzip -6 {len(gz) / 1e6:.1f} MB "
          f"({gzip_s:.1f} s to compress)")

    def cli() -> bytes:
        with tempfile.NamedTemporaryFile() as f:
            f.write(zst)
            f.flush()
            return subprocess.run(["zstd", "-dcq", f.name], stdout=subprocess.PIPE, check=True).stdout

    cases = [
        ("zstandard", lambda: zstandard.ZstdDecompressor().stream_reader(io.BytesIO(zst), read_across_frames=True)
         .read()),
        ("zstd command", cli),
        ("gzip (zlib)", lambda: gzip.decompress(gz)),
        ("pure-Python zstd", lambda: b"".join(zstdpure.iter_decompress(io.BytesIO(zst)))),
    ]
    for name, fn in cases:
        started = time.perf_counter()
        got = fn()
        wall = time.perf_counter() - started
        assert got == raw, name
        print(f"{name:18s} {wall:7.2f} s  {len(raw) / wall / 1e6:7.1f} MB/s  (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
