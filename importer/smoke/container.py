"""Engine command lines for the smoke container, and reading the image's facts.

Docker: ``docker run --rm --pull never --network none --ipc=host [--gpus all]`` with the suite
mounted read-only. Podman: the same shape, GPUs as CDI devices (``--device nvidia.com/gpu=all``).
containerd: ``ctr run --rm`` (no network but loopback, /dev/shm bound in), GPUs as CDI devices,
through the NVIDIA runtime, or ctr's own ``--gpus``. The CPU path of each runs in the tests; the
GPU arguments are built and unit-tested only (no GPU on the test machines)."""

from __future__ import annotations

import glob
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from importer.errors import BundleError, CommandFailed
from importer.format.digest import is_digest
from importer.format.reference import split_reference
from importer.format.refs import normalize
from importer.smoke.settings import SmokeConfigError
from importer.smoke.tree import MOUNT_POINT
from importer.smoke.worker.suite import BOOTSTRAP
from importer.streams.commands import run

_HINT = "start the engine, or point at it with --docker-host unix:///path/docker.sock"
ENGINES = ("docker", "containerd", "podman")
NVIDIA_RUNTIME = "nvidia-container-runtime"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_MISSING = ("No such image", "No such object", "image not known", "no such image", "image not found")


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


def docker_run(base: Sequence[str], spec: ContainerSpec, *suite_args: str, detach: bool = False,
               ulimits: Sequence[str] = ()) -> List[str]:
    argv = [*base, "run", "-d" if detach else "--rm", "--pull", "never", "--network", "none", "--ipc=host",
            "--name", spec.name]
    for limit in ulimits:
        argv += ["--ulimit", limit]
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


def podman_run(base: Sequence[str], spec: ContainerSpec, *suite_args: str, gpu: Optional[str] = "cdi",
               ulimits: Sequence[str] = (), detach: bool = False) -> List[str]:
    """Podman: GPUs through CDI (``nvidia-ctk cdi generate``), SELinux labels left alone;
    ``ulimits`` (``nofile=S:H``) for hosts that refuse podman's default limits."""
    argv = [*base, "run", "-d" if detach else "--rm", "--pull", "never", "--network", "none", "--ipc=host",
            "--name", spec.name, "--security-opt", "label=disable"]
    for limit in ulimits:
        argv += ["--ulimit", limit]
    if spec.device == "cuda" and gpu == "cdi":
        argv += cdi_devices(spec.gpus)
    argv += spec.env_args()
    argv += ["-v", f"{spec.tree}:{MOUNT_POINT}:ro"]
    for src, dst in spec.volumes:
        argv += ["-v", f"{src}:{dst}:ro"]
    argv += ["--entrypoint", spec.python, spec.image, *spec.command(*suite_args)]
    return argv


def cdi_devices(gpus: Optional[List[int]]) -> List[str]:
    """``--device nvidia.com/gpu=all`` or one per selected index (podman, ctr of containerd 1.7+)."""
    argv: List[str] = []
    for g in (["all"] if gpus is None else [str(g) for g in gpus]):
        argv += ["--device", f"nvidia.com/gpu={g}"]
    return argv


