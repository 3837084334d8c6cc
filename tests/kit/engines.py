"""Helpers for tests that need real container engines.

Private dockerd instances are started and stopped through ``docker/scripts/dockerd.sh``
(loopback only: ``--bridge=none --iptables=false``; state under ``$SNEAKERNET_RUN``,
default ``/tmp/sneakernet-run``).

Missing tools follow one policy, implemented by :func:`unavailable`: under ``CI=true``
the test FAILS (CI must have run ``docker/scripts/install-deps.sh``); elsewhere it is
skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "docker" / "scripts"
DOCKERD_SH = SCRIPTS / "dockerd.sh"
REGISTRY_SH = SCRIPTS / "registry.sh"
INSTALL_STEP = "bash docker/scripts/install-deps.sh (as root)"

# Which Debian package provides a tool (for the messages).
APT_PACKAGE = {
    "docker": "docker.io",
    "dockerd": "docker.io",
    "runc": "runc",
    "containerd": "containerd",
    "skopeo": "skopeo",
    "zstd": "zstd",
    "busybox": "busybox-static",
    "docker-registry": "docker-registry",
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "podman": "podman",
}

# Environment variables that would redirect the docker CLI away from ``-H``/DOCKER_HOST.
_DOCKER_ENV_DROP = ("DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


class EngineError(RuntimeError):
    """An engine helper command failed; the message carries its output."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason: str) -> NoReturn:
    """Fail under CI=true, skip otherwise."""
    if in_ci():
        pytest.fail(
            f"{reason}\n(CI=true: this must not be skipped; run {INSTALL_STEP})", pytrace=False
        )
    pytest.skip(reason)


def require(tool: str) -> str:
    """Absolute path of ``tool`` (searched in PATH plus the sbin dirs), or fail/skip."""
    path = shutil.which(tool)
    if path is None:
        extra = os.pathsep.join(("/usr/local/sbin", "/usr/sbin", "/sbin"))
        path = shutil.which(tool, path=extra)
    if path is None:
        pkg = APT_PACKAGE.get(tool, tool)
        unavailable(f"{tool!r} not found (Debian package {pkg}; install with {INSTALL_STEP})")
    return path


# Docker's two image stores and the session fixture that starts a dockerd with each
DOCKER_STORES = {"classic": "docker_host", "containerd": "docker_host_ctrstore"}

TRIXIE_DOCKER = Path(os.environ.get("SNEAKERNET_TRIXIE_DOCKER", "/opt/sneakernet/trixie-docker"))


def require_trixie_docker() -> Path:
    """The folder holding Debian 13's dockerd/containerd (install-deps.sh), or fail/skip."""
    for rel in ("usr/sbin/dockerd", "usr/bin/containerd", "usr/bin/containerd-shim-runc-v2"):
        if not os.access(TRIXIE_DOCKER / rel, os.X_OK):
            unavailable(
                f"no {TRIXIE_DOCKER / rel} (Debian 13's docker.io/containerd for the containerd "
                f"image store; install with {INSTALL_STEP})"
            )
    return TRIXIE_DOCKER


def ctrstore_ctr(docker_host: str) -> list[str]:
    """``ctr`` argv for the containerd a --containerd-store dockerd manages (namespace moby)."""
    sock = docker_host.removeprefix("unix://")
    exec_root = Path(sock).parent / "exec"
    return [
        str(TRIXIE_DOCKER / "usr/bin/ctr"),
        "--address",
        str(exec_root / "containerd" / "containerd.sock"),
        "--namespace",
        "moby",
    ]


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        unavailable(f"{what} needs root (running as uid {os.geteuid()})")


