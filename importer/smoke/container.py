"""Engine command lines for the smoke container, and reading the image's facts.

Docker (exercised by the tests): ``docker run --rm --pull never --network none --ipc=host
[--gpus all]`` with the suite mounted read-only. Podman (CDI devices) and containerd (``ctr run
--gpus``) get the same shape from their own builders."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from importer.errors import CommandFailed
from importer.smoke.settings import SmokeConfigError
from importer.smoke.tree import MOUNT_POINT
from importer.smoke.worker.suite import BOOTSTRAP
from importer.streams.commands import run

_HINT = "start the engine, or point at it with --docker-host unix:///path/docker.sock"


@dataclass
class ContainerSpec:
    image: str
    name: str
    tree: str  # host folder mounted read-only at MOUNT_POINT
    python: str = "python3"
    device: str = "cuda"
    gpus: Optional[List[int]] = None
    env: Dict[str, str] = field(default_factory=dict)
    volumes: List[Tuple[str, str]] = field(default_factory=list)

    def command(self, *suite_args: str) -> List[str]:
        """Arguments after the image: the interpreter's, then the suite's."""
        return ["-c", BOOTSTRAP, MOUNT_POINT, *suite_args]

    def env_args(self, flag: str = "-e") -> List[str]:
        out: List[str] = []
        for k, v in sorted(self.env.items()):
            out += [flag, f"{k}={v}"]
        return out


def docker_base(host: Optional[str], binary: str = "docker") -> List[str]:
    return [binary, "-H", host] if host else [binary]


def docker_run(base: Sequence[str], spec: ContainerSpec, *suite_args: str, detach: bool = False) -> List[str]:
    argv = [*base, "run", "-d" if detach else "--rm", "--pull", "never", "--network", "none", "--ipc=host",
            "--name", spec.name]
    if spec.device == "cuda":
        argv += ["--gpus", "all"]
    argv += spec.env_args()
    argv += ["-v", f"{spec.tree}:{MOUNT_POINT}:ro"]
    for src, dst in spec.volumes:
        argv += ["-v", f"{src}:{dst}:ro"]
    argv += ["--entrypoint", spec.python, spec.image, *spec.command(*suite_args)]
    return argv


def docker_exec(base: Sequence[str], spec: ContainerSpec, *suite_args: str) -> List[str]:
    return [*base, "exec", spec.name, spec.python, *spec.command(*suite_args)]


def podman_run(base: Sequence[str], spec: ContainerSpec, *suite_args: str) -> List[str]:
    """Podman: GPUs through CDI (``nvidia-ctk cdi generate``), SELinux labels left alone."""
    argv = [*base, "run", "--rm", "--pull", "never", "--network", "none", "--ipc=host", "--name", spec.name,
            "--security-opt", "label=disable"]
    if spec.device == "cuda":
        if spec.gpus is None:
            argv += ["--device", "nvidia.com/gpu=all"]
        for g in spec.gpus or []:
            argv += ["--device", f"nvidia.com/gpu={g}"]
    argv += spec.env_args()
    argv += ["-v", f"{spec.tree}:{MOUNT_POINT}:ro"]
    for src, dst in spec.volumes:
        argv += ["-v", f"{src}:{dst}:ro"]
    argv += ["--entrypoint", spec.python, spec.image, *spec.command(*suite_args)]
    return argv


def ctr_run(base: Sequence[str], spec: ContainerSpec, *suite_args: str, gpu_count: int = 0) -> List[str]:
    """containerd's ctr: no network unless --net-host (loopback only), GPUs by index, the host's
    /dev/shm bound in (ctr has no --ipc=host); the image ref must be fully qualified."""
    argv = [*base, "run", "--rm", "--cwd", MOUNT_POINT]
    if spec.device == "cuda":
        for g in spec.gpus if spec.gpus is not None else range(gpu_count):
            argv += ["--gpus", str(g)]
    argv += spec.env_args("--env")
    argv += ["--mount", f"type=bind,src={spec.tree},dst={MOUNT_POINT},options=rbind:ro",
             "--mount", "type=bind,src=/dev/shm,dst=/dev/shm,options=rbind:rw"]
    for src, dst in spec.volumes:
        argv += ["--mount", f"type=bind,src={src},dst={dst},options=rbind:ro"]
    argv += [spec.image, spec.name, spec.python, *spec.command(*suite_args)]
    return argv


def docker_kill(base: Sequence[str], name: str) -> List[str]:
    return [*base, "kill", name]


def docker_rm(base: Sequence[str], name: str) -> List[str]:
    return [*base, "rm", "-f", name]


def docker_restart(base: Sequence[str], name: str, grace: int = 10) -> List[str]:
    return [*base, "restart", "-t", str(grace), name]


@dataclass
class ImageFacts:
    ref: str
    image_id: str
    repo_tags: List[str]
    repo_digests: List[str]
    env: Dict[str, str]
    platform: str

    def to_dict(self) -> Dict[str, Any]:
        return {"ref": self.ref, "id": self.image_id, "repoTags": self.repo_tags, "repoDigests": self.repo_digests,
                "platform": self.platform, "cudaVersion": self.env.get("CUDA_VERSION"),
                "requireCuda": self.env.get("NVIDIA_REQUIRE_CUDA")}


def inspect_image(base: Sequence[str], ref: str) -> ImageFacts:
    """The image's ID, names and config environment; SmokeConfigError when it is not there
    (the suite never pulls)."""
    try:
        res = run([*base, "image", "inspect", "--format", "{{json .}}", ref],
                  what=f"inspecting {ref}", timeout=120, check=False, hint=_HINT)
    except CommandFailed as e:
        raise SmokeConfigError(f"inspecting {ref}: {e.message}", context=e.context, hint=_HINT) from e
    if res.returncode != 0:
        if "No such image" in res.stderr or "No such object" in res.stderr:
            raise SmokeConfigError(f"running the smoke suite in {ref}: expected the image in the engine, found none",
                                   hint="import it first (bundle-import BUNDLE --verify); the suite never pulls")
        raise SmokeConfigError(f"inspecting {ref}: the engine answered with status {res.returncode}",
                               context=res.stderr.strip() or None, hint=_HINT)
    doc = json.loads(res.stdout.decode("utf-8", "replace"))
    if isinstance(doc, list):
        doc = doc[0] if doc else {}
    config = doc.get("Config") or {}
    env: Dict[str, str] = {}
    for item in config.get("Env") or []:
        k, _, v = str(item).partition("=")
        env[k] = v
    return ImageFacts(ref=ref, image_id=str(doc.get("Id", "")), repo_tags=[str(t) for t in doc.get("RepoTags") or []],
                      repo_digests=[str(d) for d in doc.get("RepoDigests") or []], env=env,
                      platform=f"{doc.get('Os', '')}/{doc.get('Architecture', '')}")
