"""What the host already holds never breaks an import (issue 38): an engine that also holds an
image with no layers (``FROM scratch`` plus a ``LABEL``) and an untagged (dangling) one takes its
inventory (``bundle-import --inventory``) and completes a delta from its own layers, on Docker's
classic and containerd image stores, podman and containerd. Reported: Docker's delta import
failed with ``command-failed``, its one ``image inspect --format {{json .RootFS.Layers}}`` call
breaking on the image whose RootFS has no Layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importer.engines import EngineImage, inspect_each
from tests.kit import engines, imagegen
from tests.kit.engine_stores import ctr
from tests.kit.helpers import docker, run_cli, run_pyz

pytestmark = pytest.mark.engine

BOTH_STORES = pytest.mark.parametrize("docker_store", sorted(engines.DOCKER_STORES), indirect=True)


@pytest.fixture(scope="module")
def _built() -> dict:  # type: ignore[type-arg]
    return {}


def _build(host: str, busybox: str, root: Path) -> dict:  # type: ignore[type-arg]
    """On ``host``: the odd images, the delta base and update; the base bundle and the delta."""
    odd = imagegen.odd_images(host, root)
    imagegen.base_and_update(host, busybox, root, "odd/train", weights=1 << 20)
    full, delta = root / "full.bundle", root / "delta.bundle"
    run_cli("bundle", "export", "odd/train:1", "-o", str(full), docker_host=host, check=True)
    run_cli("bundle", "export", "odd/train:2", "--have", str(full / "bundle.json"), "-o", str(delta),
            docker_host=host, check=True)
    tar = root / "odd.tar"
    return {**odd, "root": root, "full": full, "delta": delta, "tar": tar, "in_tar": imagegen.zero_layer_archive(tar)}


@pytest.fixture
def odd(docker_store: str, docker_store_host: str, busybox: str, _built: dict,  # type: ignore[type-arg]
        tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    if docker_store not in _built:
        _built[docker_store] = _build(docker_store_host, busybox, tmp_path_factory.mktemp(f"odd-{docker_store}"))
    return _built[docker_store]  # type: ignore[no-any-return]


def _inventory(*args: str) -> dict:  # type: ignore[type-arg]
    proc = run_cli("importer", "--inventory", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@BOTH_STORES
def test_docker_with_a_zero_layer_and_a_dangling_image_inventories_and_completes_a_delta(
        docker_store: str, docker_store_host: str, odd: dict) -> None:  # type: ignore[type-arg]
    host = docker_store_host
    doc = _inventory("--engine", "docker", "--docker-host", host)
    by_id = {x["id"]: x for x in doc["images"]}
    assert by_id[odd["zero"]]["diffIds"] == [] and by_id[odd["zero"]]["problems"] == []
    assert "docker.io/odd/zero:1" in by_id[odd["zero"]]["names"] or "odd/zero:1" in by_id[odd["zero"]]["names"]
    assert odd["dangling"] in by_id  # untagged, listed all the same
    docker(host, "image", "rm", "odd/train:2")
    proc = run_pyz(odd["delta"], "--verify", "--docker-host", host, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert "odd/train:2" in docker(host, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout


def test_podman_with_a_zero_layer_and_an_untagged_image(docker_host: str, busybox: str, podman_vfs: object,
                                                        _built: dict,  # type: ignore[type-arg]
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    if "classic" not in _built:
        _built["classic"] = _build(docker_host, busybox, tmp_path_factory.mktemp("odd-classic"))
    odd = _built["classic"]
    store = podman_vfs
    store.podman("load", "-i", str(odd["tar"]))  # type: ignore[attr-defined]
    assert run_pyz(odd["full"], *store.importer_args(), "--no-receipt").returncode == 0  # type: ignore[attr-defined]
    doc = _inventory(*store.importer_args())  # type: ignore[attr-defined]
    by_id = {x["id"]: x for x in doc["images"]}
    zero, dangling = odd["in_tar"]["zero"], odd["in_tar"]["dangling"]
    assert by_id[zero]["diffIds"] == [] and by_id[dangling]["names"] == [] and by_id[dangling]["diffIds"] == []
    proc = run_pyz(odd["delta"], "--verify", *store.importer_args(), "--no-receipt")  # type: ignore[attr-defined]
    assert proc.returncode == 0, proc.stderr


def test_containerd_with_a_zero_layer_image(docker_host: str, busybox: str, containerd_address: str,
                                            _built: dict,  # type: ignore[type-arg]
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    if "classic" not in _built:
        _built["classic"] = _build(docker_host, busybox, tmp_path_factory.mktemp("odd-classic"))
    odd = _built["classic"]
    ns = "odd-host"
    args = ("--engine", "containerd", "--address", containerd_address, "--namespace", ns, "--snapshotter", "native")
    ctr(containerd_address, ns, "images", "import", "--snapshotter", "native", str(odd["tar"]))
    assert run_cli("importer", str(odd["full"]), *args, "--no-receipt").returncode == 0
    doc = _inventory(*args)
    zero = [x for x in doc["images"] if "docker.io/odd/zero:1" in x["names"]]
    assert len(zero) == 1 and zero[0]["diffIds"] == []
    proc = run_cli("importer", str(odd["delta"]), "--verify", *args, "--no-receipt")
    assert proc.returncode == 0, proc.stderr


def test_a_failed_batch_is_asked_one_image_at_a_time_and_the_vanished_one_left_out() -> None:
    """Thousands of images: asked 100 at a time; an image gone between listing and inspecting
    (the engine refuses the whole batch) costs only itself."""
    ids = [f"sha256:{n:064x}" for n in range(2500)]
    gone = {ids[7], ids[1234]}
    asked: list[int] = []

    def inspect(batch: object) -> bytes | None:
        names = list(batch)  # type: ignore[call-overload]
        asked.append(len(names))
        if gone & set(names):
            return None
        return json.dumps([{"Id": n, "RootFS": {"Type": "layers"}} if i % 2 else {"Id": n, "RepoTags": None}
                           for i, n in enumerate(names)] + ["not an image"]).encode()

    def describe(doc: object) -> EngineImage:
        from importer.engines.dockerclient import engine_image_from_inspect
        return engine_image_from_inspect(doc)

    images = inspect_each(ids, inspect, describe)
    assert [x.image_id for x in images] == [x for x in ids if x not in gone]
    assert all(x.diff_ids == [] and x.tags == [] for x in images)
    assert max(asked) == 100 and len(asked) == 25 + 200
