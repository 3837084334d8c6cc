"""Delta bundles: ship only the layers the offline host lacks, and refuse cleanly when the host
lacks the base."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import engines
from tests.helpers import docker, image_facts, image_ids, run_cli, run_pyz

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def base_and_update(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("delta")
    a = root / "a"
    a.mkdir()
    (a / "busybox").write_bytes(Path(busybox).read_bytes())
    (a / "weights.bin").write_bytes(os.urandom(3 << 20))
    (a / "Dockerfile").write_text("FROM scratch\nCOPY busybox /bin/busybox\nCOPY weights.bin /w/weights.bin\n")
    engines.build_image(docker_host, a, "delta/train:1")
    b = root / "b"
    b.mkdir()
    (b / "code.py").write_text("print('week 2')\n" * 100)
    (b / "Dockerfile").write_text("FROM delta/train:1\nCOPY code.py /app/code.py\n")
    engines.build_image(docker_host, b, "delta/train:2")
    full_a = root / "a.bundle"
    run_cli("bundle", "export", "delta/train:1", "-o", str(full_a), docker_host=docker_host, check=True)
    return {"root": root, "a": image_facts(docker_host, "delta/train:1"),
            "b": image_facts(docker_host, "delta/train:2"), "full_a": full_a}


def _export_delta(docker_host: str, have: Path, out: Path) -> dict:
    run_cli("bundle", "export", "delta/train:2", "--have", str(have), "-o", str(out),
            docker_host=docker_host, check=True)
    return json.loads((out / "bundle.json").read_text())


def test_delta_holds_only_the_new_layer_and_imports(docker_host: str, base_and_update: dict, tmp_path: Path) -> None:
    out = tmp_path / "b.delta"
    doc = _export_delta(docker_host, base_and_update["full_a"] / "bundle.json", out)
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

    docker(docker_host, "image", "rm", "delta/train:2")
    proc = run_pyz(out, "--verify", "--docker-host", docker_host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert image_facts(docker_host, "delta/train:2") == base_and_update["b"]
    assert json.loads(proc.stdout)["images"][0]["result"] == "match"
    assert not [x for x in image_ids(docker_host) if "sneakernet-staging" in x]


def test_delta_against_a_host_without_the_base_loads_nothing(docker_host: str, docker_host_vfs: str,
                                                             base_and_update: dict, tmp_path: Path) -> None:
    out = tmp_path / "b.delta"
    _export_delta(docker_host, base_and_update["full_a"] / "bundle.json", out)
    for ref in ("delta/train:2", "delta/train:1"):
        docker(docker_host_vfs, "image", "rm", ref, check=False)
    before = image_ids(docker_host_vfs)
    proc = run_pyz(out, "--verify", "--docker-host", docker_host_vfs, "--no-receipt")
    assert proc.returncode == 9, proc.stderr
    assert "error[delta-base-missing]" in proc.stderr
    assert f"host lacks layer {base_and_update['a'][1][0]} required by delta/train:2" in proc.stderr
    assert "import the base bundle first" in proc.stderr
    assert image_ids(docker_host_vfs) == before
    # importing the base bundle first makes the same delta import
    assert run_pyz(base_and_update["full_a"], "--docker-host", docker_host_vfs, "--no-receipt").returncode == 0
    proc = run_pyz(out, "--verify", "--docker-host", docker_host_vfs, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert image_facts(docker_host_vfs, "delta/train:2") == base_and_update["b"]


def test_have_with_an_older_schema_is_a_clear_error(docker_host: str, base_and_update: dict, tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "delta/train:2", "--schema", "2", "--have",
                   str(base_and_update["full_a"] / "bundle.json"), "-o", str(tmp_path / "x"), docker_host=docker_host)
    assert proc.returncode == 2 and "need schema 3" in proc.stderr


def test_have_from_the_engine_inventory_and_a_damaged_inventory(docker_host: str, docker_host_vfs: str,
                                                               base_and_update: dict, tmp_path: Path) -> None:
    """The offline host (the vfs engine) prints its inventory; the build host exports against it."""
    docker(docker_host_vfs, "image", "rm", "delta/train:2", check=False)
    assert run_pyz(base_and_update["full_a"], "--docker-host", docker_host_vfs, "--no-receipt").returncode == 0
    inventory = run_cli("importer", "--inventory", "--engine", "docker", "--docker-host", docker_host_vfs,
                        check=True).stdout
    (tmp_path / "have.json").write_text(inventory)
    doc = _export_delta(docker_host, tmp_path / "have.json", tmp_path / "d")
    assert [x.get("external", False) for x in doc["images"][0]["layers"]] == [True, True, False]
    proc = run_pyz(tmp_path / "d", "--verify", "--docker-host", docker_host_vfs, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert image_facts(docker_host_vfs, "delta/train:2") == base_and_update["b"]
    damaged = json.loads(inventory)
    damaged["images"] = damaged["images"][:-1] or [{"diffIds": []}]
    (tmp_path / "bad.json").write_text(json.dumps(damaged))
    proc = run_cli("bundle", "export", "delta/train:2", "--have", str(tmp_path / "bad.json"), "-o",
                   str(tmp_path / "x"), docker_host=docker_host)
    assert proc.returncode == 3 and "error[inventory-damaged]" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_delta_names_the_base_bundle_blobs_and_completes_in_an_oci_layout(
        docker_host: str, base_and_update: dict, tmp_path: Path) -> None:
    """--have bundle.json: the external layers name the base bundle's compressed blobs, so a
    layout that holds the base completes the delta without them; an empty one refuses (exit 9)."""
    out = tmp_path / "b.delta"
    doc = _export_delta(docker_host, base_and_update["full_a"] / "bundle.json", out)
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


def test_delta_into_podman_completes_from_its_store(base_and_update: dict, podman_vfs: object, docker_host: str,
                                                   tmp_path: Path) -> None:
    store = podman_vfs
    out = tmp_path / "b.delta"
    doc = _export_delta(docker_host, base_and_update["full_a"] / "bundle.json", out)
    for ref in ("docker.io/delta/train:2", "docker.io/delta/train:1"):
        store.podman("rmi", ref, check=False)  # type: ignore[attr-defined]
    # a store without the base: refused before anything loads
    before = store.podman("images", "-q", "--no-trunc").stdout  # type: ignore[attr-defined]
    proc = run_pyz(out, *store.importer_args(), "--no-receipt")  # type: ignore[attr-defined]
    assert proc.returncode == 9 and "error[delta-base-missing]" in proc.stderr, proc.stderr
    assert store.podman("images", "-q", "--no-trunc").stdout == before  # type: ignore[attr-defined]
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