def ctr_run(base: Sequence[str], spec: ContainerSpec, *suite_args: str, gpu_count: int = 0,
            gpu: Optional[str] = "ctr-gpus", runtime_binary: str = NVIDIA_RUNTIME,
            snapshotter: Optional[str] = None, net_host: bool = False) -> List[str]:
    """containerd's ctr: no network (a namespace with loopback only) unless ``net_host``, the
    host's /dev/shm bound in (ctr has no --ipc=host); the image ref must be fully qualified.
    GPUs (``gpu``): ``cdi`` -> CDI devices, ``nvidia-runtime`` -> the NVIDIA runtime as runc
    with NVIDIA_VISIBLE_DEVICES, ``ctr-gpus`` -> ctr's own ``--gpus INDEX`` (nvidia-container-cli)."""
    argv = [*base, "run", "--rm", "--cwd", MOUNT_POINT]
    if snapshotter:
        argv += ["--snapshotter", snapshotter]
    if net_host:
        argv += ["--net-host"]
    if spec.device == "cuda" and gpu == "cdi":
        argv += cdi_devices(spec.gpus)
    elif spec.device == "cuda" and gpu == "nvidia-runtime":
        visible = "all" if spec.gpus is None else ",".join(str(g) for g in spec.gpus)
        argv += ["--runc-binary", runtime_binary, "--env", f"NVIDIA_VISIBLE_DEVICES={visible}",
                 "--env", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    elif spec.device == "cuda" and gpu == "ctr-gpus":
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
    run_name: Optional[str] = None  # what the engine runs: containerd needs a full name, not an ID

    def run_ref(self) -> str:
        return self.run_name or self.image_id or self.ref

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
        if any(m in res.stderr for m in _MISSING):
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
    image_id = str(doc.get("Id", ""))
    if image_id and ":" not in image_id:  # podman: bare hex
        image_id = f"sha256:{image_id}"
    return ImageFacts(ref=ref, image_id=image_id, repo_tags=[str(t) for t in doc.get("RepoTags") or []],
                      repo_digests=[str(d) for d in doc.get("RepoDigests") or []], env=env,
                      platform=f"{doc.get('Os', '')}/{doc.get('Architecture', '')}")


def nvidia_cdi_spec(dirs: Sequence[str] = CDI_DIRS) -> Optional[str]:
    """The first CDI spec file that declares ``nvidia.com/gpu`` devices (``nvidia-ctk cdi generate``)."""
    for folder in dirs:
        for path in sorted(glob.glob(os.path.join(folder, "*.yaml")) + glob.glob(os.path.join(folder, "*.json"))):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read(4 * 1024 * 1024)
            except OSError:
                continue
            if "nvidia.com/gpu" in text:
                return path
    return None


def gpu_access(kind: str, *, which: Any = shutil.which, cdi_dirs: Sequence[str] = CDI_DIRS) -> Optional[str]:
    """How the engine gives a container the GPUs: ``docker-gpus`` (``--gpus all``), ``cdi``,
    ``nvidia-runtime`` (containerd: the NVIDIA runtime as runc), ``ctr-gpus`` (containerd:
    ctr's ``--gpus``, which runs nvidia-container-cli); None when this host offers no way."""
    if kind == "docker":
        return "docker-gpus"
    if nvidia_cdi_spec(cdi_dirs):
        return "cdi"
    if kind == "containerd":
        if which(NVIDIA_RUNTIME):
            return "nvidia-runtime"
        if which("nvidia-container-cli"):
            return "ctr-gpus"
    return None


@dataclass
class Engine:
    """The engine the smoke container runs in, with what it needs to run one."""

    kind: str
    base: List[str]
    address: str
    namespace: Optional[str] = None
    snapshotter: Optional[str] = None
    gpu: Optional[str] = None  # gpu_access()
    ulimits: List[str] = field(default_factory=list)

    def describe(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"kind": self.kind, "address": self.address}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.snapshotter:
            out["snapshotter"] = self.snapshotter
        out["gpuAccess"] = self.gpu
        return out

    def run_argv(self, spec: ContainerSpec, *suite_args: str, gpu_count: int = 0, detach: bool = False) -> List[str]:
        if self.kind == "containerd":
            assert not detach, "containerd: no long-lived smoke container"
            return ctr_run(self.base, spec, *suite_args, gpu_count=gpu_count, gpu=self.gpu,
                           snapshotter=self.snapshotter)
        if self.kind == "podman":
            return podman_run(self.base, spec, *suite_args, gpu=self.gpu, ulimits=self.ulimits, detach=detach)
        return docker_run(self.base, spec, *suite_args, detach=detach, ulimits=self.ulimits)

    def kill_argv(self, name: str) -> List[str]:
        if self.kind == "containerd":
            return [*self.base, "tasks", "kill", "--signal", "SIGKILL", name]
        return docker_kill(self.base, name)

    def cleanup_argvs(self, name: str) -> List[List[str]]:
        """What removes a container the run left behind (a killed ``ctr run`` does not remove its own)."""
        if self.kind == "containerd":
            return [[*self.base, "tasks", "delete", "--force", name], [*self.base, "containers", "delete", name]]
        return []

    def inspect(self, ref: str) -> ImageFacts:
        if self.kind == "containerd":
            return self._ctr_inspect(ref)
        return inspect_image(self.base, ref)

    def _ctr_inspect(self, ref: str) -> ImageFacts:
        """The image's names, manifest and config digests and config environment, from
        containerd's content store; SmokeConfigError when it is missing or not unpacked."""
        from importer.sinks.containerd import ContainerdSink

        sink = ContainerdSink(self.address, self.namespace, self.snapshotter)
        hint = (f"import it first (bundle-import BUNDLE --verify --engine containerd --address {self.address} "
                f"--namespace {sink.namespace}); the suite never pulls")
        try:
            found = sink.lookup(ref)
            if found is None:
                raise SmokeConfigError(f"running the smoke suite in {ref}: expected the image in containerd "
                                       f"namespace {sink.namespace}, found none", hint=hint)
            if found.problems or not found.config_digest or not found.tags:
                raise SmokeConfigError(f"running the smoke suite in {ref}: expected the image complete and unpacked "
                                       f"into {sink.snapshotter}, found: {'; '.join(found.problems) or 'no name'}",
                                       hint=hint)
            res = run(sink.argv("content", "get", found.config_digest), what=f"reading the config of {ref}",
                      timeout=120)
            config = json.loads(res.stdout.decode("utf-8", "replace"))
        except SmokeConfigError:
            raise
        except (BundleError, ValueError) as e:
            raise SmokeConfigError(f"inspecting {ref} in containerd at {self.address}: {e}",
                                   hint="start containerd, or point at it with --address SOCKET --namespace NS") from e
        env: Dict[str, str] = {}
        for item in (config.get("config") or {}).get("Env") or []:
            k, _, v = str(item).partition("=")
            env[k] = v
        name = normalize(ref) if not is_digest(ref) and normalize(ref) in found.tags else found.tags[0]
        target = found.manifest_digest or found.image_id
        return ImageFacts(ref=ref, image_id=str(found.config_digest), repo_tags=list(found.tags),
                          repo_digests=[f"{_without_digest(t)}@{target}" for t in found.tags], env=env,
                          platform=f"{config.get('os', '')}/{config.get('architecture', '')}", run_name=name)


def _without_digest(ref: str) -> str:
    name, tag, _ = split_reference(ref)
    return f"{name}:{tag}" if tag else name


def build_engine(kind: str, *, docker_host: Optional[str] = None, address: Optional[str] = None,
                 namespace: Optional[str] = None, snapshotter: Optional[str] = None,
                 podman_root: Optional[str] = None, podman_runroot: Optional[str] = None,
                 storage_driver: Optional[str] = None, ulimits: Sequence[str] = (), which: Any = shutil.which,
                 cdi_dirs: Sequence[str] = CDI_DIRS) -> Engine:
    if kind == "containerd":
        from importer.sinks.containerd import ContainerdSink

        sink = ContainerdSink(address, namespace, snapshotter)
        return Engine("containerd", sink.argv(), sink.address, namespace=sink.namespace,
                      snapshotter=sink.snapshotter, gpu=gpu_access(kind, which=which, cdi_dirs=cdi_dirs))
    if kind == "podman":
        from importer.engines.podmanclient import PodmanClient

        pod = PodmanClient(podman_root, podman_runroot, storage_driver)
        where = f"podman storage {podman_root}" if podman_root else "podman default storage"
        return Engine("podman", pod.argv(), where, gpu=gpu_access(kind, which=which, cdi_dirs=cdi_dirs),
                      ulimits=list(ulimits))
    if kind != "docker":
        raise SmokeConfigError(f"running the smoke suite: expected an engine that runs containers "
                               f"({', '.join(ENGINES)}), found {kind}",
                               hint="load the image into Docker, containerd or podman, or use --no-container")
    return Engine("docker", docker_base(docker_host), docker_host or "unix:///var/run/docker.sock",
                  gpu="docker-gpus", ulimits=list(ulimits))
