"""One bundle, every engine: the same verified answer everywhere (issue 3).

A two-image bundle (tests/kit/imagegen.py's tricky content: hardlinks, symlinks, whiteouts, opaque
dirs, long and non-ASCII names, setuid/sticky bits; a small random file instead of 200 MB) is
imported with the bundle's own ``bundle-import.pyz --verify --deep`` into: dockerd (overlay2),
dockerd (vfs), a standalone containerd (overlayfs in namespace ``default``, native in
``k8s.io``), podman (vfs, overlay) and an OCI layout. Each engine is then read back with its
own CLI (not through the importer), and must report the bundle's config digest and diff_ids;
containerd and the OCI layout also the bundle's manifest digest. Finally a file of a stored
layer is altered underneath each engine and ``--deep`` must fail, naming that layer."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from importer.format.identity import chain_ids
from tests.kit import engine_stores, engines
from tests.kit.engine_stores import PodmanStore
from tests.kit.helpers import run_cli, run_pyz, run_zipapp
from tests.kit.imagegen import CHILD_FILE, write_contexts

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
REFS = ("contract:base", "contract:child")
FULL = {ref: f"docker.io/library/{ref}" for ref in REFS}
SMALL_MB = 2
ENGINE_IDS = [
    "docker-overlay2",
    "docker-vfs",
    "containerd-overlayfs-default",
    "containerd-native-k8s.io",
    "podman-vfs",
    "podman-overlay",
    "oci",
]


# ============================== the bundle (built once, in the overlay2 dockerd)

@pytest.fixture(scope="module")
def contract_bundle(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # tricky content, a small random file
    base, child = write_contexts(tmp_path_factory.mktemp("contract-ctx"), busybox, big_size=SMALL_MB << 20,
                                 base_tag="contract:base")
    engines.build_image(docker_host, base, "contract:base")
    engines.build_image(docker_host, child, "contract:child")
    out = tmp_path_factory.mktemp("contract") / "contract.bundle"
    run_cli("bundle", "export", *REFS, "-o", str(out), docker_host=docker_host, timeout=600, check=True)
    # the overlay2 engine is an import target too: start it without the images
    for ref in reversed(REFS):
        engines.docker(docker_host, "image", "rm", ref)
    return out


def _bundle_doc(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "bundle.json").read_text())  # type: ignore[no-any-return]


def _expected(bundle: Path) -> dict[str, dict[str, Any]]:
    """ref -> {config, manifest, diffIds, layers} as bundle.json pins them."""
    out = {}
    for image in _bundle_doc(bundle)["images"]:
        out[image["refs"][0]] = {
            "config": image["config"]["digest"],
            "manifest": image["manifest"]["digest"],
            "diffIds": [x["diffId"] for x in image["layers"]],
            "layers": image["layers"],
        }
    return out


# ============================== the engines

@dataclass
class Target:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # ref -> (config digest, manifest digest or None, diff_ids), read with the engine's own CLI
    read: Callable[[str], tuple[str, str | None, list[str]]] = lambda ref: ("", None, [])
    # a context manager altering one stored file/blob of contract:child's top layer
    tamper: Callable[[dict[str, Any]], contextlib.AbstractContextManager[None]] = lambda exp: contextlib.nullcontext()
    # every image name the engine holds
    names: Callable[[], list[str]] = lambda: []


def _docker_target(name: str, url: str) -> Target:
    def read(ref: str) -> tuple[str, str | None, list[str]]:
        doc = json.loads(engines.docker(url, "image", "inspect", ref))[0]
        return doc["Id"], None, list(doc["RootFS"]["Layers"])

    @contextlib.contextmanager
    def tamper(exp: dict[str, Any]) -> Iterator[None]:
        info = json.loads(engines.docker(url, "info", "--format", "{{json .}}"))
        root, driver = Path(info["DockerRootDir"]), info["Driver"]
        chain = chain_ids(exp["diffIds"])[-1].split(":", 1)[1]
        cache_id = (root / "image" / driver / "layerdb" / "sha256" / chain / "cache-id").read_text().strip()
        layer = root / "overlay2" / cache_id / "diff" if driver == "overlay2" else root / "vfs" / "dir" / cache_id
        with _altered_file(layer / CHILD_FILE):
            yield

    def names() -> list[str]:
        return engines.docker(url, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}").split()

    return Target(name, ["--docker-host", url], read=read, tamper=tamper, names=names)


def _containerd_target(name: str, sock: str, snapshotter: str, namespace: str) -> Target:
    def read(ref: str) -> tuple[str, str | None, list[str]]:
        rows = engine_stores.ctr(sock, namespace, "images", "ls", f"name=={FULL[ref]}").splitlines()[1:]
        assert len(rows) == 1, rows
        manifest_digest = rows[0].split()[2]
        manifest = json.loads(engine_stores.ctr(sock, namespace, "content", "get", manifest_digest))
        config = json.loads(engine_stores.ctr(sock, namespace, "content", "get", manifest["config"]["digest"]))
        return manifest["config"]["digest"], manifest_digest, list(config["rootfs"]["diff_ids"])

    @contextlib.contextmanager
    def tamper(exp: dict[str, Any]) -> Iterator[None]:
        blob = exp["layers"][-1]["digest"].split(":", 1)[1]
        content = Path(sock).parent / "root" / "io.containerd.content.v1.content" / "blobs" / "sha256" / blob
        with _flipped_byte(content):
            yield

    def names() -> list[str]:
        return engine_stores.ctr(sock, namespace, "images", "ls", "-q").split()

    args = ["--engine", "containerd", "--address", sock, "--namespace", namespace, "--snapshotter", snapshotter]
    return Target(name, args, read=read, tamper=tamper, names=names)


def _podman_target(name: str, store: PodmanStore) -> Target:
    def read(ref: str) -> tuple[str, str | None, list[str]]:
        doc = store.inspect(FULL[ref])
        return "sha256:" + doc["Id"], None, list(doc["RootFS"]["Layers"])

    @contextlib.contextmanager
    def tamper(exp: dict[str, Any]) -> Iterator[None]:
        layer = store.layer_dir(exp["diffIds"][-1], exp["diffIds"][:-1])
        with _altered_file(layer / CHILD_FILE):
            yield

    def names() -> list[str]:
        return store.podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()

    env = {k: v for k, v in store.env().items() if k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "TMPDIR")}
    return Target(name, store.importer_args(), env=env, read=read, tamper=tamper, names=names)


def _oci_target(name: str, layout: Path) -> Target:
    def read(ref: str) -> tuple[str, str | None, list[str]]:
        index = json.loads((layout / "index.json").read_text())
        [entry] = [e for e in index["manifests"]
                   if e.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref]
        manifest = json.loads((layout / "blobs" / "sha256" / entry["digest"].split(":")[1]).read_text())
        config = json.loads((layout / "blobs" / "sha256" / manifest["config"]["digest"].split(":")[1]).read_text())
        return manifest["config"]["digest"], entry["digest"], list(config["rootfs"]["diff_ids"])

    @contextlib.contextmanager
    def tamper(exp: dict[str, Any]) -> Iterator[None]:
        with _flipped_byte(layout / "blobs" / "sha256" / exp["layers"][-1]["digest"].split(":", 1)[1]):
            yield

    def names() -> list[str]:
        index = json.loads((layout / "index.json").read_text())
        return [e.get("annotations", {}).get("org.opencontainers.image.ref.name", "") for e in index["manifests"]]

    return Target(name, ["--engine", "oci", "--oci-dir", str(layout)], read=read, tamper=tamper, names=names)


@contextlib.contextmanager
def _altered_file(path: Path) -> Iterator[None]:
    """Overwrite a stored file with bytes of the same length; restore it afterwards."""
    original = path.read_bytes()
    assert original == b"child\n", (path, original)
    with open(path, "r+b") as f:
        f.write(b"CHILD\n")
    try:
        yield
    finally:
        with open(path, "r+b") as f:
            f.write(original)


@contextlib.contextmanager
def _flipped_byte(path: Path) -> Iterator[None]:
    """Flip one byte in the middle of a stored blob; restore it afterwards."""
    mode = path.stat().st_mode
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    original = data[middle]
    data[middle] ^= 0xFF
    path.write_bytes(bytes(data))
    try:
        yield
    finally:
        data[middle] = original
        path.write_bytes(bytes(data))
        os.chmod(path, mode)


@pytest.fixture(scope="module", params=ENGINE_IDS)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Target:
    name = request.param
    if name == "docker-overlay2":
        return _docker_target(name, request.getfixturevalue("docker_host"))
    if name == "docker-vfs":
        return _docker_target(name, request.getfixturevalue("docker_host_vfs"))
    if name.startswith("containerd-"):
        _, snapshotter, namespace = name.split("-", 2)
        return _containerd_target(name, request.getfixturevalue("containerd_address"), snapshotter, namespace)
    if name == "podman-vfs":
        return _podman_target(name, request.getfixturevalue("podman_vfs"))
    if name == "podman-overlay":
        return _podman_target(name, request.getfixturevalue("podman_overlay"))
    return _oci_target(name, tmp_path_factory.mktemp("oci") / "layout")


def import_pyz(bundle: Path, target: Target, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """The bundle's own importer, run the way a user runs it (only ``target``'s options and
    environment choose the engine)."""
    return run_pyz(bundle, *target.args, *args, env={**target.env, "SNEAKERNET_LOCK_DIR": str(tmp / "locks")},
                   drop_env=("PYTHON", "DOCKER_", "CONTAINERD_"))


SEEN: dict[str, dict[str, tuple[str, str | None, list[str]]]] = {}


# ============================== the suite

def test_import_verify_deep_passes(contract_bundle: Path, target: Target, tmp_path: Path) -> None:
    receipt_path = tmp_path / "receipt.json"
    proc = import_pyz(contract_bundle, target, "--verify", "--deep", "--receipt", str(receipt_path), tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    receipt = json.loads(receipt_path.read_text())
    expected = _expected(contract_bundle)
    assert receipt["result"] == "pass"
    assert receipt["engine"]["kind"] == target.name.split("-")[0]
    assert receipt["engine"]["selectedBy"]
    assert receipt["engine"]["version"] and receipt["engine"]["storageDriver"]
    assert len(receipt["images"]) == len(REFS)
    for image in receipt["images"]:
        exp = expected[image["refs"][0]]
        assert image["result"] == "match" and image["status"] == "loaded", image
        assert image["idVerified"] is True
        assert image["found"]["diffIds"] == exp["diffIds"]
        assert image["deep"]["ok"] is True and image["deep"]["configFound"] is True
        assert [x["foundDiffId"] for x in image["deep"]["layers"]] == exp["diffIds"]
        assert image["tagsApplied"] == image["refs"]
    if target.name.startswith("containerd"):
        _, snapshotter, namespace = target.name.split("-", 2)
        assert receipt["engine"]["snapshotter"] == snapshotter and receipt["engine"]["namespace"] == namespace
        assert receipt["engine"]["storageDriver"] == snapshotter
    if target.name.startswith(("docker", "podman")):
        assert receipt["engine"]["storageDriver"] == target.name.split("-", 1)[1]
    assert len(receipt["staging"]["refs"]) == len(REFS)


def test_engine_holds_the_bundle_identity(contract_bundle: Path, target: Target) -> None:
    """Read back with the engine's own CLI, not through the importer."""
    expected = _expected(contract_bundle)
    seen = {}
    for ref in REFS:
        config, manifest, diff_ids = target.read(ref)
        assert config == expected[ref]["config"], (target.name, ref)
        assert diff_ids == expected[ref]["diffIds"], (target.name, ref)
        if manifest is not None:  # containerd and the OCI layout keep the bundle's own manifest
            assert manifest == expected[ref]["manifest"], (target.name, ref)
        seen[ref] = (config, manifest, diff_ids)
    SEEN[target.name] = seen


