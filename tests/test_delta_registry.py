"""Delta bundles into a registry (issue 7, registry part), against a real Debian docker-registry on
127.0.0.1 and the private dockerd: the registry's inventory (`bundle-import --inventory
--registry`), a delta exported against it (or against the base bundle.json) completing in the same
repository (HEAD), in another one (cross-repository mount) through both `bundle-import --registry`
and `bundle push`, a re-push sending no blob, and a registry lacking the base refusing with exit 9
and nothing pushed."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from importer.format.platform import host_platform
from importer.inventory.engine import load_inventory
from tests.kit import engines
from tests.kit.engines import Registry
from tests.kit.fixtures import auth_registry  # noqa: F401 - the fixture, one per module
from tests.kit.helpers import REPO, run_cli, run_pyz
from tests.kit.imagegen import base_and_update
from tests.kit.transferkit import FlakyProxy, blob_upload_requests, free_port, log_size

pytestmark = pytest.mark.engine

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
World = dict[str, Any]


def _port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    with engines.private_registry(f"dreg-{os.getpid()}", _port(5731)) as reg:
        yield reg


@pytest.fixture(scope="module")
def fresh_registry() -> Iterator[Registry]:
    """A second registry that holds nothing: the base is missing everywhere."""
    with engines.private_registry(f"dreg-fresh-{os.getpid()}", _port(5732)) as reg:
        yield reg


def _get(addr: str, path: str, accept: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{addr}{path}", headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, bytes(r.read())
    except urllib.error.HTTPError as e:
        return e.code, b""


def _manifest(addr: str, repo: str, tag: str) -> tuple[int, bytes]:
    return _get(addr, f"/v2/{repo}/manifests/{tag}",
                "application/vnd.oci.image.manifest.v1+json, " + OCI_INDEX)


def _push(bundle: Path, target: str) -> dict[str, Any]:
    proc = run_cli("bundle", "push", str(bundle), target, "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _export(docker_host: str, ref: str, out: Path, *have: Path) -> dict[str, Any]:
    args = [a for h in have for a in ("--have", str(h))]
    run_cli("bundle", "export", ref, *args, "-o", str(out), docker_host=docker_host, check=True)
    return dict(json.loads((out / "bundle.json").read_text()))


@pytest.fixture(scope="module")
def world(docker_host: str, busybox: str, registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> World:
    """A (busybox + 3 MiB random) and B = A + a small layer; A exported in full and pushed to
    dreg/train (and to mirror/dreg/train: one manifest, two names); the registry's inventory; B
    exported against it and against A's bundle.json."""
    root = tmp_path_factory.mktemp("dreg")
    base_and_update(docker_host, busybox, root, "dreg/train")
    full_a = root / "a.bundle"
    doc_a = _export(docker_host, "dreg/train:1", full_a)
    pushed = _push(full_a, registry.addr)
    assert pushed["ok"] and pushed["images"][0]["pushedTo"] == f"{registry.addr}/dreg/train:1"
    assert _push(full_a, f"{registry.addr}/mirror")["ok"]
    inventory = run_cli("importer", "--inventory", "--registry", registry.addr, check=True).stdout
    (root / "inventory.json").write_text(inventory)
    delta_inv = root / "b-inv.delta"
    delta_bj = root / "b-bj.delta"
    return {"root": root, "a": doc_a, "full_a": full_a, "inventory": inventory,
            "delta_inv": delta_inv, "doc_inv": _export(docker_host, "dreg/train:2", delta_inv, root / "inventory.json"),
            "delta_bj": delta_bj, "doc_bj": _export(docker_host, "dreg/train:2", delta_bj, full_a / "bundle.json")}


