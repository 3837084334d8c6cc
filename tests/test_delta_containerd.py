"""Delta bundles into a real standalone containerd: the layers a delta leaves out come from the
content store (the blob itself, or a stored blob decompressed back to the diff_id), the base
check stops before anything is imported, and the post-load check is the full bundle's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kit.engine_stores import containerd_dir, ctr
from tests.kit.helpers import docker, run_cli
from tests.kit.imagegen import base_and_update

pytestmark = pytest.mark.engine
SNAP = "native"


@pytest.fixture(scope="module")
def train(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("dctr")
    base_and_update(docker_host, busybox, root, "dctr/train", weights=2 << 20, code="print('week 2')\n" * 200)
    full_a = root / "a.bundle"
    # zstd, not the default auto: the random weights would be stored uncompressed, and containerd then
    # holds the base's blob under the layer's own digest, so no rebuild (the path tested here) runs
    run_cli("bundle", "export", "dctr/train:1", "--compression", "zstd", "-o", str(full_a), docker_host=docker_host,
            check=True)
    return {"root": root, "full_a": full_a, "a": json.loads((full_a / "bundle.json").read_text())}


def _import(bundle: Path, address: str, namespace: str, *extra: str) -> object:
    return run_cli("importer", str(bundle), "--verify", "--engine", "containerd", "--address", address,
                   "--namespace", namespace, "--snapshotter", SNAP, "--no-receipt", *extra)


def _export_delta(docker_host: str, have: Path, out: Path) -> dict:
    run_cli("bundle", "export", "dctr/train:2", "--have", str(have), "--compression", "zstd", "-o", str(out),
            docker_host=docker_host, check=True)
    return json.loads((out / "bundle.json").read_text())


def _docker_inventory_with_a(docker_host_vfs: str, train: dict) -> str:
    """The inventory of a Docker host (the vfs engine) that holds only the base of dctr/train."""
    docker(docker_host_vfs, "image", "rm", "dctr/train:2", check=False)
    proc = run_cli("importer", str(train["full_a"]), "--docker-host", docker_host_vfs, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    return run_cli("importer", "--inventory", "--engine", "docker", "--docker-host", docker_host_vfs,
                   check=True).stdout


def _names(address: str, namespace: str) -> list:  # type: ignore[type-arg]
    return sorted(ctr(address, namespace, "images", "ls", "-q").split())


def _with_base(address: str, namespace: str, train: dict) -> None:
    proc = _import(train["full_a"], address, namespace)
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]


def _check_b(address: str, namespace: str, delta: dict, proc: object) -> None:
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    image = delta["images"][0]
    rows = [line.split() for line in ctr(address, namespace, "images", "ls").splitlines()[1:]]
    held = {r[0]: r[2] for r in rows}
    assert held["docker.io/dctr/train:2"] == image["manifest"]["digest"]  # the delta's own manifest
    check = ctr(address, namespace, "images", "check", "--snapshotter", SNAP, "name==docker.io/dctr/train:2")
    assert "complete (" in check and check.split()[-1] == "true", check
    config = json.loads(ctr(address, namespace, "content", "get", image["config"]["digest"]))
    assert config["rootfs"]["diff_ids"] == [x["diffId"] for x in image["layers"]]


def test_delta_naming_the_base_blobs_completes_from_the_content_store(
        docker_host: str, containerd_address: str, train: dict, tmp_path: Path) -> None:
    ns = "delta-blobs"
    _with_base(containerd_address, ns, train)
    delta = _export_delta(docker_host, train["full_a"] / "bundle.json", tmp_path / "d")
    layers = delta["images"][0]["layers"]
    assert [x.get("external", False) for x in layers] == [True, True, False]
    # the external layers name the base bundle's own compressed blobs, which containerd keeps
    assert [x["digest"] for x in layers[:2]] == [x["digest"] for x in train["a"]["images"][0]["layers"]]
    assert len(list((tmp_path / "d" / "blobs" / "sha256").iterdir())) == 3  # new layer, config, manifest
    _check_b(containerd_address, ns, delta, _import(tmp_path / "d", containerd_address, ns))
    assert "docker.io/sneakernet-staging" not in " ".join(_names(containerd_address, ns))


def test_delta_from_the_containerd_inventory(docker_host: str, containerd_address: str, train: dict,
                                            tmp_path: Path) -> None:
    ns = "delta-inventory"
    _with_base(containerd_address, ns, train)
    inventory = run_cli("importer", "--inventory", "--engine", "containerd", "--address", containerd_address,
                        "--namespace", ns, "--snapshotter", SNAP, check=True).stdout
    (tmp_path / "have.json").write_text(inventory)
    delta = _export_delta(docker_host, tmp_path / "have.json", tmp_path / "d")
    layers = delta["images"][0]["layers"]
    blobs = {b["digest"] for img in json.loads(inventory)["images"] for b in img["blobs"] or []}
    assert [x["digest"] in blobs for x in layers] == [True, True, False]
    _check_b(containerd_address, ns, delta, _import(tmp_path / "d", containerd_address, ns))


def test_delta_from_a_docker_inventory_is_rebuilt_from_stored_blobs(
        docker_host: str, docker_host_vfs: str, containerd_address: str, train: dict, tmp_path: Path) -> None:
    """External layers named only by diff_id: containerd's compressed copies are decompressed
    back into the uncompressed tars the delta's manifest names, and checked."""
    ns = "delta-docker-inventory"
    _with_base(containerd_address, ns, train)
    inventory = _docker_inventory_with_a(docker_host_vfs, train)
    (tmp_path / "have.json").write_text(inventory)
    delta = _export_delta(docker_host, tmp_path / "have.json", tmp_path / "d")
    layers = delta["images"][0]["layers"]
    assert [x["digest"] == x["diffId"] for x in layers] == [True, True, False]
    _check_b(containerd_address, ns, delta, _import(tmp_path / "d", containerd_address, ns))
    content = ctr(containerd_address, ns, "content", "ls", "-q").split()
    assert layers[1]["diffId"] in content  # containerd now keeps the uncompressed tar too


