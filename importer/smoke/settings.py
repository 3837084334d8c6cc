"""Per-job settings of a smoke run (the AstrAI runtime model): selected GPUs, job-scoped
environment variables, time limits, gates; parsed and checked before anything runs."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from importer.engines.dockerclient import docker_host_url
from importer.errors import UsageError
from importer.sinks.choose import OPTION_ENGINE, check_own_options, implied_engine
from importer.smoke.worker.protocol import FAULTS, SELECTABLE

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: isdigit() also takes superscripts, int() other scripts' digits

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Applied unless the job sets them: NCCL RAS (on by default since NCCL 2.24) has crashed
#: ranks with SIGSEGV at exit.
DEFAULT_ENV = {"NCCL_RAS_ENABLE": "0"}
DEFAULT_TIMEOUT = 900.0
DEFAULT_RANK_TIMEOUT = 300.0


class SmokeConfigError(UsageError):
    """The smoke run could not be set up (settings, image, engine): exit 2."""

    reference = "smoke-config"


@dataclass
class SmokeSettings:
    device: str = "cuda"
    no_container: bool = False
    gpus: Optional[List[int]] = None
    env: Dict[str, str] = field(default_factory=dict)  # job-scoped, from --env-file then --env
    restart: bool = False
    timeout: float = DEFAULT_TIMEOUT
    rank_timeout: float = DEFAULT_RANK_TIMEOUT
    nproc: int = 0
    gates: List[str] = field(default_factory=lambda: list(SELECTABLE))
    fault: Optional[str] = None
    fault_rank: int = 0
    volumes: List[Tuple[str, str]] = field(default_factory=list)
    python: Optional[str] = None  # default: python3 in the image, sys.executable without a container
    docker_host: Optional[str] = None
    engine: str = "docker"  # docker, containerd, podman: where the smoke container runs
    # containerd (ctr --address/--namespace, the snapshotter the image is unpacked into)
    address: Optional[str] = None
    namespace: Optional[str] = None
    snapshotter: Optional[str] = None
    # podman (--root, --runroot, --storage-driver)
    podman_root: Optional[str] = None
    podman_runroot: Optional[str] = None
    storage_driver: Optional[str] = None
    ulimits: List[str] = field(default_factory=list)  # --ulimit NAME=SOFT[:HARD] (docker, podman)

    def python_for_run(self) -> str:
        if self.python:
            return self.python
        return sys.executable if self.no_container else "python3"

    def job_environment(self, inherited: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, str], Dict[str, str]]:
        """(variables passed into the run, defaults that were applied). ``inherited`` is the
        environment the run starts from anyway (the current one without a container)."""
        env: Dict[str, str] = {}
        applied: Dict[str, str] = {}
        for k, v in DEFAULT_ENV.items():
            if k not in self.env and k not in (inherited or {}):
                env[k] = v
                applied[k] = v
        env.update(self.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        return env, applied

    def to_dict(self) -> Dict[str, object]:
        return {
            "device": self.device,
            "container": not self.no_container,
            "engine": None if self.no_container else self.engine,
            "gpus": self.gpus,
            "nproc": self.nproc or None,
            "gates": list(self.gates),
            "restart": self.restart,
            "timeoutSeconds": self.timeout,
            "rankTimeoutSeconds": self.rank_timeout,
            "python": self.python_for_run(),
            "volumes": [f"{s}:{d}:ro" for s, d in self.volumes],
            "ulimits": list(self.ulimits),
            "injectedFault": (f"{self.fault}:{self.fault_rank}" if self.fault in ("segv", "hang") else self.fault),
        }


def parse_assignment(text: str, origin: str) -> Tuple[str, str]:
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not _NAME_RE.match(name):
        raise SmokeConfigError(f"reading {origin}: expected NAME=VALUE with NAME of letters, digits and _, "
                               f"found {text!r}", hint="for example --env NCCL_P2P_DISABLE=1")
    if "\n" in value or "\0" in value:
        raise SmokeConfigError(f"reading {origin}: the value of {name} holds a newline or NUL byte")
    return name, value


def read_env_file(path: str) -> List[Tuple[str, str]]:
    """Docker's --env-file format: NAME=VALUE per line, # comments, blank lines; a bare NAME
    takes the current environment's value (and is left out when unset)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read(1024 * 1024).splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SmokeConfigError(f"reading the env file {path}: {e}", hint="pass a readable NAME=VALUE file") from e
    pairs = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            if not _NAME_RE.match(line):
                raise SmokeConfigError(f"reading {path} line {n}: expected NAME=VALUE, found {raw!r}")
            if line in os.environ:
                pairs.append((line, os.environ[line]))
            continue
        pairs.append(parse_assignment(line, f"{path} line {n}"))
    return pairs


def parse_gpus(text: Optional[str]) -> Optional[List[int]]:
    if text is None:
        return None
    parts = [x.strip() for x in text.split(",") if x.strip()]
    gpus = [int(x) for x in parts] if all(_DIGITS.fullmatch(x) for x in parts) else []
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise SmokeConfigError(f"reading --gpus: expected distinct GPU indices like 0,1, found {text!r}")
    return gpus


