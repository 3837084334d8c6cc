"""`bundle check --manifests FILE --against BUNDLE|REGISTRY --have ...` (issue 43): before the trip,
every reference the manifests make each node pull, resolved as containerd resolves it (Docker Hub's
`docker.io/library/`, a mirror's path prefix, the GPU driver's tag for each node's OS), for each
node's platform. Bundles built with the kit (OCI layouts of three-platform indexes), pushed into a
loopback docker-registry: a good bundle passes; a bad one has no `pause` image, a single-platform
copy of a multi-arch index and only another OS's driver tag, each caught with its reason (exit 8).
Then `bundle export --images-from-manifests` from that registry, checked: nothing is missing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundle.export import export_images
from importer.inventory.engine import checksum
from importer.inventory.nodefacts import kernel_flavour
from tests.kit import engines
from tests.kit.clijson import failed, ok, validate
from tests.kit.engines import Registry
from tests.kit.fixtures import AUTH_USER
from tests.kit.fixtures import auth_registry as auth_registry  # the fixture, one per module
from tests.kit.helpers import run_cli
from tests.kit.layoutgen import named_indexes_layout

PAUSE = "registry.k8s.io/pause:3.10"
BUSYBOX = "docker.io/library/busybox:1.36"
WEB = "ghcr.io/example/web:2.1.0"
VALIDATOR = "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.4"
DRIVER_22 = "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04"
DRIVER_24 = "nvcr.io/nvidia/driver:580.82.07-ubuntu24.04"


def manifests(host: str = "") -> str:
    """A Deployment (a Docker Hub short name, a multi-arch image) and a ClusterPolicy (validator,
    compiled driver); ``host``: the registry every image is named in (else their real homes)."""
    hub = f"{host}/library/busybox:1.36" if host else "busybox:1.36"
    web = f"{host}/example/web:2.1.0" if host else WEB
    nv = f"{host}/nvidia" if host else "nvcr.io/nvidia"
    return f"""\
---
# Source: web/templates/deployment.yaml
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: shop}}
spec:
  template:
    spec:
      initContainers: [{{name: wait, image: "{hub}"}}]
      containers: [{{name: web, image: "{web}"}}]
---
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {{name: cluster-policy}}
spec:
  validator: {{repository: {nv}/cloud-native, image: gpu-operator-validator, version: "v25.3.4"}}
  driver: {{enabled: true, usePrecompiled: false, repository: {nv}, image: driver, version: "580.82.07"}}