def _run(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise EngineError(f"timed out after {timeout}s: {' '.join(argv)}") from e
    if proc.returncode != 0:
        raise EngineError(
            f"command failed (rc={proc.returncode}): {' '.join(argv)}\n"
            f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
        )
    return proc


# --- private dockerd instances ---------------------------------------------------------


def start_dockerd(name: str, *extra: str, fresh: bool = False) -> str:
    """Start (or reuse) private dockerd ``name``; return its DOCKER_HOST url.

    ``extra`` are additional dockerd arguments (e.g. ``"--storage-driver", "vfs"``).
    ``fresh=True`` first stops the instance and wipes its state directory.
    """
    if fresh:
        _run(["bash", str(DOCKERD_SH), "purge", name], timeout=120)
    url = _run(["bash", str(DOCKERD_SH), "start", name, *extra], timeout=120).stdout.strip()
    if not url.startswith("unix://"):
        raise EngineError(f"dockerd.sh start {name} printed {url!r}, expected a unix:// url")
    return url


def stop_dockerd(name: str, *, purge: bool = False) -> None:
    """Stop dockerd ``name`` by its pidfile; ``purge=True`` also removes its state dir."""
    _run(["bash", str(DOCKERD_SH), "purge" if purge else "stop", name], timeout=120)


def dockerd_dir(name: str) -> Path:
    run = Path(os.environ.get("SNEAKERNET_RUN", "/tmp/sneakernet-run"))
    return run.absolute() / f"dockerd-{name}"


def dockerd_log_tail(name: str, lines: int = 30) -> str:
    try:
        text = (dockerd_dir(name) / "dockerd.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_registry(name: str, port: int) -> str:
    """Start (or reuse) a private docker-registry on 127.0.0.1:port; return 'host:port'."""
    return _run(["bash", str(REGISTRY_SH), "start", name, str(port)], timeout=60).stdout.strip()


def stop_registry(name: str, *, purge: bool = False) -> None:
    _run(["bash", str(REGISTRY_SH), "purge" if purge else "stop", name], timeout=60)


@dataclass
class Registry:
    """A private docker-registry the tests started on 127.0.0.1."""

    name: str
    port: int
    tls: bool = False  # https (registry.sh with SNEAKERNET_REGISTRY_TLS_CERT/_KEY)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def private_registry(name: str, port: int = 0, *, htpasswd: Path | None = None,
                     tls: tuple[Path, Path] | None = None,
                     client_ca: tuple[Path, Path, Path] | None = None) -> Iterator[Registry]:
    """A fresh private docker-registry ``name`` on 127.0.0.1 (``port``; 0: a free one), with basic
    auth from ``htpasswd`` when given and HTTPS with ``tls`` (certificate, key: PEM) when given;
    ``client_ca`` (with ``tls``): (CA, a client certificate and key it signed) mutual TLS, every
    client must present a certificate that CA signed (registry.sh probes with the pair);
    purged when the block ends. Fails under CI=true (skips elsewhere) when it cannot start."""
    require("docker-registry")
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
    if htpasswd is not None:
        os.environ["SNEAKERNET_REGISTRY_HTPASSWD"] = str(htpasswd)
    if tls is not None:
        os.environ["SNEAKERNET_REGISTRY_TLS_CERT"], os.environ["SNEAKERNET_REGISTRY_TLS_KEY"] = map(str, tls)
    if client_ca is not None:
        (os.environ["SNEAKERNET_REGISTRY_TLS_CLIENT_CA"], os.environ["SNEAKERNET_REGISTRY_TLS_PROBE_CERT"],
         os.environ["SNEAKERNET_REGISTRY_TLS_PROBE_KEY"]) = map(str, client_ca)
    try:
        stop_registry(name, purge=True)  # what a killed run left under this name
        start_registry(name, port)
    except EngineError as e:
        unavailable(f"could not start the private docker-registry {name}: {e}")
    finally:
        for var in ("SNEAKERNET_REGISTRY_HTPASSWD", "SNEAKERNET_REGISTRY_TLS_CERT", "SNEAKERNET_REGISTRY_TLS_KEY",
                    "SNEAKERNET_REGISTRY_TLS_CLIENT_CA", "SNEAKERNET_REGISTRY_TLS_PROBE_CERT",
                    "SNEAKERNET_REGISTRY_TLS_PROBE_KEY"):
            os.environ.pop(var, None)
    try:
        yield Registry(name, port, tls=tls is not None)
    finally:
        stop_registry(name, purge=True)


# --- docker CLI ------------------------------------------------------------------------


def docker_env(docker_host: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DOCKER_ENV_DROP}
    env["DOCKER_HOST"] = docker_host
    env["DOCKER_BUILDKIT"] = "0"  # daemon is Debian's 20.10; no buildx: classic builder
    env["DOCKER_CLI_HINTS"] = "false"
    return env


def docker(docker_host: str, *args: str, timeout: float = 300) -> str:
    """Run ``docker ARGS`` against ``docker_host``; return stdout (EngineError on failure)."""
    return _run([require("docker"), *args], env=docker_env(docker_host), timeout=timeout).stdout


def build_image(docker_host: str, context_dir: str | os.PathLike[str], tag: str) -> str:
    """``docker build --network none -t TAG DIR`` (classic builder); return the image ID."""
    docker(
        docker_host, "build", "--network", "none", "-t", tag, os.fspath(context_dir), timeout=600
    )
    image_id = docker(docker_host, "image", "inspect", "--format", "{{.Id}}", tag).strip()
    if not image_id.startswith("sha256:"):
        raise EngineError(f"unexpected image id {image_id!r} for {tag}")
    return image_id


# --- busybox ---------------------------------------------------------------------------


def is_static_elf(path: str | os.PathLike[str]) -> bool:
    """True for an ELF executable without a PT_INTERP program header (statically linked)."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            return False
        is64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        if is64:
            hdr = f.read(48)
            (phoff,) = struct.unpack_from(end + "Q", hdr, 16)
            phentsize, phnum = struct.unpack_from(end + "HH", hdr, 38)
        else:
            hdr = f.read(36)
            (phoff,) = struct.unpack_from(end + "I", hdr, 12)
            phentsize, phnum = struct.unpack_from(end + "HH", hdr, 26)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            (p_type,) = struct.unpack(end + "I", f.read(4))
            if p_type == 3:  # PT_INTERP
                return False
    return True


def static_busybox() -> str:
    """Path of a statically linked busybox (Debian busybox-static: /bin/busybox)."""
    for cand in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.isfile(cand) and is_static_elf(cand):
            return cand
    unavailable(
        f"no statically linked busybox at /bin/busybox (Debian package busybox-static; "
        f"install with {INSTALL_STEP})"
    )



# --- skopeo (an independent reader and copier of images) ----------------------------------


def skopeo(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``skopeo --insecure-policy ARGS``; with ``check``, an AssertionError (its stderr) unless it exits 0."""
    proc = subprocess.run([require("skopeo"), "--insecure-policy", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert not check or proc.returncode == 0, proc.stderr
    return proc


def push_from_docker(docker_host: str, image: str, dest: str, *extra: str) -> None:
    """Copy ``image`` from the dockerd at ``docker_host`` to ``docker://DEST`` (plain HTTP) with skopeo."""
    skopeo("copy", "--src-daemon-host", docker_host, "--dest-tls-verify=false", *extra, f"docker-daemon:{image}",
           f"docker://{dest}")


# --- credentials ---------------------------------------------------------------------


def bcrypt_htpasswd(folder: Path, user: str, password: str) -> Path:
    """An htpasswd file with one bcrypt line (what distribution's htpasswd auth reads), from libc's crypt()."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    except (ImportError, AttributeError, ValueError) as e:
        unavailable(f"no bcrypt to write an htpasswd file ({e})")
    if not hashed or not hashed.startswith("$2"):
        unavailable("this libc's crypt() has no bcrypt")
    htpasswd = folder / "htpasswd"
    htpasswd.write_text(f"{user}:{hashed}\n")
    return htpasswd
