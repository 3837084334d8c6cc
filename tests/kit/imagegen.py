"""Build the test images FROM scratch in a private dockerd (busybox-static, files made here).

``tricky:base`` holds what breaks naive exporters: hardlinks, absolute/relative/dangling
symlinks, a file deleted in a later layer (whiteout), a directory replaced in a later layer
(opaque whiteout on overlay2), a metadata-only layer, paths over 100 and 255 bytes, non-ASCII
names, setuid and sticky bits, empty files and a large random file. ``tricky:child`` adds a
layer on top, so two images share their base layers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

LONG_DIR = "/data/" + "/".join(["d" * 60] * 3)  # > 100 bytes
LONG_FILE = "f" * 200  # full path > 255 bytes
UNICODE_NAME = "ünïcødé-файл-文件.txt"

BASE_DOCKERFILE = f"""\
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY big.bin /big.bin
RUN set -e; mkdir -p /data && cd /data && echo hello > hl-src && ln hl-src hl-dst \\
 && ln -s /data/hl-src abs-link && ln -s hl-src rel-link && ln -s /nonexistent/target dangling \\
 && echo s > setuid && chmod 4755 setuid && mkdir sticky && chmod 1777 sticky && : > empty \\
 && mkdir -p gone-dir/sub && echo x > gone-dir/sub/f && echo bye > gone-file \\
 && mkdir -p {LONG_DIR} && echo long > {LONG_DIR}/{LONG_FILE} \\
 && echo unicode > '/data/{UNICODE_NAME}'
