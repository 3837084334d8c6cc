"""Files carried as OCI artifacts (schema 3.6, docs/files.md): a small model folder, a bundle of
it (exported through the real CLI), and the edits a hostile publisher would make to its
bundle.json (re-pinned in SHA256SUMS, so only the check under test can see them)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

from tests.kit import engines
from tests.kit.helpers import run_cli
from tests.kit.supplykit import TRIXIE_TOOLS
from tests.kit.trustkit import regenerate_sums

MODEL_REF = "models/llama:3.1"
#: the model folder's files, relative path -> mode (the weights: ``mib`` MiB of random bytes)
MODEL_FILES = {"model.safetensors": 0o644, "config.json": 0o644, "tokenizer/tokenizer.json": 0o600,
               "tokenizer/special_tokens_map.json": 0o644, "README.md": 0o644, "scripts/run.sh": 0o755,
               "empty.txt": 0o644}


def model_dir(root: Path, *, mib: int = 3, seed: int = 1) -> Path:
    """A model folder with nested folders: weights of ``mib`` MiB, configs, docs, a script, an empty file."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, mode in MODEL_FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel == "model.safetensors":
            path.write_bytes(os.urandom(mib * 1024 * 1024 - 1) + bytes([seed]))
        elif rel != "empty.txt":
            path.write_text(json.dumps({"file": rel, "seed": seed}) + "\n")
        else:
            path.write_bytes(b"")
        path.chmod(mode)
    return root


def export_files(out: Path, *args: str, ref: str = MODEL_REF) -> Path:
    """``bundle export ARGS --artifact-ref REF -o OUT -q`` through the CLI; must succeed."""
    run_cli("bundle", "export", *args, "--artifact-ref", ref, "-o", str(out), "-q", check=True)
    return out


def model_bundle(root: Path, *, mib: int = 3) -> tuple[Path, Path]:
    """(the model folder, its bundle exported with ``--files DIR --model``)."""
    src = model_dir(root / "model", mib=mib)
    return src, export_files(root / "model.bundle", "--files", str(src), "--model")


def edit_bundle_json(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """``change`` bundle.json's document, then SHA256SUMS made again (what a hostile publisher does)."""
    doc = json.loads((bundle / "bundle.json").read_text())
    change(doc)
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(bundle)


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every regular file below ``root`` (relative path -> bytes, permission bits); links refused."""
    out: dict[str, tuple[bytes, int]] = {}
    for path in sorted(root.rglob("*")):
        assert not path.is_symlink(), path
        if path.is_file():
            out[path.relative_to(root).as_posix()] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return out


def oras() -> str:
    """The real oras (PATH, else Debian 13's 1.2 in /opt/sneakernet/trixie-tools); under CI=true a
    missing one fails the test (engines.unavailable)."""
    found = shutil.which("oras") or (str(TRIXIE_TOOLS / "usr/bin/oras") if (TRIXIE_TOOLS / "usr/bin/oras").is_file()
                                     else None)
    if found is None:
        engines.unavailable(f"oras is not installed (docker/scripts/install-deps.sh fetches Debian 13's into "
                            f"{TRIXIE_TOOLS})")
    return str(found)


def run_oras(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``oras ARGS`` with its own HOME (no login or cache of the user's); must succeed."""
    proc = subprocess.run([oras(), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HOME": str(home), "DOCKER_CONFIG": str(home / ".docker")})
    assert proc.returncode == 0, f"oras {' '.join(args)}: {proc.stderr}"
    return proc


def same_bytes(src: Path, pulled: Path) -> None:
    """``pulled`` holds exactly the files of ``src``, byte for byte (oras keeps no mode)."""
    assert {k: v[0] for k, v in tree(pulled).items()} == {k: v[0] for k, v in tree(src).items()}


def sharded_model(root: Path, *, shards: int = 3, kib: int = 256, changed: tuple[int, ...] = (),
                  seed: int = 1) -> Path:
    """A model of ``shards`` weight files of ``kib`` KiB each (``model-0000N-of-0000M.safetensors``),
    its config and index; ``changed``: the shards (1-based) whose bytes differ (a new version)."""
    root.mkdir(parents=True, exist_ok=True)
    names = [f"model-{n:05d}-of-{shards:05d}.safetensors" for n in range(1, shards + 1)]
    for n, name in enumerate(names, 1):  # deterministic, incompressible as weights are: the same in every version
        (root / name).write_bytes(hashlib.shake_256(f"{seed} {n} {n in changed}".encode()).digest(kib * 1024))
    (root / "config.json").write_text(json.dumps({"shards": shards}) + "\n")
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}) + "\n")
    return root


def sha256sum_c(src: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """``sha256sum -c`` in ``target`` of every file of ``src`` (coreutils, as a user checks it)."""
    sums = subprocess.run(["sha256sum", *sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())],
                          cwd=src, capture_output=True, text=True, check=True).stdout
    return subprocess.run(["sha256sum", "-c", "--strict", "-"], cwd=target, input=sums, capture_output=True,
                          text=True)
