"""The smoke suite for real in this Python (``--no-container``), on the CPU, with the cheapest
gates: injected faults (a rank dying by SIGSEGV, a rank hanging past its timeout) and a CUDA
run on a host without a GPU (SKIP, never PASS)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.kit.smokekit import gate, require_torch, schema_errors, smoke


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


def test_rank_dying_by_sigsegv_fails_shutdown_naming_rank_and_signal(tmp_path: Path) -> None:
    receipt_path = tmp_path / "q.json"
    proc, receipt = smoke("--no-container", "--device", "cpu", "--gates", "allreduce,shutdown",
                          "--inject-fault", "segv:0", "--receipt", str(receipt_path), "--json")
    assert proc.returncode == 11, proc.stderr
    assert not schema_errors(receipt)
    assert receipt["verdict"] == "fail" and receipt["exitCode"] == 11
    down = gate(receipt, "shutdown")
    assert down["status"] == "FAIL"
    assert "rank 0 exited by signal SIGSEGV (11) after destroy_process_group" in down["error"]
    assert down["metrics"]["ranks"][0]["signal"] == "SIGSEGV" and down["metrics"]["ranks"][1]["exitCode"] == 0
    assert gate(receipt, "allreduce")["status"] == "PASS"  # the sums were right; the exit was not
    assert receipt["environment"]["inForce"]["NCCL_RAS_ENABLE"] == "0"
    assert receipt_path.read_text().strip() == proc.stdout.strip()


def test_hung_rank_is_killed_and_the_receipt_still_written(tmp_path: Path) -> None:
    receipt_path = tmp_path / "q.json"
    t0 = time.monotonic()
    proc, receipt = smoke("--no-container", "--device", "cpu", "--gates", "shutdown", "--rank-timeout", "12",
                          "--inject-fault", "hang:1", "--receipt", str(receipt_path), "--json")
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 11, proc.stderr
    assert receipt_path.exists() and not schema_errors(receipt)
    down = gate(receipt, "shutdown")
    assert down["status"] == "FAIL"
    assert "rank 1 hung: still running after 12 s after destroy_process_group; killed (SIGKILL)" in down["error"]
    assert down["metrics"]["ranks"][1]["killed"] is True
    assert gate(receipt, "allreduce")["detail"] == "not selected (--gates)"


def test_cuda_without_a_gpu_skips_and_never_passes(tmp_path: Path) -> None:
    proc, receipt = smoke("--no-container", "--gates", "allreduce", "--gpus", "0", "--env", "NCCL_NVLS_ENABLE=0",
                          "--receipt", str(tmp_path / "q.json"), "--json")
    assert proc.returncode == 10, proc.stderr  # candidate (its own code: 2 is a configuration error)
    assert not schema_errors(receipt)
    assert receipt["verdict"] == "candidate" and receipt["device"] == "cuda" and receipt["exitCode"] == 10
    statuses = {g["name"]: g["status"] for g in receipt["gates"]}
    assert "PASS" not in {statuses[g] for g in ("host", "compat", "torch", "allreduce")}
    assert statuses["torch"] == "SKIP" and "use --device cpu" in gate(receipt, "torch")["detail"]
    assert gate(receipt, "allreduce")["detail"].startswith("not run: the torch gate did not pass")
    assert receipt["environment"]["job"] == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_NVLS_ENABLE": "0",
                                             "NCCL_RAS_ENABLE": "0"}
    assert receipt["environment"]["inForce"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_gpu_check_script_prints_the_receipt(tmp_path: Path) -> None:
    """scripts/gpu-check.sh on this GPU-less machine: the receipt on stdout, CUDA gates SKIP."""
    import json
    import subprocess

    from tests.kit.helpers import REPO

    receipt_path = tmp_path / "gpu.json"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(receipt_path), "--gates", "shutdown"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode in (0, 1, 10), proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt == json.loads(receipt_path.read_text()) and not schema_errors(receipt)
    assert receipt["device"] == "cuda" and receipt["settings"]["container"] is False
    assert f"gpu-check: verdict {receipt['verdict']}" in proc.stderr
    if not receipt["host"]["gpus"]:
        assert proc.returncode == 10 and gate(receipt, "torch")["status"] == "SKIP"


def test_gpu_check_takes_smoke_flags_without_a_receipt_path(tmp_path: Path) -> None:
    """`sneakernet-gpu-check --gpus 0` (what docs/validation.md shows, no RECEIPT first): --gpus is a
    smoke flag, never the receipt path; the receipt goes to a fresh folder under $TMPDIR."""
    import json

    from tests.kit.helpers import run_cli

    work = tmp_path / "cwd"
    work.mkdir()
    proc = run_cli("importer.cli.gpucheck", "--gpus", "0", "--gates", "shutdown", cwd=work,
                   env={"TMPDIR": str(tmp_path)}, timeout=600)
    assert proc.returncode in (0, 1, 10), proc.stderr
    assert list(work.iterdir()) == []  # no file named --gpus (or anything else) in the current folder
    written = list(tmp_path.glob("sneakernet-gpu-check.*/qualification.json"))
    assert len(written) == 1, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt == json.loads(written[0].read_text()) and not schema_errors(receipt)
    assert receipt["environment"]["job"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert f"receipt {written[0]}" in proc.stderr


def test_gpu_check_argument_split() -> None:
    from importer.cli.gpucheck import split_args

    assert split_args(["--gpus", "0,1"]) == (None, ["--gpus", "0,1"])
    assert split_args(["/tmp/q.json", "--gpus", "0,1"]) == ("/tmp/q.json", ["--gpus", "0,1"])
    assert split_args(["--gpus", "0,1", "--receipt", "r.json", "--env", "A=1"]) == ("r.json",
                                                                                     ["--gpus", "0,1", "--env", "A=1"])
    assert split_args(["--receipt=r.json"]) == ("r.json", [])
    with pytest.raises(ValueError, match="two receipt paths"):
        split_args(["a.json", "--receipt", "b.json"])
    with pytest.raises(ValueError, match="needs a path"):
        split_args(["--receipt"])


def test_gpu_check_is_a_console_script() -> None:
    """pip installs `sneakernet-gpu-check` (the docs' command on a GPU host), pointing at a real main."""
    import importlib

    import tomllib

    from tests.kit.helpers import REPO

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["sneakernet-gpu-check"] == "importer.cli.gpucheck:main"
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func))