def test_names_are_the_bundle_refs_and_no_staging_name_is_left(target: Target) -> None:
    names = target.names()
    assert not [n for n in names if "sneakernet-staging" in n], names
    if target.name.startswith(("containerd", "podman")):  # stored in full, as Docker means them
        assert set(FULL.values()) <= set(names), names
    else:
        assert set(REFS) <= set(names), names


def test_reimport_finds_the_images_already_present(contract_bundle: Path, target: Target, tmp_path: Path) -> None:
    proc = import_pyz(contract_bundle, target, "--json", "--no-receipt", tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    receipt = json.loads(proc.stdout)
    assert [i["status"] for i in receipt["images"]] == ["already-present"] * len(REFS)
    assert all(i["tagsApplied"] == [] for i in receipt["images"])


def test_inventory_lists_the_images(contract_bundle: Path, target: Target, tmp_path: Path) -> None:
    import jsonschema

    from importer.inventory.engine import load_inventory

    proc = run_zipapp(contract_bundle / "bundle-import.pyz", "--inventory", *target.args, "--json", env=target.env,
                      drop_env=("PYTHON", "DOCKER_", "CONTAINERD_"), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = load_inventory(proc.stdout.encode())  # the checksum matches
    schema = json.loads((REPO / "schemas" / "inventory" / "inventory-v1.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    expected = _expected(contract_bundle)
    for ref in REFS:
        exp = expected[ref]
        [entry] = [i for i in doc["images"] if i["diffIds"] == exp["diffIds"]]
        assert entry["configDigest"] == exp["config"]
        assert not entry["problems"]
        if target.name.startswith(("containerd", "oci")):
            assert entry["manifestDigest"] == exp["manifest"]
            assert [b["digest"] for b in entry["blobs"]] == [x["digest"] for x in exp["layers"]]
        else:
            assert entry["blobs"] is None
    # damage is detected
    doc["images"][0]["diffIds"].reverse()
    from importer.errors import InventoryDamaged

    with pytest.raises(InventoryDamaged):
        load_inventory(json.dumps(doc).encode())


def test_every_engine_reports_the_same_identity(contract_bundle: Path) -> None:
    """Config digests and diff_ids identical on every engine this session imported into."""
    if len(SEEN) < 2:
        engines.unavailable("needs the per-engine tests of this module to have run (CI runs them all)")
    reference = {ref: (c, d) for ref, (c, _m, d) in next(iter(SEEN.values())).items()}
    for name, seen in SEEN.items():
        assert {ref: (c, d) for ref, (c, _m, d) in seen.items()} == reference, name
    manifests = {name: {ref: m for ref, (_c, m, _d) in seen.items()} for name, seen in SEEN.items()
                 if name.startswith(("containerd", "oci"))}
    assert len({json.dumps(v, sort_keys=True) for v in manifests.values()}) <= 1


def test_deep_names_a_layer_altered_underneath_the_engine(contract_bundle: Path, target: Target,
                                                          tmp_path: Path) -> None:
    exp = _expected(contract_bundle)["contract:child"]
    n = len(exp["diffIds"])
    with target.tamper(exp):
        proc = import_pyz(contract_bundle, target, "--deep", "--receipt", str(tmp_path / "r.json"), tmp=tmp_path)
    assert proc.returncode == 8, proc.stdout + proc.stderr
    assert "error[deep-mismatch]" in proc.stderr
    assert f"layer {n}/{n} (" in proc.stderr and "of contract:child" in proc.stderr, proc.stderr
    receipt = json.loads((tmp_path / "r.json").read_text())
    assert receipt["result"] == "fail" and receipt["error"]["id"] == "deep-mismatch"
    child = next(i for i in receipt["images"] if i["refs"] == ["contract:child"])
    named = [x["index"] for x in child["deep"]["layers"] if x["checked"] and not x["ok"]]
    assert named == [n], child["deep"]
    base = next(i for i in receipt["images"] if i["refs"] == ["contract:base"])
    assert base["deep"]["ok"] is True
    # restored: --deep passes again
    proc = import_pyz(contract_bundle, target, "--deep", "--no-receipt", tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
