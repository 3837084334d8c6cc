"""`bundle export --images-from-manifests FILE|-` (issue 43): every image rendered manifests make a
cluster pull, found in a hand-rendered GPU Operator chart v25.3.4 (tests/data/) and a plain chart
(Deployment, Job, CronJob with init containers, a Pod with an ephemeral container and an image
volume); the GPU driver's tag per node computed as the operator computes it (compiled
`<version>-<os>`, precompiled `<branch>-<kernel>-<os>`); `--why`; the inventory's `node` (1.4);
hostile YAML refused with one `manifest-images` line. Engine-free and fast (the registry side:
tests/test_pull_check.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle.gpudriver import DriverImageMissing, Node, check_exist, node_image, node_images, nodes_from
from bundle.k8simages import MAX_BYTES, DriverSpec, ManifestImagesError, Origin, read_manifests, scan_text
from bundle.pullcheck import export_name, manifest_plan
from importer.format.platform import Platform
from importer.inventory.engine import checksum
from importer.inventory.nodefacts import kernel_flavour, node_facts, parse_os_release
from tests.kit.clijson import validate
from tests.kit.helpers import REPO, run_cli

DATA = REPO / "tests" / "data"
GPU_OPERATOR = str(DATA / "gpu-operator-v25.3.4-rendered.yaml")
PLAIN = str(DATA / "plain-chart-rendered.yaml")
#: what the GPU Operator chart v25.3.4 deploys with its default values (clusterpolicy.yaml, operator.yaml,
#: the NFD subchart): dcgm, nodeStatusExporter, gds, gdrcopy and the sandbox operands are off
OPERATOR_IMAGES = [
    "registry.k8s.io/nfd/node-feature-discovery:v0.17.3",
    "nvcr.io/nvidia/gpu-operator:v25.3.4",
    "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.4",
    "nvcr.io/nvidia/cuda:13.0.1-base-ubi9",
    "nvcr.io/nvidia/k8s/container-toolkit:v1.17.8-ubuntu20.04",
    "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
    "nvcr.io/nvidia/k8s/dcgm-exporter:4.3.1-4.4.0-ubuntu22.04",
    "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.12.3-ubuntu20.04",
    "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1",
]


def inventory(path: Path, host: str, os_id: str, version: str, kernel: str, arch: str = "amd64") -> str:
    """A checksummed inventory 1.4 of one node (what `bundle-import --inventory` prints there)."""
    doc = {"inventoryVersion": "1.4", "kind": "inventory", "tool": {"name": "sneakernet", "version": "test"},
           "created": "2025-01-01T00:00:00Z",
           "host": {"hostname": host, "os": "Linux", "kernel": kernel, "machine": "x86_64", "python": "3.11"},
           "engine": {"kind": "containerd", "version": "2.0.4", "storageDriver": "overlayfs",
                      "imageStore": "containerd", "address": "/run/containerd/containerd.sock", "dataRoot": None},
           "platform": {"os": "linux", "architecture": arch, **({"variant": "v8"} if arch == "arm64" else {})},
           "node": {"osRelease": {"ID": os_id, "VERSION_ID": version}, "kernelRelease": kernel,
                    "kernelFlavour": kernel_flavour(kernel), "architecture": arch},
           "images": [{"id": "sha256:" + "1" * 64, "names": ["registry.k8s.io/pause:3.8"], "configDigest": None,
                       "manifestDigest": None, "diffIds": ["sha256:" + "2" * 64], "blobs": None, "problems": []}]}
    doc["checksum"] = checksum(doc)
    path.write_text(json.dumps(doc))
    return str(path)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def precompiled(text: str) -> str:
    return text.replace("usePrecompiled: false", "usePrecompiled: true").replace('version: "580.82.07"',
                                                                                  'version: "580"')


# ------------------------------------------------------------------ discovery


def test_every_operand_of_the_gpu_operator_chart_with_its_tag() -> None:
    found = read_manifests(GPU_OPERATOR)
    assert list(found.images) == OPERATOR_IMAGES
    driver, = found.drivers
    assert (driver.component, driver.crd, driver.repository, driver.image, driver.version, driver.precompiled) == (
        "driver", "ClusterPolicy", "nvcr.io/nvidia", "driver", "580.82.07", False)
    operator = found.images["nvcr.io/nvidia/gpu-operator:v25.3.4"].origins
    assert [(o.kind, o.name, o.field, o.source) for o in operator] == [
        ("Deployment", "gpu-operator", "spec.template.spec.containers[0].image",
         "gpu-operator/templates/operator.yaml"),
        ("Job", "gpu-operator-upgrade-crd", "spec.template.spec.containers[0].image",
         "gpu-operator/templates/upgrade_crd.yaml")]


def test_the_driver_tag_per_node_compiled_and_precompiled(tmp_path: Path) -> None:
    """Two inventories: the compiled path gives `<version>-<os>` (one image per OS), the
    precompiled path `<branch>-<kernel>-<os>` (one per kernel), as resolveDriverTag makes them."""
    a = inventory(tmp_path / "a.json", "gpu-a", "ubuntu", "22.04", "5.15.0-139-generic")
    b = inventory(tmp_path / "b.json", "gpu-b", "ubuntu", "24.04", "6.8.0-1021-aws", "arm64")
    plan = manifest_plan([GPU_OPERATOR], [a, b])
    assert [(d.node.name, d.ref) for d in plan.drivers] == [
        ("gpu-a", "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04"),
        ("gpu-b", "nvcr.io/nvidia/driver:580.82.07-ubuntu24.04")]
    assert plan.refs == [*OPERATOR_IMAGES, "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04",
                         "nvcr.io/nvidia/driver:580.82.07-ubuntu24.04", "registry.k8s.io/pause:3.10"]
    f = write(tmp_path / "pre.yaml", precompiled(Path(GPU_OPERATOR).read_text()))
    plan = manifest_plan([f], [a, b], pause=None)
    assert [d.ref for d in plan.drivers] == ["nvcr.io/nvidia/driver:580-5.15.0-139-generic-ubuntu22.04",
                                             "nvcr.io/nvidia/driver:580-6.8.0-1021-aws-ubuntu24.04"]
    assert plan.refs[-1] == "nvcr.io/nvidia/driver:580-6.8.0-1021-aws-ubuntu24.04"


@pytest.mark.parametrize("crd, repo, image, version, pre, want", [
    ("ClusterPolicy", "nvcr.io/nvidia", "driver", "sha256:" + "a" * 64, False,
     "nvcr.io/nvidia/driver@sha256:" + "a" * 64),
    ("ClusterPolicy", "", "my.reg/driver:580.82.07", "", False, "my.reg/driver:580.82.07-rhel9.4"),
    ("ClusterPolicy", "", "my.reg/driver:580", "", True, "my.reg/driver:580-5.14.0-427.el9.x86_64-rhel9.4"),
    ("NVIDIADriver", "nvcr.io/nvidia", "driver", "570", True,
     "nvcr.io/nvidia/driver:570-5.14.0-427.el9.x86_64-rhel9.4"),
    ("NVIDIADriver", "nvcr.io/nvidia", "driver", "570.195.03", False, "nvcr.io/nvidia/driver:570.195.03-rhel9.4"),
])
def test_the_operators_rules_for_digests_and_bare_images(crd: str, repo: str, image: str, version: str, pre: bool,
                                                        want: str) -> None:
    node = Node("rhel-1", "rhel.json", "rhel9.4", "5.14.0-427.el9.x86_64", Platform("linux", "amd64"))
    spec = DriverSpec("driver", crd, repo, image, version, pre, Origin("f", 1, 1, crd, "", "x", "spec.driver"))
    assert node_image(spec, node).ref == want


def test_precompiled_with_a_digest_and_no_inventory_are_refused() -> None:
    node = Node("n", "n.json", "ubuntu22.04", "5.15.0-139-generic", None)
    spec = DriverSpec("driver", "NVIDIADriver", "nvcr.io/nvidia", "driver", "sha256:" + "b" * 64, True,
                      Origin("f", 1, 1, "NVIDIADriver", "", "d", "spec"))
    with pytest.raises(ManifestImagesError, match="found a digest"):
        node_image(spec, node)
    with pytest.raises(Exception, match="expected node inventories, found none") as e:
        node_images([spec], [])
    assert getattr(e.value, "reference", "") == "usage"


def test_a_missing_precompiled_driver_is_refused_naming_node_and_kernel() -> None:
    nodes = [Node("gpu-a", "a.json", "ubuntu22.04", "5.15.0-139-generic", None)]
    spec = DriverSpec("driver", "ClusterPolicy", "nvcr.io/nvidia", "driver", "570", True,
                      Origin("f", 1, 1, "ClusterPolicy", "", "cluster-policy", "spec.driver"))
    with pytest.raises(DriverImageMissing) as e:
        check_exist(node_images([spec], nodes), lambda ref: False)
    assert e.value.exit_code == 5 and e.value.reference == "driver-image-missing"
    assert "no precompiled driver for 5.15.0-139-generic" in e.value.message and "gpu-a" in str(e.value.context)
    assert "use the compile path" in str(e.value.hint) and "package mirror" in str(e.value.hint)
    check_exist(node_images([spec], nodes), lambda ref: True)


def test_a_plain_chart_every_kind_and_field() -> None:
    found = read_manifests(PLAIN)
    where = {ref: [(o.document, o.kind, o.field) for o in image.origins] for ref, image in found.images.items()}
    assert where == {
        "ghcr.io/example/web:2.1.0": [(1, "Deployment", "metadata.annotations[artifacthub.io/images][0].image"),
                                      (1, "Deployment", "spec.template.spec.containers[0].image")],
        "quay.io/prometheus/statsd-exporter:v0.28.0": [
            (1, "Deployment", "metadata.annotations[artifacthub.io/images][1].image"),
            (1, "Deployment", "spec.template.spec.containers[1].image")],
        "busybox:1.36": [(1, "Deployment", "spec.template.spec.initContainers[0].image"),
                         (4, "Pod", "spec.containers[0].image")],
        "ghcr.io/example/web-migrate@sha256:4c5f8b2e1c0d9a7b6e3f2a1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b": [
            (2, "Job", "spec.template.spec.containers[0].image")],
        "docker.io/curlimages/curl:8.11.1": [
            (3, "CronJob", "spec.jobTemplate.spec.template.spec.initContainers[0].image")],
        "ghcr.io/example/report:1.4@sha256:0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c": [
            (3, "CronJob", "spec.jobTemplate.spec.template.spec.containers[0].image")],
        "nicolaka/netshoot:v0.13": [(4, "Pod", "spec.ephemeralContainers[0].image")],
        "ghcr.io/example/models:v3": [(4, "Pod", "spec.volumes[0].image.reference")],
    }
    # the names a bundle gives them: what containerd asks a mirror for; a digest stays the pull's
    assert export_name("busybox:1.36") == "docker.io/library/busybox:1.36"
    assert export_name("ghcr.io/example/report:1.4@sha256:" + "0" * 64) == "ghcr.io/example/report:1.4"
    assert export_name("ghcr.io/example/web-migrate@sha256:4c5f" + "0" * 60) == \
        "ghcr.io/example/web-migrate:pinned-4c5f00000000"


def test_helm_images_annotation_list_nic_cluster_policy_and_nvidia_driver() -> None:
    text = """\
