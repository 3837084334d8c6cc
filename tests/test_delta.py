"""Delta bundles: ship only the layers the offline host lacks, and refuse cleanly when the host
lacks the base.

Engine matrix (issue 13): the images are built on Docker's classic store, and the offline host of
the refusal and the inventory tests is the vfs dockerd or the containerd-store one (``offline``);
the delta export-and-import test also runs with the containerd-store Docker as both build and
offline host (``docker_store``). The --schema 2 refusal, the OCI-layout and the podman tests stay on
the classic build host (their subject is not the Docker store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importer.format.identity import loads_as_docker_archive
from importer.format.manifest import load_bundle_manifest
from tests.kit import engines, imagegen
from tests.kit.helpers import bundle_image_id, docker, image_facts, image_ids, image_store, run_cli, run_pyz

pytestmark = pytest.mark.engine

BOTH_STORES = pytest.mark.parametrize("docker_store", sorted(engines.DOCKER_STORES), indirect=True)
OFFLINE = pytest.mark.parametrize("offline", ["docker_host_vfs", "docker_host_ctrstore"])


@pytest.fixture(scope="module")
def _built() -> dict[str, dict]:
    return {}


@pytest.fixture
def base_and_update(docker_store: str, docker_store_host: str, busybox: str, _built: dict,
                    tmp_path_factory: pytest.TempPathFactory) -> dict:
    if docker_store not in _built:
        _built[docker_store] = _build(docker_store_host, busybox, tmp_path_factory.mktemp(f"delta-{docker_store}"))
    return _built[docker_store]  # type: ignore[no-any-return]


def _build(docker_host: str, busybox: str, root: Path) -> dict:
    imagegen.base_and_update(docker_host, busybox, root, "delta/train")
    full_a = root / "a.bundle"
    run_cli("bundle", "export", "delta/train:1", "-o", str(full_a), docker_host=docker_host, check=True)
    return {"root": root, "a": image_facts(docker_host, "delta/train:1"),
            "b": image_facts(docker_host, "delta/train:2"), "full_a": full_a}


def _export_delta(docker_host: str, have: Path, out: Path) -> dict:
    run_cli("bundle", "export", "delta/train:2", "--have", str(have), "-o", str(out),
            docker_host=docker_host, check=True)
    return json.loads((out / "bundle.json").read_text())


@BOTH_STORES
def test_delta_holds_only_the_new_layer_and_imports(docker_store: str, docker_store_host: str,
                                                    base_and_update: dict, tmp_path: Path) -> None:
    host = docker_store_host
    out = tmp_path / "b.delta"
    doc = _export_delta(host, base_and_update["full_a"] / "bundle.json", out)
    layers = doc["images"][0]["layers"]
    external = [x for x in layers if x.get("external")]
    stored = [x for x in layers if not x.get("external")]
    assert len(external) == 2 and len(stored) == 1  # busybox + weights come from the host
    assert doc["schemaVersion"] == "3.1"
    blobs = list((out / "blobs" / "sha256").iterdir())
    assert len(blobs) == 1 + 2  # the new layer, config, manifest
    on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert on_disk < stored[0]["uncompressedSize"] + (1 << 20)
    info = json.loads(run_cli("bundle", "inspect", str(out), "--json", check=True).stdout)
    assert {r["diffId"] for r in info["delta"]["requires"]} == {x["diffId"] for x in external}

    docker(host, "image", "rm", "delta/train:2")
    proc = run_pyz(out, "--verify", "--docker-host", host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    # the ID the build host showed: on the containerd store the bundle's manifest, the base's
    # blobs copied out of the engine as it keeps them
    assert image_facts(host, "delta/train:2") == base_and_update["b"]
    assert json.loads(proc.stdout)["images"][0]["result"] == "match"
    assert not [x for x in image_ids(host) if "sneakernet-staging" in x]


def _carried_facts(host: str, bundle: Path, built: tuple[str, list[str]]) -> tuple[str, list[str]]:
    """What ``host`` shows for the bundle's image: the diff_ids as built, the ID of its store. A
    delta made against a Docker inventory (left-out layers described uncompressed) goes into the
    containerd store as a docker-archive; its ID is the manifest Docker makes of the engine's own
    compressed blobs, which nothing predicts: then the ID the engine shows is returned, after
    checking it is not the bundle's (docs/engines.md says so)."""
    raw = (bundle / "bundle.json").read_bytes()
    image = json.loads(raw)["images"][0]
    assert image["config"]["digest"] == built[0]  # built on the classic store: ID = config digest
    if image_store(host) == "containerd" and loads_as_docker_archive(load_bundle_manifest(raw).images[0]):
        found = image_facts(host, image["refs"][0])
        assert found is not None and found[0] != image["manifest"]["digest"]
        return found[0], built[1]
    return bundle_image_id(host, image), built[1]