"""


def inventory(path: Path, host: str, version: str, kernel: str, arch: str) -> str:
    doc = {"inventoryVersion": "1.4", "kind": "inventory", "tool": {"name": "sneakernet", "version": "test"},
           "created": "2025-01-01T00:00:00Z",
           "host": {"hostname": host, "os": "Linux", "kernel": kernel, "machine": arch, "python": "3.11"},
           "engine": {"kind": "containerd", "version": "2.0.4", "storageDriver": "overlayfs",
                      "imageStore": "containerd", "address": "/run/containerd/containerd.sock", "dataRoot": None},
           "platform": {"os": "linux", "architecture": arch, **({"variant": "v8"} if arch == "arm64" else {})},
           "node": {"osRelease": {"ID": "ubuntu", "VERSION_ID": version}, "kernelRelease": kernel,
                    "kernelFlavour": kernel_flavour(kernel), "architecture": arch},
           "images": [{"id": "sha256:" + "1" * 64, "names": ["registry.k8s.io/pause:3.8"], "configDigest": None,
                       "manifestDigest": None, "diffIds": ["sha256:" + "2" * 64], "blobs": None, "problems": []}]}
    doc["checksum"] = checksum(doc)
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pullcheck")
    good_refs = [PAUSE, BUSYBOX, WEB, VALIDATOR, DRIVER_22, DRIVER_24]
    named_indexes_layout(root / "layout", good_refs)
    good = export_images([f"oci:{root / 'layout'}:{r}" for r in good_refs], str(root / "good.bundle"),
                         compression="gzip", all_platforms=True).path
    bad_refs = [BUSYBOX, WEB, VALIDATOR, DRIVER_22]  # no pause, no ubuntu24.04 driver
    bad = export_images([f"oci:{root / 'layout'}:{r}" for r in bad_refs], str(root / "bad.bundle"),
                        compression="gzip", platforms=["linux/amd64"],  # single-platform copies
                        tags=["busybox:1.36", WEB, VALIDATOR, DRIVER_22]).path  # busybox short: not served right
    return {"good": good, "bad": bad, "a": inventory(root / "a.json", "gpu-a", "22.04", "5.15.0-139-generic", "amd64"),
            "b": inventory(root / "b.json", "gpu-b", "24.04", "6.8.0-1021-aws", "arm64"),
            "manifests": str(_write(root / "rendered.yaml", manifests()))}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def registry(made: dict[str, str]) -> Iterator[Registry]:
    with engines.private_registry(f"pullcheck-{os.getpid()}") as reg:
        for name, target in (("good", reg.addr), ("bad", f"{reg.addr}/bad")):
            proc = run_cli("bundle", "push", made[name], target, "--json")
            assert proc.returncode == 0, proc.stderr
        yield reg


def check(made: dict[str, str], against: str, *extra: str) -> tuple[int, dict]:
    proc = run_cli("bundle", "check", "--manifests", made["manifests"], "--against", against,
                   "--have", made["a"], "--have", made["b"], "--json", *extra)
    return proc.returncode, (ok if proc.returncode == 0 else lambda c, p: failed(c, p, "pull-check-failed", 8))(
        "check", proc)


def failures(doc: dict) -> set[tuple[str, str, str | None]]:
    return {(v["resolved"], v["node"], v["reason"]) for v in doc["checked"] if not v["ok"]}


def test_a_good_bundle_passes(made: dict[str, str]) -> None:
    rc, doc = check(made, made["good"])
    validate("check", doc)  # as check() does: named here so test_cli_json sees the schema exercised
    assert rc == 0 and doc["failures"] == 0 and doc["against"]["kind"] == "bundle"
    asked = {(v["asked"], v["node"]) for v in doc["checked"]}
    assert ("library/busybox:1.36", "gpu-b") in asked and ("nvidia/driver:580.82.07-ubuntu24.04", "gpu-b") in asked
    assert ("nvidia/driver:580.82.07-ubuntu22.04", "gpu-a") in asked and ("pause:3.10", "gpu-a") in asked


def test_a_bad_bundle_each_failure_with_its_reason(made: dict[str, str]) -> None:
    _, doc = check(made, made["bad"])
    found = failures(doc)
    assert ("registry.k8s.io/pause:3.10", "gpu-a", "missing") in found
    assert ("registry.k8s.io/pause:3.10", "gpu-b", "missing") in found
    assert (WEB, "gpu-b", "platform-missing") in found and (WEB, "gpu-a", None) not in found
    assert (DRIVER_24, "gpu-b", "wrong-driver-tag") in found
    assert ("docker.io/library/busybox:1.36", "gpu-a", "not-served") in found
    assert not any(n == "gpu-a" and r.startswith("nvcr.io/nvidia/driver") for r, n, _ in found)
    web = next(v for v in doc["checked"] if v["resolved"] == WEB and v["node"] == "gpu-b")
    assert "single-platform copy" in web["message"] and "linux/arm64" in web["message"]
    assert doc["error"]["context"].count("\n") + 1 == doc["failures"] == len(found)


def test_against_the_registry_the_nodes_pull_from(made: dict[str, str], registry: Registry) -> None:
    rc, doc = check(made, registry.addr)
    assert rc == 0 and doc["failures"] == 0 and doc["against"]["kind"] == "registry", doc
    rc, doc = check(made, f"{registry.addr}/bad")  # a mirror with a path prefix (override_path)
    found = failures(doc)
    assert ("registry.k8s.io/pause:3.10", "gpu-b", "missing") in found
    assert (WEB, "gpu-b", "platform-missing") in found and (DRIVER_24, "gpu-b", "wrong-driver-tag") in found
    assert ("docker.io/library/busybox:1.36", "gpu-a", "missing") in found  # pushed as busybox, asked library/busybox
    proc = run_cli("bundle", "check", "--manifests", made["manifests"], "--against", f"{registry.addr}/bad",
                   "--have", made["a"], "--have", made["b"])
    assert proc.returncode == 8 and proc.stderr.startswith("error[pull-check-failed]: checking what the nodes will "
                                                           "pull"), proc.stderr
    assert "ghcr.io/example/web:2.1.0 on gpu-b (linux/arm64/v8): platform-missing" in proc.stderr


def test_against_a_registry_that_wants_a_login(made: dict[str, str], auth_registry: Registry, tmp_path: Path) -> None:
    """The registry side takes the logins and CA options of every registry command: with
    --username/--password-stdin it checks as against an open one; without a login it fails on the
    login (registry-auth, exit 6), never by calling every image missing; the password is never printed."""
    empty = tmp_path / "no-config"
    empty.mkdir()
    env = {"DOCKER_CONFIG": str(empty)}
    user, password = AUTH_USER
    pushed = run_cli("bundle", "push", made["good"], auth_registry.addr, "--username", user, "--password-stdin",
                     "--json", input=password + "\n", env=env)
    assert pushed.returncode == 0, pushed.stderr
    args = ("bundle", "check", "--manifests", made["manifests"], "--against", auth_registry.addr, "--have", made["a"],
            "--have", made["b"], "--json")
    good = run_cli(*args, "--username", user, "--password-stdin", input=password + "\n", env=env)
    assert good.returncode == 0, good.stdout + good.stderr
    doc = json.loads(good.stdout)
    assert doc["failures"] == 0 and doc["against"]["kind"] == "registry"
    anon = run_cli(*args, env=env)
    assert anon.returncode == 6 and json.loads(anon.stdout)["error"]["id"] == "registry-auth", anon.stdout
    for proc in (good, anon):
        assert password not in proc.stdout + proc.stderr


def test_export_everything_then_nothing_is_missing(made: dict[str, str], registry: Registry, tmp_path: Path) -> None:
    rendered = _write(tmp_path / "rendered.yaml", manifests(registry.addr))
    pause = f"{registry.addr}/pause:3.10"
    out = tmp_path / "cluster.bundle"
    proc = run_cli("bundle", "export", "--images-from-manifests", str(rendered), "--have", made["a"], "--have",
                   made["b"], "--pause-image", pause, "-o", str(out), "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    bundle = json.loads((out / "bundle.json").read_text())
    names = sorted(r for i in bundle["images"] for r in i["refs"])
    assert f"{registry.addr}/nvidia/driver:580.82.07-ubuntu24.04" in names and len(names) == 6
    for image in bundle["images"]:  # the nodes' two platforms, each image an index of them
        assert {image["platform"]["architecture"], *(p["platform"]["architecture"] for p in image["platforms"])} == \
            {"amd64", "arm64"}
    proc = run_cli("bundle", "check", "--manifests", str(rendered), "--against", str(out), "--have", made["a"],
                   "--have", made["b"], "--pause-image", pause)
    assert proc.returncode == 0 and "every image resolves" in proc.stdout, proc.stderr


def test_a_precompiled_driver_the_source_lacks_is_refused_at_export(made: dict[str, str], registry: Registry,
                                                                  tmp_path: Path) -> None:
    text = manifests(registry.addr).replace("usePrecompiled: false", "usePrecompiled: true").replace(
        '"580.82.07"', '"580"')
    rendered = _write(tmp_path / "rendered.yaml", text)
    proc = run_cli("bundle", "export", "--images-from-manifests", str(rendered), "--have", made["a"],
                   "-o", str(tmp_path / "b"), "--json")
    doc = failed("error", proc, "driver-image-missing", 5)
    assert doc["error"]["message"].startswith("exporting the GPU driver images: no precompiled driver for "
                                              "5.15.0-139-generic (ubuntu22.04)")
    assert "gpu-a" in doc["error"]["context"] and "use the compile path" in doc["error"]["hint"]
    assert not (tmp_path / "b").exists()
