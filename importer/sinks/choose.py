"""Which engine to load into: ``--engine``, else what the options imply, else Docker.

Detection order without ``--engine``: an engine option given (``--oci-dir`` -> oci,
``--address/--namespace/--snapshotter`` -> containerd, ``--podman-root/--podman-runroot/
--storage-driver`` -> podman, ``--docker-host`` -> docker); else ``DOCKER_HOST`` set -> docker
(it must answer); else Docker on its default socket. Nothing else is chosen silently: when Docker
does not answer there, containerd (``$CONTAINERD_ADDRESS`` or its default socket) and podman are
asked, and the error says which answered and the ``--engine`` flags that choose each.
The choice and its reason are printed on stderr and recorded in the receipt (``engine.selectedBy``)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple, Type

from importer.errors import EngineNotChosen, EngineUnavailable, SinkError, UsageError
from importer.sinks import Sink

ENGINES = ("docker", "containerd", "podman", "oci")
DOCKER_SOCKET = "/var/run/docker.sock"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
K8S_NAMESPACE = "k8s.io"

#: option attribute -> (engine it belongs to, how it is spelled); the smoke suite uses these too
OPTION_ENGINE = {
    "docker_host": ("docker", "--docker-host"),
    "address": ("containerd", "--address"),
    "namespace": ("containerd", "--namespace"),
    "snapshotter": ("containerd", "--snapshotter"),
    "podman_root": ("podman", "--podman-root"),
    "podman_runroot": ("podman", "--podman-runroot"),
    "storage_driver": ("podman", "--storage-driver"),
    "oci_dir": ("oci", "--oci-dir"),
}


@dataclass
class EngineOptions:
    engine: Optional[str] = None
    docker_host: Optional[str] = None
    address: Optional[str] = None
    namespace: Optional[str] = None
    snapshotter: Optional[str] = None
    podman_root: Optional[str] = None
    podman_runroot: Optional[str] = None
    storage_driver: Optional[str] = None
    oci_dir: Optional[str] = None

    @classmethod
    def from_args(cls, args: Any) -> EngineOptions:
        return cls(**{name: getattr(args, name, None) for name in ("engine", *OPTION_ENGINE)})

    def given(self) -> List[Tuple[str, str]]:
        """(engine, option spelling) of every engine option given."""
        return [OPTION_ENGINE[name] for name in OPTION_ENGINE if getattr(self, name)]


def build_sink(kind: str, opts: EngineOptions) -> Sink:
    if kind == "docker":
        from importer.sinks.docker import DockerSink

        return DockerSink(opts.docker_host)
    if kind == "containerd":
        from importer.sinks.containerd import ContainerdSink

        return ContainerdSink(opts.address, opts.namespace, opts.snapshotter)
    if kind == "podman":
        from importer.sinks.podman import PodmanSink

        return PodmanSink(opts.podman_root, opts.podman_runroot, opts.storage_driver)
    if kind == "oci":
        from importer.sinks.oci_layout import OciLayoutSink

        if not opts.oci_dir:
            raise UsageError("choosing the oci engine: expected --oci-dir DIR, found none",
                             hint="pass --oci-dir with the folder to write the OCI layout to")
        return OciLayoutSink(opts.oci_dir)
    raise UsageError(f"choosing an engine: expected one of {', '.join(ENGINES)}, found {kind!r}")


def implied_engine(given: List[Tuple[str, str]], what: str, error: Type[UsageError] = UsageError) -> Optional[str]:
    """The one engine the given options (engine, spelling) belong to; None when none is given."""
    implied = sorted({engine for engine, _ in given})
    if len(implied) > 1:
        raise error(f"{what}: options of {' and '.join(implied)} given together",
                    hint="pass --engine and only that engine's options")
    return implied[0] if implied else None


def check_own_options(kind: str, given: List[Tuple[str, str]], error: Type[UsageError] = UsageError) -> None:
    """Only ``kind``'s options among the given (engine, spelling)."""
    stray = [spelling for engine, spelling in given if engine != kind]
    if stray:
        raise error(f"choosing the {kind} engine: expected only its own options, found {', '.join(stray)}",
                    hint=f"drop {', '.join(stray)}, or choose the engine they belong to with --engine")


def _answers(sink: Sink) -> bool:
    try:
        sink.probe()
    except SinkError:
        return False
    return True


