"""Bytes in motion: bounded decompression (and the pure-Python zstd decoder), atomic files,
threads, sizes, progress lines, the engine command runner, signals and test hold points."""