def test_registry_inventory_lists_images_with_their_blobs(registry: Registry, world: World) -> None:
    doc = load_inventory(world["inventory"].encode(), what="the registry inventory")  # checksum checked
    assert doc["engine"]["kind"] == "registry" and doc["engine"]["address"] == registry.addr
    image_a = world["a"]["images"][0]
    entries = [e for e in doc["images"] if e["manifestDigest"] == image_a["manifest"]["digest"]]
    assert len(entries) == 1  # the same manifest in two repositories: one image, both names
    entry = entries[0]
    assert entry["id"] == image_a["manifest"]["digest"]
    assert entry["names"] == [f"{registry.addr}/dreg/train:1", f"{registry.addr}/mirror/dreg/train:1"]
    assert entry["configDigest"] == image_a["config"]["digest"]
    assert entry["diffIds"] == [x["diffId"] for x in image_a["layers"]]
    assert entry["blobs"] == [{k: x[k] for k in ("mediaType", "digest", "size")} for x in image_a["layers"]]
    assert entry["problems"] == []
    schema = json.loads((REPO / "schemas" / "inventory" / "inventory-v1.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    # a namespace lists only what is under it
    ns = json.loads(run_cli("importer", "--inventory", "--registry", f"{registry.addr}/mirror", "--json",
                            check=True).stdout)
    assert [e["names"] for e in ns["images"]] == [[f"{registry.addr}/mirror/dreg/train:1"]]


def test_registry_inventory_picks_this_platform_from_an_index(registry: Registry, world: World) -> None:
    image_a = world["a"]["images"][0]
    os_name, arch = host_platform()
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {**image_a["manifest"], "platform": {"os": os_name, "architecture": "not-" + arch}},
        {**image_a["manifest"], "platform": {"os": os_name, "architecture": arch}},
    ]}).encode()
    assert _push(world["full_a"], f"{registry.addr}/idx")["ok"]  # the index's manifest is in its repository
    req = urllib.request.Request(f"http://{registry.addr}/v2/idx/dreg/train/manifests/multi", data=index,
                                 method="PUT", headers={"Content-Type": OCI_INDEX})
    with urllib.request.urlopen(req, timeout=30) as r:
        index_digest = r.headers["Docker-Content-Digest"]
    doc = json.loads(run_cli("importer", "--inventory", "--registry", f"{registry.addr}/idx", check=True).stdout)
    by_id = {e["id"]: e for e in doc["images"]}
    assert set(by_id) == {index_digest, image_a["manifest"]["digest"]}
    entry = by_id[index_digest]
    assert entry["names"] == [f"{registry.addr}/idx/dreg/train:multi"]
    assert entry["manifestDigest"] == image_a["manifest"]["digest"] and entry["problems"] == []
    assert entry["diffIds"] == [x["diffId"] for x in image_a["layers"]]


def test_the_delta_names_the_registry_blobs_and_holds_only_the_new_layer(world: World) -> None:
    base = world["a"]["images"][0]["layers"]
    for doc, out in ((world["doc_inv"], world["delta_inv"]), (world["doc_bj"], world["delta_bj"])):
        layers = doc["images"][0]["layers"]
        assert [x.get("external", False) for x in layers] == [True, True, False]
        # form (c): the external layers are the compressed blobs the registry holds
        assert [{k: x[k] for k in ("mediaType", "digest", "size", "diffId")} for x in layers[:2]] == [
            {k: x[k] for k in ("mediaType", "digest", "size", "diffId")} for x in base]
        assert len(list((out / "blobs" / "sha256").iterdir())) == 3  # the new layer, config, manifest


