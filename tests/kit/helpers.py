"""Small helpers shared by the tests: run our CLIs, read what Docker holds.

Every test runs our programs through here: ``run_cli``/``start_cli`` (``python -m bundle|importer``
from this checkout), ``run_pyz``/``run_zipapp``/``start_pyz`` (a built ``bundle-import.pyz``, as a
user runs it). tests/test_architecture.py refuses a test file that spawns them itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _env(drop: tuple[str, ...], docker_host: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    """os.environ less the variables starting with a ``drop`` prefix (``("",)`` drops them all),
    plus DOCKER_HOST and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    env.update(extra or {})
    return env


def cli_command(module: str, *args: str, prefix: Sequence[str] = (), python: str | None = None) -> list[str]:
    """``[*prefix, python, -m, module, *args]``: the argv that runs one of our CLIs from source."""
    return [*prefix, python or sys.executable, "-m", module, *args]


def _cli_env(drop_env: tuple[str, ...], docker_host: str | None, env: dict[str, str] | None) -> dict[str, str]:
    return _env(drop_env, docker_host, {**(env or {}), "PYTHONPATH": str(REPO)})


def run_cli(module: str, *args: str, docker_host: str | None = None, check: bool = False,
            timeout: float = 900, env: dict[str, str] | None = None, drop_env: tuple[str, ...] = (),
            cwd: Path | None = None, input: str | None = None, prefix: Sequence[str] = (),
            python: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m bundle|importer ARGS`` from this checkout and capture its output (the one
    way the tests run a CLI from source). ``drop_env``: prefixes of variables not passed on (e.g.
    ``DOCKER_`` so that only the options choose the engine); ``env``: variables to set; ``input``:
    its stdin (else inherited); ``prefix``: a command it runs under (``timeout 5``, ``unshare
    --uts ...``, ``strace``); ``python``: another interpreter."""
    proc = subprocess.run(cli_command(module, *args, prefix=prefix, python=python), capture_output=True, text=True,
                          env=_cli_env(drop_env, docker_host, env), timeout=timeout, check=False, cwd=cwd,
                          input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_cli(module: str, *args: str, docker_host: str | None = None, env: dict[str, str] | None = None,
              drop_env: tuple[str, ...] = (), cwd: Path | None = None, prefix: Sequence[str] = (),
              python: str | None = None, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
              stdin: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """Start ``python -m bundle|importer ARGS`` from this checkout and return at once (a server, a
    run to interrupt); the caller waits for it or stops it by its pid. Arguments as for
    :func:`run_cli`; ``stdout``/``stderr``/``stdin`` as for :class:`subprocess.Popen` (text)."""
    return subprocess.Popen(cli_command(module, *args, prefix=prefix, python=python), stdout=stdout, stderr=stderr,
                            stdin=stdin, text=True, env=_cli_env(drop_env, docker_host, env), cwd=cwd)


def zipapp_command(pyz: Path, *args: str, python: str | None = None, flags: Sequence[str] = ("-I",)) -> list[str]:
    """``[python, -I, PYZ, *args]``: the argv that runs a built importer as a user does."""
    return [python or sys.executable, *flags, str(pyz), *args]


def run_zipapp(pyz: Path, *args: str, docker_host: str | None = None, timeout: float = 900,
               python: str | None = None, flags: Sequence[str] = ("-I",), env: dict[str, str] | None = None,
               drop_env: tuple[str, ...] = ("PYTHON",), cwd: Path | None = None, input: str | None = None,
               check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the importer zipapp ``pyz`` with ``args`` as they are (``--inventory``, ``copy SRC DST``,
    ``serve``, ``--version``): ``python3 -I PYZ ARGS``, no ``PYTHON*`` variables by default.
    ``flags``: the interpreter's own options (``-I -S``); ``drop_env=("",)`` passes only ``env``."""
    proc = subprocess.run(zipapp_command(pyz, *args, python=python, flags=flags), capture_output=True, text=True,
                          env=_env(drop_env, docker_host, env), timeout=timeout, check=False, cwd=cwd, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{pyz} {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_pyz(pyz: Path, *args: str, docker_host: str | None = None, env: dict[str, str] | None = None,
              drop_env: tuple[str, ...] = ("PYTHON",), python: str | None = None,
              stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
              stdin: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """Start the importer zipapp ``pyz`` with ``args`` and return at once (:func:`start_cli` for
    the zipapp)."""
    return subprocess.Popen(zipapp_command(pyz, *args, python=python), stdout=stdout, stderr=stderr, stdin=stdin,
                            text=True, env=_env(drop_env, docker_host, env))


def run_pyz(bundle: Path, *args: str, docker_host: str | None = None, timeout: float = 900,
            pyz: Path | None = None, python: str | None = None, env: dict[str, str] | None = None,
            drop_env: tuple[str, ...] = ("PYTHON",)) -> subprocess.CompletedProcess[str]:
    """Run a bundle's own importer the way a user does: ``python3 -I DIR/bundle-import.pyz BUNDLE``
    (the one way the tests import with the zipapp). ``bundle``: the folder, tar or parts index
    given to it; ``pyz``: the importer (default: the one in the folder ``bundle``); ``python``:
    another interpreter; ``env``/``drop_env`` as for :func:`run_zipapp`."""
    return run_zipapp(pyz or bundle / "bundle-import.pyz", str(bundle), *args, docker_host=docker_host,
                      timeout=timeout, python=python, env=env, drop_env=drop_env)


def docker_json(docker_host: str, *args: str) -> Any:
    out = subprocess.run(["docker", "-H", docker_host, *args], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return json.loads(out)


def image_facts(docker_host: str, ref: str) -> tuple[str, list[str]] | None:
    """(image ID, RootFS.Layers) of ``ref``, or None when Docker does not have it."""
    proc = subprocess.run(["docker", "-H", docker_host, "image", "inspect", ref], capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode != 0:
        return None
    doc = json.loads(proc.stdout)[0]
    return doc["Id"], list(doc["RootFS"]["Layers"])


def docker(docker_host: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "-H", docker_host, *args], capture_output=True, text=True,
                          check=check, timeout=600)


def forget(docker_host: str, *refs: str) -> None:
    """``docker image rm -f`` each of ``refs`` that Docker holds (the others are no error)."""
    for ref in refs:
        docker(docker_host, "image", "rm", "-f", ref, check=False)


def image_ids(docker_host: str) -> set[str]:
    out = docker(docker_host, "images", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}").stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


_STORES: dict[str, str] = {}


def image_store(docker_host: str) -> str:
    """'containerd' when this dockerd keeps images in containerd (ID = manifest digest), else 'classic'."""
    if docker_host not in _STORES:
        info = docker_json(docker_host, "info", "--format", "{{json .}}")
        pairs = info.get("DriverStatus") or []
        ctr = any(p[0] == "driver-type" and "containerd" in str(p[1]) for p in pairs if len(p) == 2)
        _STORES[docker_host] = "containerd" if ctr else "classic"
    return _STORES[docker_host]


def bundle_image_id(docker_host: str, image: dict) -> str:  # type: ignore[type-arg]
    """The ID ``docker image inspect`` shows for a bundle.json image loaded in full into this
    engine: the config digest on the classic store, the bundle's manifest digest on the containerd one."""
    key = "manifest" if image_store(docker_host) == "containerd" else "config"
    return str(image[key]["digest"])
