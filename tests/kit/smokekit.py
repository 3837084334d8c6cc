"""Helpers for the smoke-suite tests: the receipt schema, torch, the mounts that give a FROM
scratch busybox image the host's Python and torch (read-only), and running the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from tests.kit import engines
from tests.kit.helpers import REPO, run_cli

SCHEMA = json.loads((REPO / "schemas" / "receipt" / "qualification-v1.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)

# A FROM scratch image: busybox, /tmp for inductor, /etc/passwd for getpass, /lib symlinks into
# the /usr the test mounts; python3 on PATH comes from the mounted interpreter prefix.
DOCKERFILE = """\
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "sh", "-c", "set -e; B=/bin/busybox; $B mkdir -p /tmp /root /etc /usr; $B chmod 1777 /tmp; \
$B ln -s usr/lib /lib; $B ln -s usr/lib64 /lib64; echo root:x:0:0:root:/root:/bin/sh > /etc/passwd; \
echo root:x:0: > /etc/group"]
ENV PATH={bindir}:/usr/local/bin:/usr/bin:/bin
"""


IMAGE = "smoke-torch:test"


def build_smoke_image(docker_host: str, busybox: str, ctx: Path) -> str:
    """Build the FROM scratch smoke image (busybox; Python and torch come as --volume mounts)."""
    require_torch()
    (ctx / "busybox").write_bytes(Path(busybox).read_bytes())
    (ctx / "busybox").chmod(0o755)
    (ctx / "Dockerfile").write_text(DOCKERFILE.format(bindir=python_bindir()))
    engines.build_image(docker_host, ctx, IMAGE)
    return IMAGE


def schema_errors(receipt: Any) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in VALIDATOR.iter_errors(receipt)]


def require_torch() -> Path:
    """torch's package folder; FAIL under CI=true when torch is missing (install-deps.sh installs it)."""
    try:
        import torch
    except ImportError:
        engines.unavailable("torch is not installed (pip install torch==2.13.0; docker/scripts/install-deps.sh)")
    return Path(torch.__file__).resolve().parent


def host_mounts() -> list[str]:
    """--volume values that bring this Python, its torch and a C++ compiler into the image."""
    torch_dir = require_torch()
    wanted = [Path("/usr"), Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), torch_dir.parent]
    keep: list[Path] = []
    for p in sorted(set(wanted), key=lambda x: len(x.parts)):
        if not any(p == k or k in p.parents for k in keep):
            keep.append(p)
    return [f"--volume={p}:{p}" for p in keep]


def python_bindir() -> str:
    return str(Path(sys.executable).resolve().parent)


def python_without_torch() -> str:
    """Another Python 3.8+ of this machine that cannot import torch (pyenv's 3.8 here)."""
    home = Path.home()
    candidates = sorted(home.glob(".pyenv/versions/3.[89]*/bin/python3.[89]"))
    for c in candidates:
        proc = subprocess.run([str(c), "-c", "import torch"], capture_output=True, check=False, timeout=120)
        if proc.returncode != 0:
            return str(c.resolve())
    engines.unavailable("no Python 3.8/3.9 without torch on this machine (pyenv) for the missing-torch case")


def smoke(*args: str, docker_host: str | None = None,
          timeout: float = 900) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run ``python -m importer smoke ARGS``; return the process and the receipt it printed (--json)."""
    proc = run_cli("importer", "smoke", *args, docker_host=docker_host, timeout=timeout)
    doc = None
    if "--json" in args and proc.stdout.strip():
        doc = json.loads(proc.stdout)
    return proc, doc


def gate(receipt: Any, name: str) -> Any:
    return next(g for g in receipt["gates"] if g["name"] == name)


def no_smoke_containers(docker_host: str) -> bool:
    out = subprocess.run(["docker", "-H", docker_host, "ps", "-a", "--format", "{{.Names}}"], capture_output=True,
                         text=True, check=True, timeout=60, env={**os.environ}).stdout
    return not [n for n in out.split() if n.startswith("sneakernet-smoke-")]