def choose_sink(
    opts: EngineOptions,
    *,
    docker_socket: str = DOCKER_SOCKET,
    containerd_socket: str = CONTAINERD_SOCKET,
    which: Callable[[str], Optional[str]] = shutil.which,
) -> Tuple[Sink, str]:
    """(sink, why it was chosen). Raises UsageError for contradicting options and
    EngineUnavailable when nothing answers."""
    if opts.engine:
        check_own_options(opts.engine, opts.given())
        return build_sink(opts.engine, opts), f"--engine {opts.engine}"
    implied = implied_engine(opts.given(), "choosing an engine")
    if implied:
        spelling = next(s for e, s in opts.given() if e == implied)
        return build_sink(implied, opts), f"{spelling} given"
    if os.environ.get("DOCKER_HOST"):
        return _docker_host_env(opts)
    tried: List[str] = []
    if which("docker"):
        if os.path.exists(docker_socket):
            sink = build_sink("docker", EngineOptions(docker_host=f"unix://{docker_socket}"))
            if _answers(sink):
                return sink, f"Docker answers on {docker_socket}"
            tried.append(f"Docker on {docker_socket}: no answer")
        else:
            tried.append(f"Docker: no {docker_socket}")
    else:
        tried.append("Docker: no `docker` command")
    answered = _others_answering(containerd_socket, which, tried)
    if answered:
        raise EngineNotChosen(
            f"choosing an engine: expected Docker on {docker_socket} (the default) or --engine, "
            f"found {' and '.join(name for name, _ in answered)} answering instead",
            context="\n".join(tried),
            hint="name the engine to load into: " + ", or ".join(flags for _, flags in answered),
        )
    raise EngineUnavailable(
        "choosing an engine: expected Docker, containerd or podman to answer, found none",
        context="\n".join(tried),
        hint="start one, or name it: --engine docker|containerd|podman|oci with its options "
        "(--docker-host, --address/--namespace/--snapshotter, --podman-root/--podman-runroot, --oci-dir)",
    )


def _docker_host_env(opts: EngineOptions) -> Tuple[Sink, str]:
    """DOCKER_HOST names Docker; one that does not answer is said at once, with the way out."""
    host = os.environ["DOCKER_HOST"]
    sink = build_sink("docker", opts)
    try:
        sink.probe()
    except SinkError as e:
        raise EngineUnavailable(
            f"choosing an engine: DOCKER_HOST is set ({host}), expected Docker to answer there, found none",
            context=e.message,
            hint="start Docker there, fix or unset DOCKER_HOST, or name another engine: "
            "--engine containerd|podman|oci with its options",
        ) from e
    return sink, f"DOCKER_HOST is set ({host})"


def _others_answering(containerd_socket: str, which: Callable[[str], Optional[str]],
                      tried: List[str]) -> List[Tuple[str, str]]:
    """(engine as said, the flags that choose it) of containerd and podman when they answer: they
    are never chosen silently (a load into an engine nobody named is a load nobody looks for)."""
    answered: List[Tuple[str, str]] = []
    address = os.environ.get("CONTAINERD_ADDRESS") or containerd_socket
    if which("ctr"):
        if os.path.exists(address):
            from importer.sinks.containerd import ContainerdSink

            probe = ContainerdSink(address, os.environ.get("CONTAINERD_NAMESPACE") or None)
            if _answers(probe):
                namespace = probe.namespace
                said = f"containerd on {address}"
                if not os.environ.get("CONTAINERD_NAMESPACE") and K8S_NAMESPACE in _namespaces(probe):
                    namespace = K8S_NAMESPACE
                    said += f" (namespace {K8S_NAMESPACE} exists: a Kubernetes node)"
                answered.append((said, f"--engine containerd --address {address} --namespace {namespace}"))
                tried.append(f"{said}: answers")
            else:
                tried.append(f"containerd on {address}: no answer")
        else:
            tried.append(f"containerd: no {address}")
    else:
        tried.append("containerd: no `ctr` command")
    if which("podman"):
        if _answers(build_sink("podman", EngineOptions())):
            answered.append(("podman (default storage)", "--engine podman"))
            tried.append("podman (default storage): answers")
        else:
            tried.append("podman: `podman info` failed")
    else:
        tried.append("podman: no `podman` command")
    return answered


def _namespaces(sink: Any) -> List[str]:
    try:
        out = sink.client.run("namespaces", "ls", "-q", what="listing containerd's namespaces", timeout=60)
    except SinkError:
        return []
    return [line.strip() for line in str(out).splitlines() if line.strip()]


if TYPE_CHECKING:  # mypy holds each sink to the protocols its capabilities name (the flags: tests/test_architecture.py)
    from importer.registry.sink import RegistrySink
    from importer.sinks import (
        DeltaCompleting,
        DockerArchiveLoading,
        FileArtifactKeeping,
        Inventorying,
        LayerStreaming,
        LoadCounting,
        Pushing,
        Reexporting,
        TagListing,
    )
    from importer.sinks.containerd import ContainerdSink
    from importer.sinks.docker import DockerSink
    from importer.sinks.oci_layout import OciLayoutSink
    from importer.sinks.podman import PodmanSink

    def _docker(s: DockerSink) -> Tuple[LayerStreaming, DockerArchiveLoading, DeltaCompleting, TagListing,
                                        Inventorying, Reexporting]:
        return s, s, s, s, s, s

    def _podman(s: PodmanSink) -> Tuple[DockerArchiveLoading, DeltaCompleting, TagListing, Inventorying,
                                        Reexporting]:
        return s, s, s, s, s

    def _containerd(s: ContainerdSink) -> Tuple[DockerArchiveLoading, DeltaCompleting, TagListing, Inventorying,
                                                Reexporting]:
        return s, s, s, s, s

    def _oci(s: OciLayoutSink) -> Tuple[LoadCounting, DeltaCompleting, TagListing, Inventorying, Reexporting,
                                        FileArtifactKeeping]:
        return s, s, s, s, s, s

    def _registry(s: RegistrySink) -> Tuple[Sink, Inventorying, Pushing]:
        return s, s, s