RUN rm /data/gone-file
RUN rm -rf /data/gone-dir && mkdir /data/gone-dir && echo new > /data/gone-dir/new
RUN chmod 600 /data/hl-src
ENV SNEAKERNET_TEST=1
"""

CHILD_FILE = "child"  # the child's one layer adds /child holding "child\n"
CHILD_DOCKERFILE = f"""\
FROM {{base}}
RUN echo child > /{CHILD_FILE}
"""

BIG_SIZE = int(os.environ.get("SNEAKERNET_TEST_BIG_MB", "200")) * 1024 * 1024


def write_contexts(root: Path, busybox: str, *, big_size: int = BIG_SIZE,
                   base_tag: str = "tricky:base") -> tuple[Path, Path]:
    """The contexts of ``tricky:base`` (with ``big_size`` random bytes in /big.bin) and of its
    child, which is built FROM ``base_tag`` (the tag the caller gives the base)."""
    base = root / "base"
    child = root / "child"
    base.mkdir(parents=True)
    child.mkdir(parents=True)
    shutil.copy(busybox, base / "busybox")
    os.chmod(base / "busybox", 0o755)
    with open(base / "big.bin", "wb") as f:
        left = big_size
        while left:
            n = min(left, 8 * 1024 * 1024)
            f.write(os.urandom(n))
            left -= n
    (base / "Dockerfile").write_text(BASE_DOCKERFILE)
    (child / "Dockerfile").write_text(CHILD_DOCKERFILE.format(base=base_tag))
    return base, child


def layered_context(root: Path, *, busybox: str | None = None, files: Mapping[str, bytes | str] | None = None,
                    base: str = "scratch", steps: Sequence[str] = ()) -> Path:
    """A build context at ``root``: ``FROM base``, then busybox at /bin/busybox when given, then one
    ``COPY`` layer per entry of ``files`` (path in the image -> its content), then ``steps`` (more
    Dockerfile lines, e.g. ``RUN ["/bin/busybox", "--install", "-s", "/bin"]``). Build it with
    ``engines.build_image``; a test never writes a Dockerfile itself."""
    root.mkdir(parents=True)
    lines = [f"FROM {base}"]
    if busybox is not None:
        shutil.copy(busybox, root / "busybox")
        os.chmod(root / "busybox", 0o755)
        lines.append("COPY busybox /bin/busybox")
    for n, (dest, content) in enumerate((files or {}).items()):
        name = f"f{n}-{PurePosixPath(dest).name}"
        data = content.encode() if isinstance(content, str) else content
        (root / name).write_bytes(data)
        lines.append(f"COPY {name} {dest}")
    lines += steps
    (root / "Dockerfile").write_text("\n".join(lines) + "\n")
    return root


def simple_context(root: Path, busybox: str, text: str) -> Path:
    """A one-layer image holding busybox and /msg with ``text``."""
    return layered_context(root, busybox=busybox, files={"/msg": text})


def base_and_update(docker_host: str, busybox: str, root: Path, repo: str, *, weights: int = 3 << 20,
                    code: str = "print('week 2')\n" * 100) -> tuple[str, str]:
    """Build ``REPO:1`` (busybox + ``weights`` random bytes in /w/weights.bin) and ``REPO:2``
    (``REPO:1`` + /app/code.py holding ``code``, one small layer on top) in ``docker_host``: the
    base and weekly update of the delta tests. Their references."""
    from tests.kit import engines

    one, two = f"{repo}:1", f"{repo}:2"
    engines.build_image(docker_host, layered_context(root / "a", busybox=busybox,
                                                     files={"/w/weights.bin": os.urandom(weights)}), one)
    engines.build_image(docker_host, layered_context(root / "b", base=one, files={"/app/code.py": code}), two)
    return one, two


# ============================== CUDA base images (docs/gpu-fit.md): their env and files, no CUDA
#: the brands NVIDIA's nvidia/cuda base images list in NVIDIA_REQUIRE_CUDA's driver-branch groups
CUDA_BRANDS = ("tesla", "unknown", "nvidia", "nvidiartx", "vapps", "vpc", "vcs", "vws", "cloudgaming", "quadro",
               "quadrortx", "titan", "titanrtx", "geforce", "geforcertx")


def cuda_require(cuda: str, branches: tuple[int, ...]) -> str:
    """NVIDIA_REQUIRE_CUDA as the base images write it: ``cuda>=12.4`` OR any brand on an older
    driver branch the image's compat package serves (``brand=tesla,driver>=535,driver<536``)."""
    major_minor = ".".join(cuda.split(".")[:2])
    groups = [f"brand={b},driver>={n},driver<{n + 1}" for n in branches for b in CUDA_BRANDS]
    return " ".join([f"cuda>={major_minor}", *groups])


#: nvidia/cuda:<tag> -> (CUDA_VERSION, driver branches in NVIDIA_REQUIRE_CUDA, compat libcuda version)
CUDA_IMAGES = {
    "12.4.1-runtime-ubuntu22.04": ("12.4.1", (470, 525, 535), "550.54.15"),
    "12.8.1-runtime-ubuntu24.04": ("12.8.1", (470, 525, 535, 550, 560, 565), "570.124.06"),
    "13.0.0-runtime-ubuntu24.04": ("13.0.0", (535, 550, 570), "580.65.06"),
    "11.8.0-runtime-ubuntu22.04": ("11.8.0", (450, 470, 510, 515), "520.61.05"),
}


