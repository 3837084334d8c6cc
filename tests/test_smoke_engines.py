"""The smoke suite on containerd (``ctr run``) and podman, on the CPU, with real engines: the
smoke image of test_smoke_container.py is exported from the test dockerd into a bundle, then
per engine two container runs: ``bundle-import BUNDLE --verify --smoke`` (the whole suite
passes, the receipt names the engine), then ``bundle-import smoke IMAGE --engine ...`` with a
wrong all-reduce sum injected (verdict fail). No container is left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest

from tests.kit import engine_stores
from tests.kit.helpers import run_cli
from tests.kit.smokekit import build_smoke_image, gate, host_mounts, schema_errors, smoke

pytestmark = pytest.mark.engine
NAMESPACE = "smoke"


@pytest.fixture(scope="module")
def smoke_bundle(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, str]:
    image = build_smoke_image(docker_host, busybox, tmp_path_factory.mktemp("smoke-ctx"))
    bundle = tmp_path_factory.mktemp("smoke-bundle") / "smoke.bundle"
    run_cli("bundle", "export", image, "-o", str(bundle), "--schema", "3", docker_host=docker_host, check=True)
    return bundle, image


Engine = Tuple[List[str], Callable[[], List[str]], Callable[[str], str]]


def _containerd(request: pytest.FixtureRequest) -> Engine:
    address = str(request.getfixturevalue("containerd_address"))

    def leftovers() -> List[str]:
        return engine_stores.ctr(address, NAMESPACE, "containers", "ls", "-q").split()

    def config_digest(ref: str) -> str:
        out = engine_stores.ctr(address, NAMESPACE, "images", "ls", f"name==docker.io/library/{ref}")
        target = out.splitlines()[1].split()[2]
        manifest = json.loads(engine_stores.ctr(address, NAMESPACE, "content", "get", target))
        return str(manifest["config"]["digest"])

    return (["--engine", "containerd", "--address", address, "--namespace", NAMESPACE], leftovers, config_digest)


def _podman(request: pytest.FixtureRequest) -> Engine:
    store: Any = request.getfixturevalue("podman_vfs")

    def leftovers() -> List[str]:
        return str(store.podman("ps", "-a", "--format", "{{.Names}}").stdout).split()

    def config_digest(ref: str) -> str:
        return f"sha256:{store.inspect(ref)['Id']}"

    # this machine refuses podman's default rlimits (tests/engine_stores.PODMAN_RUN_ARGS)
    return ([*store.importer_args(), "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"], leftovers,
            config_digest)


@pytest.mark.parametrize("kind", ["containerd", "podman"])
def test_import_smoke_passes_and_an_injected_fault_fails(kind: str, smoke_bundle: Tuple[Path, str],
                                                         request: pytest.FixtureRequest, tmp_path: Path) -> None:
    bundle, image = smoke_bundle
    engine_args, leftovers, config_digest = (_containerd if kind == "containerd" else _podman)(request)
    receipt_path = tmp_path / "q.json"
    proc = run_cli("importer", str(bundle), "--verify", *engine_args, "--receipt", str(tmp_path / "import.json"),
                   "--smoke", "--device", "cpu", *host_mounts(), "--smoke-receipt", str(receipt_path), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["import"]["result"] == "pass" and doc["import"]["engine"]["kind"] == kind
    (q,) = doc["qualifications"]
    assert not schema_errors(q) and json.loads(receipt_path.read_text()) == q
    assert q["verdict"] == "pass" and q["exitCode"] == 0
    statuses = {g["name"]: g["status"] for g in q["gates"]}
    assert statuses == {"host": "SKIP", "compat": "SKIP", "torch": "PASS", "matmul": "PASS", "compile": "PASS",
                        "optimizer": "PASS", "allreduce": "PASS", "shutdown": "PASS"}
    reduce_ = gate(q, "allreduce")["metrics"]
    assert reduce_["backend"] == "gloo" and reduce_["world"] == 2 and reduce_["wrong"] == 0
    assert q["engine"]["kind"] == kind and q["settings"]["engine"] == kind and q["settings"]["container"] is True
    assert q["image"]["id"] == config_digest(image)
    assert q["bundle"] == {"path": str(bundle), "digest": doc["import"]["bundle"]["digest"]}
    assert leftovers() == []

    proc, receipt = smoke(image, *engine_args, "--device", "cpu", "--gates", "allreduce", *host_mounts(),
                          "--inject-fault", "wrong-sum", "--no-receipt", "--json")
    assert proc.returncode == 11, proc.stdout + proc.stderr
    assert not schema_errors(receipt)
    failed = gate(receipt, "allreduce")
    assert failed["status"] == "FAIL" and "all-reduce returned wrong sums" in failed["error"]
    assert receipt["verdict"] == "fail" and receipt["engine"]["kind"] == kind
    assert receipt["image"]["id"] == q["image"]["id"]
    assert leftovers() == []


def test_smoke_into_an_oci_layout_is_refused_before_the_import(smoke_bundle: Tuple[Path, str],
                                                               tmp_path: Path) -> None:
    bundle, _ = smoke_bundle
    proc = run_cli("importer", str(bundle), "--engine", "oci", "--oci-dir", str(tmp_path / "layout"), "--smoke",
                   "--device", "cpu", "--no-receipt")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "expected an engine that runs containers" in proc.stderr and not (tmp_path / "layout").exists()
