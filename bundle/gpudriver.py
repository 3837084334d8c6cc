"""The GPU Operator's driver images per node, computed as the operator computes them (v25.3.x
source, github.com/NVIDIA/gpu-operator; docs/kubernetes.md cites each rule):

- ClusterPolicy, compiled (``controllers/object_controls.go resolveDriverTag``):
  ``api/nvidia/v1/clusterpolicy_types.go imagePath`` (``repository/image:version``, ``@version``
  for a digest, ``image`` alone without repository and version), then ``-<os>`` appended unless the
  path holds ``sha256:``; ``<os>`` is os-release ``ID`` + ``VERSION_ID`` (``kernelFullVersion``:
  ``ubuntu22.04``). GPUDirect Storage, GDRCopy and the vGPU manager take the same path.
- ClusterPolicy, precompiled (``resolveDriverTag``, ``spec.UsePrecompiledDrivers()``):
  ``repository/image:version-<kernel>`` (``image-<kernel>`` without repository and version), then
  ``-<os>``: ``<branch>-<kernel>-<os>``, one DaemonSet per kernel (``precompiledDriverDaemonsets``).
- NVIDIADriver (``internal/state/driver.go getDriverImagePath``):
  ``api/nvidia/v1alpha1/nvidiadriver_types.go GetImagePath`` (``internal/image/image.go ImagePath``
  + ``-<os>`` unless a digest) and ``GetPrecompiledImagePath`` (``-<kernel>-<os>``; a digest refused).

The nodes are the ``--have`` inventories (1.4: ``node``, importer/inventory/nodefacts.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from bundle.k8simages import DriverSpec, ManifestImagesError, operand_image
from importer.errors import SourceError, UsageError
from importer.format.limits import MAX_ENGINE_JSON, parse_json, read_file_limited
from importer.format.platform import Platform, of_dict
from importer.format.reference import DOCKER_HUB, DOCKER_HUB_API
from importer.inventory.engine import load_inventory
from importer.inventory.nodefacts import kernel_of, os_tag


class DriverImageMissing(SourceError):
    """``bundle export --images-from-manifests --have``: the driver image the GPU Operator will pull on
    a node (its tag made from the node's OS and kernel) does not exist at the source registry."""

    reference = "driver-image-missing"


@dataclass(frozen=True)
class Node:
    name: str  # the inventory's host name
    inventory: str  # the file
    os: Optional[str]  # ubuntu22.04
    kernel: Optional[str]  # 5.15.0-139-generic
    platform: Optional[Platform]

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "inventory": self.inventory, "os": self.os, "kernel": self.kernel,
                "platform": str(self.platform) if self.platform else None}


@dataclass(frozen=True)
class NodeImage:
    """One driver image one node will pull."""

    ref: str
    node: Node
    spec: DriverSpec
    rule: str  # how the tag was made (the operator's function)

    def why(self) -> str:
        how = "precompiled" if self.spec.precompiled else "compiled"
        return (f"{self.spec.origin.text()} ({self.spec.crd} {self.spec.component}, {how}) for node {self.node.name} "
                f"({self.node.os}, kernel {self.node.kernel}; {self.node.inventory}): {self.rule}")


def nodes_from(paths: Sequence[str]) -> List[Node]:
    """The nodes the ``--have`` inventories describe (bundle.json files among them skipped)."""
    nodes = []
    for path in paths:
        raw = read_file_limited(path, MAX_ENGINE_JSON, path)
        doc = parse_json(raw, path)
        if not (isinstance(doc, dict) and doc.get("kind") == "inventory"):
            continue
        inv = load_inventory(raw, what=path)
        raw_node, raw_host = inv.get("node"), inv.get("host")
        node: Dict[str, Any] = raw_node if isinstance(raw_node, dict) else {}
        host: Dict[str, Any] = raw_host if isinstance(raw_host, dict) else {}
        name = host.get("hostname") if isinstance(host.get("hostname"), str) else path
        plat = of_dict(inv.get("platform"))
        if plat is None and isinstance(node.get("architecture"), str):
            plat = of_dict({"os": "linux", "architecture": node["architecture"]})
        nodes.append(Node(str(name)[:100], path, os_tag(node), kernel_of(node), plat))
    return nodes


