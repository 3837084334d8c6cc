"""Helpers for the signature, tamper, hostile-input and interruption tests (issue 4)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

from bundle.keys import generate_keypair, load_signing_key, sign_bundle

REPO = Path(__file__).resolve().parents[2]
_ERROR_RE = re.compile(r"^error\[([a-z0-9-]+)\]", re.MULTILINE)


def keypair(directory: Path, name: str, passphrase: bytes | None = None) -> tuple[Path, Path]:
    """(PREFIX.key, PREFIX.pub) made by the real keygen."""
    pair = generate_keypair(str(directory / name), passphrase)
    return Path(pair.private_path), Path(pair.public_path)


def sign(bundle: Path, key: Path, passphrase: bytes | None = None) -> str:
    return sign_bundle(str(bundle), load_signing_key(str(key), passphrase))


def regenerate_sums(bundle: Path) -> None:
    """What someone who edits a bundle does: SHA256SUMS made again from the files on disk."""
    lines = []
    for p in sorted(bundle.rglob("*")):
        rel = p.relative_to(bundle).as_posix()
        if p.is_file() and rel != "SHA256SUMS":
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {rel}\n")
    (bundle / "SHA256SUMS").write_text("".join(sorted(lines, key=lambda x: x.split("  ", 1)[1])))


def sums_accept(bundle: Path) -> bool:
    return subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=bundle,
                          capture_output=True, check=False).returncode == 0


def error_id(stderr: str) -> str | None:
    m = _ERROR_RE.search(stderr)
    return m.group(1) if m else None


def python38() -> str:
    """A Python 3.8 without the cryptography module (the oldest host the pyz supports)."""
    from tests.kit import engines

    pyenv = sorted(Path.home().glob(".pyenv/versions/3.8*/bin/python3.8"))
    for candidate in [*pyenv, Path(shutil.which("python3.8") or "/nonexistent")]:
        if candidate.exists() and "shims" not in str(candidate):
            return str(candidate)
    engines.unavailable("no Python 3.8 interpreter (the pyz's floor, and a host without `cryptography`)")


def old_python(minor: int) -> str:
    """A real Python 3.``minor`` older than the pyz's floor (3.6 on RHEL/Rocky 8 and Ubuntu 18.04,
    3.7 on Debian 10): pyenv's, installed with the machine; under CI=true a missing one fails."""
    from tests.kit import engines

    pyenv = sorted(Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
    for candidate in [*pyenv, Path(shutil.which(f"python3.{minor}") or "/nonexistent")]:
        if candidate.exists() and "shims" not in str(candidate):
            return str(candidate)
    engines.unavailable(f"no Python 3.{minor} interpreter (an older host the pyz must explain itself on)")


def copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


# ============================================================================ engine side

BASE_REF = "sectest/base:1"
APP_REF = "sectest/app:1"
SEC_REFS = (BASE_REF, APP_REF)


def build_sec_images(docker_host: str, busybox: str, root: Path) -> dict[str, str]:
    """Two small images FROM scratch (the second on top of the first); ref -> image ID."""
    from tests.kit import engines
    from tests.kit.imagegen import simple_context

    base = simple_context(root / "base", busybox, "trust nothing that crossed the gap\n")
    app = root / "app"
    app.mkdir()
    script = "echo app > /app && /bin/busybox dd if=/dev/urandom of=/blob bs=64k count=16"
    (app / "Dockerfile").write_text(f'FROM {BASE_REF}\nRUN ["/bin/busybox", "sh", "-c", "{script}"]\n')
    ids = {BASE_REF: engines.build_image(docker_host, base, BASE_REF)}
    ids[APP_REF] = engines.build_image(docker_host, app, APP_REF)
    return ids


def export_bundle(docker_host: str, out: Path, *refs: str, sign_key: Path | None = None) -> Path:
    from tests.kit.helpers import run_cli

    extra = ["--sign-key", str(sign_key)] if sign_key else []
    run_cli("bundle", "export", *(refs or SEC_REFS), "-o", str(out), *extra, docker_host=docker_host, check=True)
    return out


def remove_images(docker_host: str, *refs: str) -> None:
    from tests.kit.helpers import docker

    for ref in refs or SEC_REFS:
        docker(docker_host, "image", "rm", ref, check=False)


def engine_listing(docker_host: str) -> list[str]:
    """`docker images -a` in full (IDs, names): what "the engine is unchanged" compares."""
    from tests.kit.helpers import docker

    out = docker(docker_host, "images", "-a", "--no-trunc", "--format",
                 "{{.ID}} {{.Repository}}:{{.Tag}} {{.Size}}").stdout
    return sorted(line for line in out.splitlines() if line.strip())


def staging_tags(docker_host: str) -> list[str]:
    return [line for line in engine_listing(docker_host) if "sneakernet-staging/" in line]


def tagged_images_verify(docker_host: str, bundle: Path) -> list[str]:
    """Every bundle ref the engine has tagged must be exactly what bundle.json pins; returns
    the refs present (the invariant of a killed import). The ID is the store's own: the config
    digest on Docker's classic store, the bundle's manifest digest on its containerd store."""
    from tests.kit.helpers import bundle_image_id, image_facts

    doc = json.loads((bundle / "bundle.json").read_text())
    present = []
    for image in doc["images"]:
        for ref in image["refs"]:
            facts = image_facts(docker_host, ref)
            if facts is None:
                continue
            assert facts == (bundle_image_id(docker_host, image), [x["diffId"] for x in image["layers"]]), ref
            present.append(ref)
    return present