def parse_gates(text: Optional[str]) -> List[str]:
    if text is None:
        return list(SELECTABLE)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in SELECTABLE]
    if bad or not names:
        raise SmokeConfigError(f"reading --gates: expected some of {','.join(SELECTABLE)}, found {text!r}")
    return [g for g in SELECTABLE if g in names or g == "torch"]


def parse_fault(text: Optional[str]) -> Tuple[Optional[str], int]:
    if not text:
        return None, 0
    name, _, rank = text.partition(":")
    if name not in FAULTS or (rank and not _DIGITS.fullmatch(rank)):
        raise SmokeConfigError(f"reading --inject-fault: expected one of wrong-sum, segv[:RANK], hang[:RANK], "
                               f"found {text!r}")
    return name, int(rank or 0)


_ULIMIT_RE = re.compile(r"^(core|cpu|data|fsize|locks|memlock|msgqueue|nice|nofile|nproc|rss|rtprio|rttime|"
                        r"sigpending|stack)=(-1|\d+)(:(-1|\d+))?$")


def parse_ulimit(text: str) -> str:
    if not _ULIMIT_RE.match(text):
        raise SmokeConfigError(f"reading --ulimit: expected NAME=SOFT[:HARD] (e.g. nofile=1024:1024), found {text!r}")
    return text


def parse_volume(text: str) -> Tuple[str, str]:
    src, sep, dst = text.partition(":")
    if dst.endswith(":ro"):
        dst = dst[:-3]
    if not sep or not src or not dst.startswith("/") or ":" in dst:
        raise SmokeConfigError(f"reading --volume: expected HOST_PATH:CONTAINER_PATH, found {text!r}")
    src = os.path.abspath(src)
    if not os.path.exists(src):
        raise SmokeConfigError(f"reading --volume: expected {src} to exist on this host, found nothing")
    return src, dst


def build_settings(*, device: str, no_container: bool, gpus: Optional[str], env: Sequence[str],
                   env_files: Sequence[str], restart: bool, timeout: float, rank_timeout: float, nproc: int,
                   gates: Optional[str], fault: Optional[str], volumes: Sequence[str], python: Optional[str],
                   docker_host: Optional[str], engine: str = "docker",
                   engine_options: Optional[Dict[str, Optional[str]]] = None,
                   ulimits: Sequence[str] = ()) -> SmokeSettings:
    job: Dict[str, str] = {}
    for path in env_files:
        job.update(read_env_file(path))
    for item in env:
        k, v = parse_assignment(item, "--env")
        job[k] = v
    selected = parse_gpus(gpus)
    if selected is not None and "CUDA_VISIBLE_DEVICES" in job:
        raise SmokeConfigError("reading --gpus: CUDA_VISIBLE_DEVICES is also set with --env/--env-file",
                               hint="select GPUs one way only")
    if timeout <= 0 or rank_timeout <= 0 or nproc < 0:
        raise SmokeConfigError("reading --timeout/--rank-timeout/--nproc: expected positive numbers")
    fault_name, fault_rank = parse_fault(fault)
    if restart and engine == "containerd" and not no_container:
        raise SmokeConfigError("reading --restart: a long-lived container is restarted with docker or podman; "
                               "containerd (ctr) runs the suite once",
                               hint="drop --restart, or use --engine docker|podman")
    if ulimits and engine == "containerd" and not no_container:
        raise SmokeConfigError("reading --ulimit: ctr run sets no limits of its own; --ulimit is for docker and podman",
                               hint="drop --ulimit")
    return SmokeSettings(
        ulimits=[parse_ulimit(u) for u in ulimits],
        device=device, no_container=no_container, gpus=selected, env=job, restart=restart, timeout=timeout,
        rank_timeout=rank_timeout, nproc=nproc, gates=parse_gates(gates), fault=fault_name, fault_rank=fault_rank,
        volumes=[parse_volume(v) for v in volumes], python=python,
        # a bare socket path is unix://PATH (the docker CLI would make it tcp://localhost:2375)
        docker_host=docker_host_url(docker_host or os.environ.get("DOCKER_HOST")) if engine == "docker" else None,
        engine=engine,
        **{k: v for k, v in (engine_options or {}).items() if k in ENGINE_OPTIONS and k != "docker_host"},
    )


#: engine option attribute -> (engine, spelling): the import's own names, less --oci-dir (no container runs there)
ENGINE_OPTIONS = {k: v for k, v in OPTION_ENGINE.items() if v[0] != "oci"}


def choose_engine(engine: Optional[str], options: Dict[str, Optional[str]]) -> str:
    """``--engine``, else the one engine whose options are given, else docker; options of
    another engine are refused."""
    given = [ENGINE_OPTIONS[k] for k in ENGINE_OPTIONS if options.get(k)]
    kind = engine or implied_engine(given, "choosing the smoke engine", SmokeConfigError) or "docker"
    check_own_options(kind, given, SmokeConfigError)
    return kind