def test_containerd_without_the_base_loads_nothing(docker_host: str, containerd_address: str, train: dict,
                                                  tmp_path: Path) -> None:
    ns = "delta-no-base"
    delta = _export_delta(docker_host, train["full_a"] / "bundle.json", tmp_path / "d")
    proc = _import(tmp_path / "d", containerd_address, ns)
    assert proc.returncode == 9, proc.stderr
    assert "error[delta-base-missing]" in proc.stderr
    first = delta["images"][0]["layers"][0]
    assert f"host lacks layer {first['diffId']} required by dctr/train:2" in proc.stderr
    assert f"holds no blob {first['digest']}" in proc.stderr
    assert _names(containerd_address, ns) == []


def test_a_damaged_stored_base_layer_stops_the_rebuild(docker_host: str, docker_host_vfs: str,
                                                      containerd_address: str, train: dict, tmp_path: Path) -> None:
    """The blob containerd keeps for the base's weights layer is changed on disk: rebuilding the
    uncompressed tar finds the wrong diff_id, and the import leaves nothing tagged."""
    ns = "delta-damaged"
    _with_base(containerd_address, ns, train)
    inventory = _docker_inventory_with_a(docker_host_vfs, train)
    (tmp_path / "have.json").write_text(inventory)
    _export_delta(docker_host, tmp_path / "have.json", tmp_path / "d")
    weights = train["a"]["images"][0]["layers"][1]["digest"]
    blob = next(containerd_dir("test").rglob(weights.split(":")[1]))
    before = _names(containerd_address, ns)
    original = blob.read_bytes()
    try:
        damaged = bytearray(original)
        damaged[len(damaged) // 2] ^= 0xFF
        blob.write_bytes(bytes(damaged))
        proc = _import(tmp_path / "d", containerd_address, ns)
    finally:
        blob.write_bytes(original)
    assert proc.returncode == 3, proc.stderr  # a wrong diff_id, or zstd refusing the damaged frame
    assert "rebuilding layer" in proc.stderr and "import the base bundle again" in proc.stderr
    assert _names(containerd_address, ns) == before
    docker(docker_host, "image", "inspect", "dctr/train:2")  # the build host's image is untouched
