"""``bundle-import serve BUNDLE --print-node-config``: the files that make each node's engine pull
the bundle's images from the served bundle (or a site registry, ``--node-registry``) under their
original names, so a manifest that says ``nvcr.io/nvidia/app:1`` resolves on an offline node
without rewriting it.

The mirror answers the original repository path (serve's rule, importer/serve/serve.py: the
registry host left out; ``docker.io/library/app`` is ``library/app``), which is what the engines ask
a mirror for:

- containerd (and Kubernetes through it): ``/etc/containerd/certs.d/UPSTREAM/hosts.toml`` naming the
  mirror first (``capabilities = ["pull", "resolve"]``, its ``ca``), plus one for the mirror itself;
  CRI reads them once its ``config_path`` is ``/etc/containerd/certs.d``;
- podman/CRI-O: one ``registries.conf.d`` drop-in with a ``[[registry.mirror]]`` per upstream and the
  CA under ``/etc/containers/certs.d/MIRROR/ca.crt``;
- Docker: ``registry-mirrors`` in ``daemon.json`` mirrors Docker Hub only, so other upstreams are
  pulled as ``MIRROR/REPO:TAG``; the CA goes to ``/etc/docker/certs.d/MIRROR/ca.crt``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from importer.format.reference import (
    DOCKER_HUB,
    DOCKER_HUB_API,
    engine_host,
    is_docker_hub,
    split_host_path,
    split_reference,
    split_registry,
)

CONTAINERD_DIR = "/etc/containerd/certs.d"
DOCKER_DIR = "/etc/docker/certs.d"
PODMAN_DIR = "/etc/containers/certs.d"
PODMAN_DROPIN = "/etc/containers/registries.conf.d/50-sneakernet-mirror.conf"
_SERVER_OF = {DOCKER_HUB: f"https://{DOCKER_HUB_API}"}


@dataclass
class NodeFile:
    engine: str  # containerd, docker, podman
    path: str  # where it goes on each node
    content: Optional[str] = None  # None: a copy of ``copy_from`` (the CA)
    copy_from: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"engine": self.engine, "path": self.path, "content": self.content, "copyFrom": self.copy_from}


@dataclass
class NodeConfig:
    mirror: str  # HOST:PORT[/PREFIX] the nodes pull from
    scheme: str  # https or http
    upstreams: List[str]
    files: List[NodeFile] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"ok": True, "nodeConfig": True, "mirror": self.mirror, "scheme": self.scheme,
                "upstreams": self.upstreams, "files": [f.to_dict() for f in self.files], "notes": self.notes}

    def lines(self) -> List[str]:
        out = [f"# nodes pull {', '.join(self.upstreams)} from {self.scheme}://{self.mirror} "
               "(files below, one per node and engine)"]
        for f in self.files:
            if f.content is None:
                out.append(f"# {f.engine}: copy {f.copy_from} to {f.path}")
                continue
            out += ["", f"# {f.engine}: {f.path}", *f.content.rstrip("\n").splitlines()]
        out += [""] + [f"# note: {n}" for n in self.notes]
        return out


def upstreams_of(refs: Sequence[str]) -> Dict[str, List[str]]:
    """upstream registry -> the repositories of the refs it holds (Docker Hub for refs without a host)."""
    found: Dict[str, List[str]] = {}
    for ref in refs:
        name = split_reference(ref)[0]
        host, repo = split_host_path(name, engine_host)
        if not host or is_docker_hub(host):
            host = DOCKER_HUB
        found.setdefault(host, [])
        if repo not in found[host]:
            found[host].append(repo)
    return dict(sorted(found.items()))


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for these characters


def _containerd(cfg: NodeConfig, ca: Optional[str]) -> None:
    host, prefix = split_registry(cfg.mirror)
    url = f"{cfg.scheme}://{host}" + (f"/v2/{prefix}" if prefix else "")
    ca_path = f"{CONTAINERD_DIR}/{host}/ca.crt"
    mirror = [f"[host.{_toml(url)}]", '  capabilities = ["pull", "resolve"]']
    if prefix:
        mirror.append("  override_path = true")
    if ca:
        mirror.append(f"  ca = {_toml(ca_path)}")
    body = "\n".join(mirror) + "\n"
    for up in cfg.upstreams:
        server = _SERVER_OF.get(up, f"https://{up}")
        cfg.files.append(NodeFile("containerd", f"{CONTAINERD_DIR}/{up}/hosts.toml",
                                  f"server = {_toml(server)}\n\n{body}"))
    own = [f"server = {_toml(f'{cfg.scheme}://{host}')}"] + ([f"ca = {_toml(ca_path)}"] if ca else [])
    cfg.files.append(NodeFile("containerd", f"{CONTAINERD_DIR}/{host}/hosts.toml", "\n".join(own) + "\n"))
    if ca:
        cfg.files.append(NodeFile("containerd", ca_path, copy_from=ca))


def _docker(cfg: NodeConfig, ca: Optional[str]) -> None:
    host, prefix = split_registry(cfg.mirror)
    daemon: Dict[str, Any] = {}
    if DOCKER_HUB in cfg.upstreams and not prefix:
        daemon["registry-mirrors"] = [f"{cfg.scheme}://{host}"]
    if cfg.scheme == "http":
        daemon["insecure-registries"] = [host]
    if daemon:
        cfg.files.append(NodeFile("docker", "/etc/docker/daemon.json (merge these keys)",
                                  json.dumps(daemon, indent=2) + "\n"))
    if ca:
        cfg.files.append(NodeFile("docker", f"{DOCKER_DIR}/{host}/ca.crt", copy_from=ca))
    others = [u for u in cfg.upstreams if u != DOCKER_HUB or prefix]
    if others:
        cfg.notes.append(f"Docker mirrors Docker Hub only: Docker nodes pull {', '.join(others)} images as "
                         f"{cfg.mirror}/REPO:TAG (and may `docker tag` them to the original name)")


def _podman(cfg: NodeConfig, ca: Optional[str]) -> None:
    host = split_registry(cfg.mirror)[0]
    blocks = []
    for up in cfg.upstreams:
        lines = ["[[registry]]", f"location = {_toml(up)}", "",
                 "[[registry.mirror]]", f"location = {_toml(cfg.mirror)}"]
        if cfg.scheme == "http":
            lines.append("insecure = true")
        blocks.append("\n".join(lines))
    cfg.files.append(NodeFile("podman", PODMAN_DROPIN, "\n\n".join(blocks) + "\n"))
    if ca:
        cfg.files.append(NodeFile("podman", f"{PODMAN_DIR}/{host}/ca.crt", copy_from=ca))


def node_config(refs: Sequence[str], mirror: str, scheme: str, ca: Optional[str]) -> NodeConfig:
    """The node files for a mirror at ``mirror`` (``HOST:PORT[/PREFIX]``) of the refs' registries."""
    found = upstreams_of(refs)
    cfg = NodeConfig(mirror=mirror, scheme=scheme, upstreams=list(found))
    _containerd(cfg, ca)
    _docker(cfg, ca)
    _podman(cfg, ca)
    if found:
        cfg.notes.append(f"containerd/CRI reads hosts.toml files once its registry config_path is {CONTAINERD_DIR} "
                         "(config.toml: [plugins.\"io.containerd.grpc.v1.cri\".registry] config_path); ctr pulls "
                         f"with --hosts-dir {CONTAINERD_DIR}")
    single = [r for r in found.get(DOCKER_HUB, []) if "/" not in r]
    if single:
        cfg.notes.append(f"Docker Hub refs without a namespace ({', '.join(single)}) are asked of a mirror as "
                         "library/NAME, which the served bundle does not hold: export them as "
                         "docker.io/library/NAME:TAG")
    if scheme == "https" and not ca:
        cfg.notes.append("no CA given (--tls-self-signed DIR or --node-ca FILE): the nodes must already trust "
                         "the mirror's certificate")
    return cfg