@OFFLINE
def test_delta_against_a_host_without_the_base_loads_nothing(docker_store_host: str, offline: str,
                                                             request: pytest.FixtureRequest,
                                                             base_and_update: dict, tmp_path: Path) -> None:
    host = request.getfixturevalue(offline)
    out = tmp_path / "b.delta"
    _export_delta(docker_store_host, base_and_update["full_a"] / "bundle.json", out)
    for ref in ("delta/train:2", "delta/train:1"):
        docker(host, "image", "rm", ref, check=False)
    before = image_ids(host)
    proc = run_pyz(out, "--verify", "--docker-host", host, "--no-receipt")
    assert proc.returncode == 9, proc.stderr
    assert "error[delta-base-missing]" in proc.stderr
    # the first layer the host lacks is named (another test's image may hold the busybox base layer)
    assert any(f"host lacks layer {d} required by delta/train:2" in proc.stderr for d in base_and_update["a"][1])
    assert "import the base bundle first" in proc.stderr
    assert image_ids(host) == before
    # importing the base bundle first makes the same delta import
    assert run_pyz(base_and_update["full_a"], "--docker-host", host, "--no-receipt").returncode == 0
    assert image_facts(host, "delta/train:1") == _carried_facts(host, base_and_update["full_a"],
                                                                base_and_update["a"])
    proc = run_pyz(out, "--verify", "--docker-host", host, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert image_facts(host, "delta/train:2") == _carried_facts(host, out, base_and_update["b"])


def test_have_with_an_older_schema_is_a_clear_error(docker_store_host: str, base_and_update: dict,
                                                    tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "delta/train:2", "--schema", "2", "--have",
                   str(base_and_update["full_a"] / "bundle.json"), "-o", str(tmp_path / "x"),
                   docker_host=docker_store_host)
    assert proc.returncode == 2 and "need schema 3" in proc.stderr


@OFFLINE
def test_have_from_the_engine_inventory_and_a_damaged_inventory(docker_store_host: str, offline: str,
                                                               request: pytest.FixtureRequest,
                                                               base_and_update: dict, tmp_path: Path) -> None:
    """The offline host prints its inventory; the build host exports against it."""
    host = request.getfixturevalue(offline)
    docker(host, "image", "rm", "delta/train:2", check=False)
    assert run_pyz(base_and_update["full_a"], "--docker-host", host, "--no-receipt").returncode == 0
    inventory = run_cli("importer", "--inventory", "--engine", "docker", "--docker-host", host,
                        check=True).stdout
    (tmp_path / "have.json").write_text(inventory)
    doc = _export_delta(docker_store_host, tmp_path / "have.json", tmp_path / "d")
    assert [x.get("external", False) for x in doc["images"][0]["layers"]] == [True, True, False]
    proc = run_pyz(tmp_path / "d", "--verify", "--docker-host", host, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    carried = _carried_facts(host, tmp_path / "d", base_and_update["b"])
    assert image_facts(host, "delta/train:2") == carried
    # the user's tag on another image is not moved without --force, on either store (the
    # containerd store's docker-archive path once skipped this check)
    docker(host, "tag", "delta/train:1", "delta/train:2")
    moved = image_facts(host, "delta/train:2")
    assert moved is not None and moved != carried
    proc = run_pyz(tmp_path / "d", "--verify", "--docker-host", host, "--no-receipt")
    assert proc.returncode == 7 and "error[tag-conflict]" in proc.stderr, proc.stderr
    assert image_facts(host, "delta/train:2") == moved
    proc = run_pyz(tmp_path / "d", "--verify", "--docker-host", host, "--no-receipt", "--force")
    assert proc.returncode == 0, proc.stderr
    assert image_facts(host, "delta/train:2") == carried
    # and the tag already on the bundle's image is no conflict: a second import just passes
    assert run_pyz(tmp_path / "d", "--verify", "--docker-host", host, "--no-receipt").returncode == 0
    damaged = json.loads(inventory)
    damaged["images"] = damaged["images"][:-1] or [{"diffIds": []}]
    (tmp_path / "bad.json").write_text(json.dumps(damaged))
    proc = run_cli("bundle", "export", "delta/train:2", "--have", str(tmp_path / "bad.json"), "-o",
                   str(tmp_path / "x"), docker_host=docker_store_host)
    assert proc.returncode == 3 and "error[inventory-damaged]" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_delta_names_the_base_bundle_blobs_and_completes_in_an_oci_layout(
        docker_store_host: str, base_and_update: dict, tmp_path: Path) -> None:
    """--have bundle.json: the external layers name the base bundle's compressed blobs, so a
    layout that holds the base completes the delta without them; an empty one refuses (exit 9)."""
    out = tmp_path / "b.delta"
    doc = _export_delta(docker_store_host, base_and_update["full_a"] / "bundle.json", out)
    base = json.loads((base_and_update["full_a"] / "bundle.json").read_text())["images"][0]["layers"]
    external = [x for x in doc["images"][0]["layers"] if x.get("external")]
    assert [(x["digest"], x["mediaType"], x["size"]) for x in external] == [
        (x["digest"], x["mediaType"], x["size"]) for x in base]
    empty = tmp_path / "empty-layout"
    proc = run_pyz(out, "--oci-dir", str(empty), "--no-receipt")
    assert proc.returncode == 9, proc.stderr
    assert f"(the layout holds no blob {external[0]['digest']})" in proc.stderr
    assert not (empty / "index.json").exists()
    layout = tmp_path / "layout"
    assert run_pyz(base_and_update["full_a"], "--oci-dir", str(layout), "--no-receipt").returncode == 0
    proc = run_pyz(out, "--oci-dir", str(layout), "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    index = json.loads((layout / "index.json").read_text())
    named = {m["annotations"]["org.opencontainers.image.ref.name"]: m["digest"] for m in index["manifests"]}
    assert named["delta/train:2"] == doc["images"][0]["manifest"]["digest"]


def test_delta_into_podman_completes_from_its_store(base_and_update: dict, podman_vfs: object, docker_store_host: str,
                                                   tmp_path: Path) -> None:
    store = podman_vfs
    out = tmp_path / "b.delta"
    doc = _export_delta(docker_store_host, base_and_update["full_a"] / "bundle.json", out)
    for ref in ("docker.io/delta/train:2", "docker.io/delta/train:1"):
        store.podman("rmi", ref, check=False)  # type: ignore[attr-defined]
    # a store without the base: refused before anything loads
    before = sorted(store.podman("images", "-q", "--no-trunc").stdout.split())  # type: ignore[attr-defined]
    proc = run_pyz(out, *store.importer_args(), "--no-receipt")  # type: ignore[attr-defined]
    assert proc.returncode == 9 and "error[delta-base-missing]" in proc.stderr, proc.stderr
    assert sorted(store.podman("images", "-q", "--no-trunc").stdout.split()) == before  # type: ignore[attr-defined]
    # with the base: the left-out layers come back out of podman (podman save), checked, spliced in
    assert run_pyz(base_and_update["full_a"], *store.importer_args(), "--no-receipt").returncode == 0  # type: ignore
    proc = run_pyz(out, "--verify", "--deep", *store.importer_args(), "--json", "--no-receipt")  # type: ignore
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt["result"] == "pass" and receipt["images"][0]["deep"]["ok"] is True
    got = store.inspect("docker.io/delta/train:2")  # type: ignore[attr-defined]
    config, diff_ids = base_and_update["b"]
    assert "sha256:" + got["Id"].removeprefix("sha256:") == config == doc["images"][0]["config"]["digest"]
    assert got["RootFS"]["Layers"] == diff_ids


