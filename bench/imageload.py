"""The benchmark image without ``docker build``: the context's ``COPY`` lines become layers of a
docker-archive streamed into ``docker load`` (``--setup load``, the default).

Why: a build of 80 ``COPY`` steps of a 10 GiB context took 12.5 minutes in the classic store and 28
in the containerd store on the 2-core VM, before the first measured case; a load of the same
layers takes a few. The image holds the same files, one layer per ``COPY`` line, as the build
would leave them in each store:

- classic store: uncompressed ``layer.tar`` members (what ``docker load`` of a ``docker save``
  gives: the layer's folder under overlay2 and its tar-split, as after a build);
- containerd store: each ``layer.tar`` member gzip-compressed (level 6), so its content store
  keeps gzip blobs as a build or a pull leaves them (an uncompressed member is kept uncompressed
  there, which no build or pull gives).

Each layer tar is written once to a temp file beside the context (hashed on the way for its
diff_id), then sent; the config and ``manifest.json`` go last (``docker load`` reads the whole
archive before it creates the image)."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import json
import os
import subprocess
import tarfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Iterator

GZIP_LEVEL = 6  # Go's compress/gzip default, as a build in the containerd store writes
COPY_BUF = 1 << 20


def copy_lines(ctx: Path) -> list[tuple[str, str]]:
    """The Dockerfile's ``COPY SRC DST`` lines, in order (the recipe writes nothing else but
    ``FROM scratch``)."""
    found: list[tuple[str, str]] = []
    for line in (ctx / "Dockerfile").read_text().splitlines():
        words = line.split()
        if not words or words == ["FROM", "scratch"]:
            continue
        if len(words) != 3 or words[0] != "COPY" or not words[2].startswith("/"):
            raise ValueError(f"bench image load: expected `COPY SRC /DST` or `FROM scratch`, found {line!r}")
        found.append((words[1], words[2]))
    return found


class _Hashing:
    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.h, self.n = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return self.raw.write(data)


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_layer(ctx: Path, src: str, dst: str, out: Path) -> str:
    """One ``COPY SRC DST`` as a layer tar at ``out`` (DST's parent folders, then SRC's tree as
    DST, owned by root); return its diff_id."""
    with open(out, "wb") as raw:
        hashing = _Hashing(raw)
        with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                          copybufsize=COPY_BUF) as tar:
            parts = dst.strip("/").split("/")
            for k in range(1, len(parts)):
                d = tarfile.TarInfo("/".join(parts[:k]))
                d.type, d.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(d)
            tar.add(str(ctx / src), arcname="/".join(parts), filter=_root_owned)
    return "sha256:" + hashing.h.hexdigest()


def _gzip_file(src: Path, dst: Path) -> None:
    comp = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    with open(src, "rb") as f, open(dst, "wb") as out:
        while chunk := f.read(COPY_BUF):
            out.write(comp.compress(chunk))
        out.write(comp.flush())


def _layers(ctx: Path, tmp: Path, gzip: bool) -> Iterator[tuple[str, Path]]:
    """(diff_id, the member's file) per ``COPY``, in order; with ``gzip`` the next layer is
    written and compressed on a second thread while one is sent (zlib releases the GIL)."""
    lines = copy_lines(ctx)

    def make(k: int) -> tuple[str, Path]:
        plain = tmp / f"layer{k}.tar"
        diff_id = write_layer(ctx, *lines[k], plain)
        if not gzip:
            return diff_id, plain
        packed = tmp / f"layer{k}.tar.gz"
        _gzip_file(plain, packed)
        plain.unlink()
        return diff_id, packed

    with ThreadPoolExecutor(max_workers=2 if gzip else 1) as pool:
        futures = [pool.submit(make, k) for k in range(min(2, len(lines)))]
        for k in range(len(lines)):
            diff_id, member = futures[k].result()
            if k + 2 < len(lines):
                futures.append(pool.submit(make, k + 2))
            yield diff_id, member


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def load_context(ctx: Path, ref: str, env: dict[str, str], *, gzip: bool) -> str:
    """Load the image that ``docker build -t REF CTX`` would give into the daemon of ``env``;
    return its image ID (the config's digest). Temp files go in ``CTX/.load`` and are removed."""
    tmp = ctx / ".load"
    tmp.mkdir(exist_ok=True)
    proc = subprocess.Popen(["docker", "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stderr is not None
    diff_ids: list[str] = []
    history: list[dict[str, str]] = []
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                          copybufsize=COPY_BUF) as archive:
            for k, ((src, dst), (diff_id, member)) in enumerate(zip(copy_lines(ctx), _layers(ctx, tmp, gzip))):
                info = tarfile.TarInfo(f"{k:03d}/layer.tar")
                info.size = member.stat().st_size
                with open(member, "rb") as f:
                    archive.addfile(info, f)
                member.unlink()
                diff_ids.append(diff_id)
                history.append({"created": now, "created_by": f"/bin/sh -c #(nop) COPY {src} in {dst} "})
            config = json.dumps({
                "architecture": "amd64", "os": "linux", "created": now,
                "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
                "rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history,
            }, separators=(",", ":")).encode()
            image_id = "sha256:" + hashlib.sha256(config).hexdigest()
            _add_bytes(archive, f"{image_id[7:]}.json", config)
            _add_bytes(archive, "manifest.json", json.dumps([{
                "Config": f"{image_id[7:]}.json", "RepoTags": [ref],
                "Layers": [f"{k:03d}/layer.tar" for k in range(len(diff_ids))]}]).encode())
        proc.stdin.close()
    except BaseException:
        proc.kill()
        raise
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        err = proc.stderr.read(1 << 20)
        proc.wait()
        for left in tmp.iterdir():
            left.unlink()
        tmp.rmdir()
    if proc.returncode:
        raise RuntimeError(f"bench image load: docker load exited {proc.returncode}: {err.decode(errors='replace')}")
    return image_id


def main() -> int:  # pragma: no cover - by hand: python3 -m bench.imageload CTX REF [--gzip]
    import sys
    gzip = "--gzip" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--gzip"]
    print(load_context(Path(args[0]), args[1], dict(os.environ), gzip=gzip))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
