"""The smoke suite inside a real container of the test dockerd, on the CPU: an image FROM
scratch with busybox, the host's Python, torch and g++ bind-mounted read-only. The whole suite
once (gloo across 2 processes, inductor, fused AdamW) with --restart, then the cheap failure
cases, then `bundle-import BUNDLE --verify --smoke`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kit.helpers import docker, run_cli
from tests.kit.smokekit import (
    build_smoke_image,
    gate,
    host_mounts,
    no_smoke_containers,
    python_without_torch,
    schema_errors,
    smoke,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def image(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_smoke_image(docker_host, busybox, tmp_path_factory.mktemp("smoke-ctx"))


def test_whole_suite_in_a_container_passes_on_cpu_and_after_a_restart(docker_host: str, image: str,
                                                                      tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text("# job-scoped\nTORCH_SHOW_CPP_STACKTRACES=1\nNCCL_NVLS_ENABLE=0\n")
    receipt_path = tmp_path / "qualification.json"
    proc, receipt = smoke(image, "--device", "cpu", "--restart", *host_mounts(), "--env", "NCCL_P2P_DISABLE=1",
                          "--env-file", str(env_file), "--receipt", str(receipt_path), "--json",
                          docker_host=docker_host)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not schema_errors(receipt)
    assert json.loads(receipt_path.read_text()) == receipt
    assert receipt["verdict"] == "pass" and receipt["exitCode"] == 0
    statuses = {g["name"]: g["status"] for g in receipt["gates"]}
    assert statuses == {"host": "SKIP", "compat": "SKIP", "torch": "PASS", "matmul": "PASS", "compile": "PASS",
                        "optimizer": "PASS", "allreduce": "PASS", "shutdown": "PASS", "restart": "PASS"}
    assert gate(receipt, "torch")["metrics"]["torch"].startswith("2.")
    assert gate(receipt, "matmul")["metrics"]["relError"] < 2e-2
    assert gate(receipt, "compile")["metrics"]["maxGradRelError"] < 1e-3
    assert gate(receipt, "optimizer")["metrics"]["maxParamRelError"] < 1e-5
    reduce_ = gate(receipt, "allreduce")["metrics"]
    assert reduce_["backend"] == "gloo" and reduce_["world"] == 2 and reduce_["wrong"] == 0
    assert all(s["busbwGBps"] > 0 and s["algbwGBps"] == s["busbwGBps"] for s in reduce_["sizes"])  # n=2: factor 1
    assert [r["exitCode"] for r in gate(receipt, "shutdown")["metrics"]["ranks"]] == [0, 0]
    restart = gate(receipt, "restart")["metrics"]
    assert restart["mode"] == "container" and restart["secondRun"]["compile"] == "PASS"
    in_force = receipt["environment"]["inForce"]
    assert in_force["NCCL_P2P_DISABLE"] == "1" and in_force["NCCL_NVLS_ENABLE"] == "0"
    assert in_force["TORCH_SHOW_CPP_STACKTRACES"] == "1" and in_force["NCCL_RAS_ENABLE"] == "0"
    assert receipt["environment"]["defaults"] == {"NCCL_RAS_ENABLE": "0"}
    image_id = docker(docker_host, "image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    assert receipt["image"]["id"] == image_id and receipt["image"]["ref"] == image
    assert receipt["engine"]["kind"] == "docker" and receipt["settings"]["container"] is True
    assert no_smoke_containers(docker_host)


def test_wrong_all_reduce_sum_fails_in_the_container(docker_host: str, image: str, tmp_path: Path) -> None:
    proc, receipt = smoke(image, "--device", "cpu", "--gates", "allreduce", *host_mounts(),
                          "--inject-fault", "wrong-sum", "--receipt", str(tmp_path / "q.json"), "--json",
                          docker_host=docker_host)
    assert proc.returncode == 11, proc.stderr
    assert not schema_errors(receipt)
    reduce_ = gate(receipt, "allreduce")
    assert reduce_["status"] == "FAIL" and "all-reduce returned wrong sums" in reduce_["error"]
    assert reduce_["metrics"]["wrong"] > 0 and all(s["wrong"] > 0 for s in reduce_["metrics"]["sizes"])
    assert gate(receipt, "compile")["status"] == "SKIP" and receipt["verdict"] == "fail"
    assert no_smoke_containers(docker_host)


def test_image_without_torch_fails_clearly(docker_host: str, image: str, tmp_path: Path) -> None:
    py = python_without_torch()
    proc, receipt = smoke(image, "--device", "cpu", *host_mounts(), f"--volume={Path(py).parents[1]}:"
                          f"{Path(py).parents[1]}", "--python", py, "--receipt", str(tmp_path / "q.json"), "--json",
                          docker_host=docker_host)
    assert proc.returncode == 11, proc.stderr
    assert not schema_errors(receipt)
    torch_gate = gate(receipt, "torch")
    assert torch_gate["status"] == "FAIL"
    assert "importing torch" in torch_gate["error"] and "No module named 'torch'" in torch_gate["error"]
    assert gate(receipt, "allreduce")["detail"].startswith("not run: the torch gate did not pass")


def test_image_without_python_fails_clearly(docker_host: str, image: str, tmp_path: Path) -> None:
    proc, receipt = smoke(image, "--device", "cpu", "--receipt", str(tmp_path / "q.json"), "--json",
                          docker_host=docker_host)
    assert proc.returncode == 11, proc.stderr
    assert not schema_errors(receipt)
    assert "could not start `python3` in the image" in gate(receipt, "torch")["error"]
    assert "executable file not found" in gate(receipt, "torch")["error"]


def test_missing_image_is_a_configuration_error(docker_host: str) -> None:
    proc, doc = smoke("smoke-absent:1", "--device", "cpu", "--json", docker_host=docker_host)
    assert proc.returncode == 2
    assert doc["error"]["id"] == "smoke-config" and "never pulls" in doc["error"]["hint"]


def test_import_then_smoke(docker_host: str, image: str, tmp_path: Path) -> None:
    bundle = tmp_path / "smoke.bundle"
    run_cli("bundle", "export", image, "-o", str(bundle), "--schema", "3", docker_host=docker_host, check=True)
    receipt_path = tmp_path / "q.json"
    proc = run_cli("importer", str(bundle), "--verify", "--engine", "docker", "--docker-host", docker_host,
                   "--receipt", str(tmp_path / "import.json"), "--smoke", "--device", "cpu", "--gates", "allreduce",
                   *host_mounts(), "--smoke-receipt", str(receipt_path), "--json")
    assert proc.returncode == 10, proc.stdout + proc.stderr  # candidate: matmul, compile, ... not selected
    doc = json.loads(proc.stdout)
    assert doc["import"]["result"] == "pass" and doc["exitCode"] == 10
    (q,) = doc["qualifications"]
    assert not schema_errors(q) and json.loads(receipt_path.read_text()) == q
    assert q["verdict"] == "candidate" and gate(q, "allreduce")["status"] == "PASS"
    assert q["bundle"] == {"path": str(bundle), "digest": doc["import"]["bundle"]["digest"]}
    assert q["image"]["ref"] == image
