"""Build the test images FROM scratch in a private dockerd (busybox-static, files made here).

``tricky:base`` holds what breaks naive exporters: hardlinks, absolute/relative/dangling
symlinks, a file deleted in a later layer (whiteout), a directory replaced in a later layer
(opaque whiteout on overlay2), a metadata-only layer, paths over 100 and 255 bytes, non-ASCII
names, setuid and sticky bits, empty files and a large random file. ``tricky:child`` adds a
layer on top, so two images share their base layers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

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

CHILD_DOCKERFILE = """\
FROM tricky:base
RUN echo child > /child
"""

BIG_SIZE = int(os.environ.get("SNEAKERNET_TEST_BIG_MB", "200")) * 1024 * 1024


def write_contexts(root: Path, busybox: str) -> tuple[Path, Path]:
    base = root / "base"
    child = root / "child"
    base.mkdir(parents=True)
    child.mkdir(parents=True)
    shutil.copy(busybox, base / "busybox")
    os.chmod(base / "busybox", 0o755)
    with open(base / "big.bin", "wb") as f:
        left = BIG_SIZE
        while left:
            n = min(left, 8 * 1024 * 1024)
            f.write(os.urandom(n))
            left -= n
    (base / "Dockerfile").write_text(BASE_DOCKERFILE)
    (child / "Dockerfile").write_text(CHILD_DOCKERFILE)
    return base, child


def simple_context(root: Path, busybox: str, text: str) -> Path:
    """A one-layer image holding busybox and /msg with ``text``."""
    root.mkdir(parents=True)
    shutil.copy(busybox, root / "busybox")
    (root / "msg").write_text(text)
    (root / "Dockerfile").write_text("FROM scratch\nCOPY busybox /bin/busybox\nCOPY msg /msg\n")
    return root