def node_image(spec: DriverSpec, node: Node) -> NodeImage:
    """The image ``spec`` makes the operator pull on ``node``; UsageError when the node's inventory
    lacks what the tag needs, ManifestImagesError where the operator itself would refuse."""
    where = spec.origin.text()
    if node.os is None:
        raise UsageError(f"computing the {spec.component} image of {where} for node {node.name}: expected the node's "
                         f"os-release ID and VERSION_ID in {node.inventory}, found none (an inventory before 1.4?)",
                         hint="take the inventory again on that node with this release: bundle-import --inventory")
    if spec.precompiled and node.kernel is None:
        raise UsageError(f"computing the precompiled driver image of {where} for node {node.name}: expected the "
                         f"node's kernel release in {node.inventory}, found none",
                         hint="take the inventory again on that node with this release: bundle-import --inventory")
    repo, image, version = spec.repository, spec.image, spec.version
    if spec.precompiled and "sha256:" in version:
        raise ManifestImagesError(f"computing the precompiled driver image of {where}: expected a driver branch "
                                  f"as version (e.g. 570), found a digest ({version[:80]})",
                                  hint="the operator refuses a digest with usePrecompiled (GetPrecompiledImagePath)")
    if spec.precompiled and spec.crd == "ClusterPolicy":
        if not repo and not version:
            if not image:
                raise ManifestImagesError(f"computing the precompiled driver image of {where}: expected "
                                          "driver.repository, driver.image and driver.version, found none")
            path = f"{image}-{node.kernel}"
        else:
            path = f"{repo}/{image}:{version}-{node.kernel}"
        rule = "controllers/object_controls.go resolveDriverTag: repository/image:version-<kernel>-<os>"
    else:
        base = operand_image(repo, image, version)
        if base is None:
            raise ManifestImagesError(f"computing the {spec.component} image of {where}: expected repository, image "
                                      "and version, found none (the operator would read DRIVER_IMAGE from its own "
                                      "environment)", hint="set them in the ClusterPolicy (driver.repository, "
                                      "driver.image, driver.version)")
        path = f"{base}-{node.kernel}" if spec.precompiled else base
        rule = ("api/nvidia/v1alpha1/nvidiadriver_types.go " +
                ("GetPrecompiledImagePath: repository/image:version-<kernel>-<os>" if spec.precompiled
                 else "GetImagePath: repository/image:version-<os>")) if spec.crd == "NVIDIADriver" else \
            "controllers/object_controls.go resolveDriverTag: repository/image:version-<os>"
    if "sha256:" not in path:
        path = f"{path}-{node.os}"
    else:
        rule += " (a digest: used as it is)"
    return NodeImage(path, node, spec, rule)


def node_images(specs: Sequence[DriverSpec], nodes: Sequence[Node]) -> List[NodeImage]:
    """Every driver image every node pulls (a node list empty: UsageError naming the manifests' drivers)."""
    if specs and not nodes:
        first = specs[0]
        raise UsageError(f"reading the manifests: {first.origin.text()} deploys the GPU driver, whose image tag "
                         "depends on each node's OS (and kernel, precompiled): expected node inventories, found none",
                         hint="pass each kind of GPU node's `bundle-import --inventory` output with --have FILE "
                         "(repeatable); or set driver.enabled: false when the nodes have a driver installed")
    return [node_image(spec, node) for spec in specs for node in nodes]


def check_exist(images: Sequence[NodeImage], exists: Callable[[str], bool]) -> None:
    """Refuse (DriverImageMissing) when a node's driver image does not exist at its registry: named
    by node, OS and kernel, with the way out (the compile path and a package mirror)."""
    missing: Dict[str, List[NodeImage]] = {}
    for image in images:
        if image.ref not in missing and not exists(image.ref):
            missing[image.ref] = []
        if image.ref in missing:
            missing[image.ref].append(image)
    if not missing:
        return
    lines = []
    precompiled = False
    for ref, users in missing.items():
        spec = users[0].spec
        nodes = ", ".join(f"{u.node.name} ({u.node.os}, kernel {u.node.kernel})" for u in users)
        if spec.precompiled:
            precompiled = True
            lines.append(f"no precompiled driver for {users[0].node.kernel} ({users[0].node.os}): {ref} does not "
                         f"exist (nodes {nodes})")
        else:
            lines.append(f"no {spec.component} image for {users[0].node.os}: {ref} does not exist (nodes {nodes})")
    hint = ("use the compile path (driver.usePrecompiled: false) and a package mirror for the kernel headers, "
            "or run a kernel NVIDIA publishes precompiled drivers for" if precompiled else
            "NVIDIA publishes driver images for some OS releases only: build one "
            "(github.com/NVIDIA/gpu-driver-container) into your registry, or run a supported OS")
    raise DriverImageMissing(f"exporting the GPU driver images: {lines[0]}", context="\n".join(lines), hint=hint)


def registry_exists(access: Any = None) -> Callable[[str], bool]:
    """``exists(ref)``: the registry answers the reference's manifest (HEAD)."""
    from importer.format.refs import normalize, split_domain, split_ref
    from importer.registry.client import RegistryClient, parse_target

    clients: Dict[str, Any] = {}

    def exists(ref: str) -> bool:
        name, tag, digest = split_ref(normalize(ref))
        host, repo = split_domain(name)
        server = DOCKER_HUB_API if host == DOCKER_HUB else host
        if server not in clients:
            clients[server] = RegistryClient(parse_target(server))
            clients[server].ping()  # HTTPS, or plain HTTP where allowed (loopback)
        return clients[server].manifest_digest(repo, digest or tag) is not None

    return exists


def platforms_of(nodes: Sequence[Node]) -> Tuple[str, ...]:
    """The platforms the nodes run (each once), for the export's ``--platform``."""
    out: List[str] = []
    for n in nodes:
        if n.platform is not None and not any(n.platform.matches(of_dict(_p(p)) or n.platform) for p in out):
            out.append(str(n.platform.normalized()))
    return tuple(out)


def _p(text: str) -> Dict[str, str]:
    parts = text.split("/")
    return {"os": parts[0], "architecture": parts[1], **({"variant": parts[2]} if len(parts) > 2 else {})}