apiVersion: v1
kind: List
items:
- apiVersion: mellanox.com/v1alpha1
  kind: NicClusterPolicy
  metadata: {name: nic-cluster-policy}
  spec:
    rdmaSharedDevicePlugin: {image: k8s-rdma-shared-dev-plugin, repository: nvcr.io/nvidia/mellanox, version: "v1.5.2"}
    secondaryNetwork:
      multus: {image: multus-cni, repository: ghcr.io/k8snetworkplumbingwg, version: "v4.1.0"}
- apiVersion: nvidia.com/v1alpha1
  kind: NVIDIADriver
  metadata:
    name: default
    annotations:
      helm.sh/images: |
        - name: extra
          image: nvcr.io/nvidia/cloud-native/extra:1
  spec:
    usePrecompiled: false
    repository: nvcr.io/nvidia
    image: driver
    version: "570.195.03"
    manager: {repository: nvcr.io/nvidia/cloud-native, image: k8s-driver-manager, version: "v0.8.1"}
    gds: {enabled: true, repository: nvcr.io/nvidia/cloud-native, image: nvidia-fs, version: "2.20.5"}
"""
    found = scan_text(text, "list.yaml")
    assert list(found.images) == ["nvcr.io/nvidia/mellanox/k8s-rdma-shared-dev-plugin:v1.5.2",
                                  "ghcr.io/k8snetworkplumbingwg/multus-cni:v4.1.0",
                                  "nvcr.io/nvidia/cloud-native/extra:1",
                                  "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1"]
    node = Node("n", "n.json", "ubuntu22.04", "5.15.0-139-generic", None)
    assert [node_image(d, node).ref for d in found.drivers] == [
        "nvcr.io/nvidia/driver:570.195.03-ubuntu22.04", "nvcr.io/nvidia/cloud-native/nvidia-fs:2.20.5-ubuntu22.04"]


# ------------------------------------------------------------------ --why and the command line


def test_why_names_document_field_and_node(tmp_path: Path) -> None:
    a = inventory(tmp_path / "a.json", "gpu-a", "ubuntu", "22.04", "5.15.0-139-generic")
    proc = run_cli("bundle", "export", "--images-from-manifests", GPU_OPERATOR, "--have", a,
                   "--why", "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04",
                   "--why", "nvcr.io/nvidia/gpu-operator:v25.3.4")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any("document 7 ClusterPolicy/cluster-policy, gpu-operator/templates/clusterpolicy.yaml: spec.driver "
               "(ClusterPolicy driver, compiled) for node gpu-a (ubuntu22.04, kernel 5.15.0-139-generic" in line
               and "resolveDriverTag" in line for line in lines), lines
    assert any(":364: document 6 Deployment/gpu-operator/gpu-operator" in line for line in lines), lines
    proc = run_cli("bundle", "export", "--images-from-manifests", "-", "--why", "busybox", "--json",
                   input=Path(PLAIN).read_text())
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["id"] == "manifest-images"
    proc = run_cli("bundle", "export", "--images-from-manifests", "-", "--why", "docker.io/library/busybox:1.36",
                   "--json", input=Path(PLAIN).read_text())
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and len(doc["why"][0]["from"]) == 2, proc.stderr
    validate("why", doc)


def test_export_without_an_inventory_is_refused_before_anything(tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "--images-from-manifests", GPU_OPERATOR, "-o", str(tmp_path / "b"), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2 and doc["error"]["id"] == "usage" and "expected node inventories" in \
        doc["error"]["message"], proc.stderr
    assert not (tmp_path / "b").exists()


def test_nodes_from_inventories_and_the_inventory_node(tmp_path: Path) -> None:
    a = inventory(tmp_path / "a.json", "gpu-a", "ubuntu", "22.04", "5.15.0-139-generic")
    b = inventory(tmp_path / "b.json", "gpu-b", "rhel", "9.4", "5.14.0-427.13.1.el9_4.aarch64", "arm64")
    assert [n.to_dict() for n in nodes_from([a, b])] == [
        {"name": "gpu-a", "inventory": a, "os": "ubuntu22.04", "kernel": "5.15.0-139-generic",
         "platform": "linux/amd64"},
        {"name": "gpu-b", "inventory": b, "os": "rhel9.4", "kernel": "5.14.0-427.13.1.el9_4.aarch64",
         "platform": "linux/arm64/v8"}]
    assert parse_os_release('NAME="Ubuntu"\nID=ubuntu\nVERSION_ID="22.04"\n# c\nbad line\n') == \
        {"NAME": "Ubuntu", "ID": "ubuntu", "VERSION_ID": "22.04"}
    assert [kernel_flavour(k) for k in ("5.15.0-139-generic", "6.1.0-18-cloud-amd64", "6.8.0-1021-aws",
                                        "5.14.0-427.13.1.el9_4.x86_64")] == ["generic", "cloud-amd64", "aws", None]
    rel = write(tmp_path / "os-release", 'ID=rocky\nVERSION_ID="9.5"\n')
    facts = node_facts((rel,), kernel="5.14.0-503.el9.x86_64")
    assert facts["osRelease"] == {"ID": "rocky", "VERSION_ID": "9.5"} and facts["kernelFlavour"] is None


# ------------------------------------------------------------------ hostile YAML


HOSTILE = {
    "billion-laughs": "kind: Pod\n" + 'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
    + "".join(f"{chr(98 + n)}: &{chr(98 + n)} [{', '.join([f'*{chr(97 + n)}'] * 10)}]\n" for n in range(7))
    + "spec: {containers: *h}\n",
    "deep": "kind: Pod\nspec: " + "[" * 5000 + "]" * 5000 + "\n",
    "alias-cycle": "kind: Pod\nspec: &s {containers: [*s]}\n",
    "python-tag": "kind: Pod\nspec:\n  containers:\n  - image: !!python/object/apply:os.system ['id']\n",
    "custom-tag": "kind: Pod\nspec:\n  containers:\n  - image: !ref busybox:1\n",
    "duplicate-key": "kind: Pod\nspec:\n  containers:\n  - image: busybox:1\n    image: evil.example/x:1\n",
    "number": "kind: ClusterPolicy\nspec:\n  toolkit: {repository: nvcr.io/nvidia/k8s, image: container-toolkit, "
    "version: 1.10}\n",
    "list-image": "kind: Pod\nspec:\n  containers:\n  - image: [a, b]\n",
    "template-left": "kind: Pod\nspec:\n  containers:\n  - image: '{{ .Values.image }}'\n",
    "bad-ref": "kind: Pod\nspec:\n  containers:\n  - image: 'UPPER/Case:1'\n",
    "not-a-mapping": "- kind: Pod\n",
    "broken": "kind: Pod\nspec: [\n",
    "annotation-bomb": "kind: Deployment\nmetadata:\n  annotations:\n    helm.sh/images: '" + "[" * 50 + "]" * 50
    + "'\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_yaml_is_one_typed_error(tmp_path: Path, name: str) -> None:
    f = write(tmp_path / f"{name}.yaml", HOSTILE[name])
    with pytest.raises(ManifestImagesError) as e:
        read_manifests(f)
    assert e.value.exit_code == 2 and e.value.reference == "manifest-images" and f in e.value.message
    proc = run_cli("bundle", "export", "--images-from-manifests", f, "--why", "x", "--json", timeout=60)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["id"] == "manifest-images", proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error[manifest-images]: reading the manifests")


def test_huge_and_non_utf8_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(ManifestImagesError, match=f"expected at most {MAX_BYTES} bytes"):
        read_manifests(str(big))
    (tmp_path / "latin1.yaml").write_bytes(b"kind: Pod\nmetadata: {name: caf\xe9}\n")
    with pytest.raises(ManifestImagesError, match="expected UTF-8 YAML, found a byte that is not"):
        read_manifests(str(tmp_path / "latin1.yaml"))
    with pytest.raises(ManifestImagesError, match="expected a readable file"):
        read_manifests(str(tmp_path / "absent.yaml"))