def cuda_env(tag: str) -> list[str]:
    """The CUDA-related ``ENV`` lines of ``nvidia/cuda:<tag>``, as ``K=V``."""
    version, branches, _ = CUDA_IMAGES[tag]
    mm = version.rsplit(".", 1)[0].replace(".", "-")
    return [f"NVIDIA_REQUIRE_CUDA={cuda_require(version, branches)}", f"NV_CUDA_COMPAT_PACKAGE=cuda-compat-{mm}",
            f"CUDA_VERSION={version}", "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
            "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]


def cuda_context(root: Path, busybox: str, tag: str, *, compat: bool = True, torch_cuda: str | None = None,
                 extra_env: tuple[str, ...] = ()) -> Path:
    """An image with ``nvidia/cuda:<tag>``'s env, its ``/usr/local/cuda-X.Y/compat/libcuda.so.N``
    (empty files: only the names matter) and, when asked, a ``torch/version.py`` in a later layer."""
    version, _, lib = CUDA_IMAGES[tag]
    mm = version.rsplit(".", 1)[0]
    root.mkdir(parents=True)
    shutil.copy(busybox, root / "busybox")
    lines = ["FROM scratch", "COPY busybox /bin/busybox"]
    lines += [f'ENV {k}="{v}"' for k, v in (e.split("=", 1) for e in (*cuda_env(tag), *extra_env))]
    if compat:
        folder = root / "compat"
        folder.mkdir()
        (folder / f"libcuda.so.{lib}").write_bytes(b"\x7fELF")
        (folder / "libcuda.so.1").write_bytes(b"\x7fELF")
        lines.append(f"COPY compat/ /usr/local/cuda-{mm}/compat/")
    if torch_cuda:
        torch = root / "torch"
        torch.mkdir()
        (torch / "version.py").write_text("from typing import Optional\n\n"
                                          f"__version__ = '2.5.1+cu{torch_cuda.replace('.', '')}'\n"
                                          f"debug = False\ncuda: Optional[str] = '{torch_cuda}'\n"
                                          "git_version = 'a8d6afb511a69687bbb2b7e88a3cf67917e1697e'\n"
                                          "hip: Optional[str] = None\n")
        lines.append("COPY torch/ /usr/local/lib/python3.11/dist-packages/torch/")
    (root / "Dockerfile").write_text("\n".join(lines) + "\n")
    return root


# ============================== odd images a host holds besides the bundle (issue 38)
def zero_layer_archive(path: Path, repo: str = "odd/zero") -> dict[str, str]:
    """A docker-archive at ``path`` of two images with no layers (an empty ``Layers`` list), one
    tagged ``REPO:1`` and one untagged: for ``podman load`` and ``ctr images import`` (``docker
    save`` refuses such an image: "empty export - not implemented"). Their IDs (config digests)."""
    import hashlib
    import io
    import json
    import tarfile

    ids: dict[str, str] = {}
    manifest = []
    with tarfile.open(path, "w") as tar:
        for key, tags in (("zero", [f"{repo}:1"]), ("dangling", [])):
            config = json.dumps({"architecture": "amd64", "os": "linux",
                                 "config": {"Labels": {"sneakernet.odd": key}},
                                 "rootfs": {"type": "layers", "diff_ids": []},
                                 "history": [{"created_by": f"LABEL sneakernet.odd={key}", "empty_layer": True}]},
                                sort_keys=True).encode()
            hexdigest = hashlib.sha256(config).hexdigest()
            info = tarfile.TarInfo(f"{hexdigest}.json")
            info.size = len(config)
            tar.addfile(info, io.BytesIO(config))
            manifest.append({"Config": f"{hexdigest}.json", "RepoTags": tags or None, "Layers": []})
            ids[key] = f"sha256:{hexdigest}"
        raw = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    return ids


def odd_images(docker_host: str, root: Path, repo: str = "odd/zero") -> dict[str, str]:
    """Build in ``docker_host`` what once broke a delta import and an inventory: ``REPO:1``, an
    image with no layers (``FROM scratch`` plus a ``LABEL``: its RootFS has no Layers), and a
    dangling one (``REPO:1`` built before over another label, its tag taken since). Returns their
    IDs: {"zero": ..., "dangling": ...}."""
    from tests.kit import engines

    dangling = engines.build_image(docker_host, layered_context(root / "odd-1", steps=["LABEL sneakernet.odd=1"]),
                                   f"{repo}:1")
    zero = engines.build_image(docker_host, layered_context(root / "odd-2", steps=["LABEL sneakernet.odd=2"]),
                               f"{repo}:1")
    assert zero != dangling
    return {"zero": zero, "dangling": dangling}