def test_delta_into_the_same_repository_completes_and_a_repush_sends_nothing(registry: Registry, world: World,
                                                                             tmp_path: Path) -> None:
    delta, doc = world["delta_inv"], world["doc_inv"]
    receipt = tmp_path / "r.json"
    proc = run_pyz(delta, "--verify", "--registry", registry.addr, "--receipt", str(receipt), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(receipt.read_text())
    assert out["result"] == "pass" and out["engine"]["kind"] == "registry"
    schema = json.loads((REPO / "schemas" / "receipt" / "import-v1.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(out)]
    image = doc["images"][0]
    assert out["images"][0]["found"]["manifestDigest"] == image["manifest"]["digest"]
    assert out["push"]["delta"] == {**out["push"]["delta"], "present": 2, "mounted": 0, "catalog": None}
    status, raw = _manifest(registry.addr, "dreg/train", "2")
    assert status == 200 and raw == (delta / "blobs" / "sha256" / image["manifest"]["digest"][7:]).read_bytes()

    before = log_size(registry.name)
    again = _push(delta, registry.addr)
    assert again["blobs"]["uploaded"] == 0 and again["blobs"]["mounted"] == 0
    assert again["delta"]["present"] == 2 and again["delta"]["mounted"] == 0
    assert [i["status"] for i in again["images"]] == ["already-present"]
    assert all(i["readBack"]["ok"] for i in again["images"])
    assert blob_upload_requests(registry.name, before) == []  # no blob request reached the registry


def test_delta_into_another_repository_mounts_the_base(registry: Registry, world: World, tmp_path: Path) -> None:
    receipt = tmp_path / "r.json"
    before = log_size(registry.name)
    proc = run_pyz(world["delta_bj"], "--registry", f"{registry.addr}/other", "--receipt", str(receipt))
    assert proc.returncode == 0, proc.stderr
    image = world["doc_bj"]["images"][0]
    rec = json.loads(receipt.read_text())
    assert rec["result"] == "pass" and rec["images"][0]["found"]["manifestDigest"] == image["manifest"]["digest"]
    assert rec["push"]["delta"]["mounted"] == 2 and rec["push"]["blobs"]["uploaded"] == 2
    uploads = blob_upload_requests(registry.name, before)
    mounts = [line for line in uploads if "mount=" in line]
    assert len(mounts) == 2 and all("from=dreg%2Ftrain" in line for line in mounts), uploads
    assert _manifest(registry.addr, "other/dreg/train", "2")[0] == 200

    pushed = _push(world["delta_inv"], f"{registry.addr}/pushed")
    assert pushed["ok"] and pushed["images"][0]["pushedTo"] == f"{registry.addr}/pushed/dreg/train:2"
    assert pushed["delta"]["mounted"] == 2 and pushed["delta"]["catalog"] == "listed"
    assert {m["from"] for m in pushed["delta"]["mounts"]} == {"dreg/train"}
    assert pushed["blobs"]["uploaded"] == 2  # the new layer and the config; never an external blob
    assert pushed["blobs"]["bytesUploaded"] < 1 << 20
    assert pushed["images"][0]["readBack"]["ok"]


def test_a_registry_without_the_base_refuses_and_nothing_is_pushed(fresh_registry: Registry, world: World) -> None:
    base = world["a"]["images"][0]["layers"]
    for argv in (["importer", str(world["delta_inv"]), "--registry", fresh_registry.addr, "--no-receipt"],
                 ["bundle", "push", str(world["delta_bj"]), fresh_registry.addr]):
        proc = run_cli(*argv)
        assert proc.returncode == 9, proc.stderr
        assert "error[delta-base-missing]" in proc.stderr
        for layer in base:
            assert f"registry lacks layer {layer['digest']} required by dreg/train:2" in proc.stderr
        assert "nothing was pushed" in proc.stderr and "--inventory --registry" in proc.stderr
        assert _manifest(fresh_registry.addr, "dreg/train", "2")[0] == 404
        digest = world["doc_inv"]["images"][0]["manifest"]["digest"]
        assert _manifest(fresh_registry.addr, "dreg/train", digest)[0] == 404
        status, body = _get(fresh_registry.addr, "/v2/_catalog")
        assert status == 200 and json.loads(body)["repositories"] == []  # not even a blob arrived


def test_a_delta_from_a_docker_inventory_cannot_complete_in_a_registry(docker_host: str, registry: Registry,
                                                                        world: World, tmp_path: Path) -> None:
    inventory = run_cli("importer", "--inventory", "--engine", "docker", "--docker-host", docker_host,
                        check=True).stdout
    (tmp_path / "docker.json").write_text(inventory)
    doc = _export(docker_host, "dreg/train:2", tmp_path / "u.delta", tmp_path / "docker.json")
    external = [x for x in doc["images"][0]["layers"] if x.get("external")]
    # form (u): the docker engine knows only diff_ids (it also holds B: every layer may be external)
    assert len(external) >= 2 and all(x["digest"] == x["diffId"] for x in external)
    proc = run_cli("importer", str(tmp_path / "u.delta"), "--registry", f"{registry.addr}/formu", "--no-receipt")
    assert proc.returncode == 9, proc.stderr
    assert "(named uncompressed, by diff_id)" in proc.stderr and "cannot complete in a registry" in proc.stderr
    assert _manifest(registry.addr, "formu/dreg/train", "2")[0] == 404


def test_a_registry_without_a_catalog_api(registry: Registry, world: World) -> None:
    with FlakyProxy(registry.port, fail_first=1000, fail_match=b"GET /v2/_catalog", fail_status=404) as proxy:
        proc = run_cli("importer", "--inventory", "--registry", f"127.0.0.1:{proxy.port}")
        assert proc.returncode == 6 and "error[registry-no-catalog]" in proc.stderr, proc.stderr
        assert "expected the catalog API (/v2/_catalog), found none" in proc.stderr
        # a delta into a repository that lacks the base cannot look for a mount source
        proc = run_cli("bundle", "push", str(world["delta_inv"]), f"127.0.0.1:{proxy.port}/nocat")
        assert proc.returncode == 9, proc.stderr
        assert "no catalog API" in proc.stderr
        # into the repository that holds it: HEAD is enough, no catalog needed
        out = _push(world["delta_inv"], f"127.0.0.1:{proxy.port}")
        assert out["ok"] and out["delta"]["present"] == 2 and out["delta"]["catalog"] is None


def test_a_delta_mounts_and_completes_in_a_registry_that_wants_a_login(auth_registry: Registry,  # noqa: F811
                                                                        world: World, tmp_path: Path) -> None:
    """The mount search (catalog, HEADs, cross-repository mounts) carries the credentials too."""
    config = tmp_path / "docker"
    config.mkdir()
    auth = base64.b64encode(b"alice:s3cret-pw").decode()
    (config / "config.json").write_text(json.dumps({"auths": {auth_registry.addr: {"auth": auth}}}))

    def cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(module, *args, env={"DOCKER_CONFIG": str(config)}, timeout=600)

    base = cli("bundle", "push", str(world["full_a"]), auth_registry.addr, "--json")
    assert base.returncode == 0, base.stderr
    inventory = cli("importer", "--inventory", "--registry", auth_registry.addr)
    assert inventory.returncode == 0, inventory.stderr
    assert "dreg/train" in inventory.stdout
    pushed = cli("bundle", "push", str(world["delta_inv"]), f"{auth_registry.addr}/pushed", "--json")
    assert pushed.returncode == 0, pushed.stderr
    out = json.loads(pushed.stdout)
    assert out["delta"]["mounted"] == 2 and {m["from"] for m in out["delta"]["mounts"]} == {"dreg/train"}
    assert out["blobs"]["uploaded"] == 2 and out["images"][0]["readBack"]["ok"]
    receipt = tmp_path / "r.json"
    imported = cli("importer", str(world["delta_bj"]), "--registry", f"{auth_registry.addr}/other",
                   "--receipt", str(receipt))
    assert imported.returncode == 0, imported.stderr
    rec = json.loads(receipt.read_text())
    assert rec["result"] == "pass" and rec["push"]["delta"]["mounted"] == 2
    for proc in (base, inventory, pushed, imported):
        assert "s3cret-pw" not in proc.stdout + proc.stderr and auth not in proc.stdout + proc.stderr
