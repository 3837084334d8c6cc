"""importer/inventory/gpuhost.py, engine-free: the NVML path through ctypes (on a compiled
stand-in for the absent libnvidia-ml), the nvidia-smi parsers on the golden outputs and on
hostile text, and an inventory's ``gpu`` object read back with hostile values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from importer.format import cudafit
from importer.inventory.gpuhost import parse_compute_caps, parse_smi_q
from tests.kit.gpukit import HOSTILE_VERSIONS, HOSTS, SMI_DIR, fake_nvml, gpu_env, no_gpu_env
from tests.kit.helpers import REPO

PROBE = "import json; from importer.inventory.gpuhost import probe; print(json.dumps(probe()))"


def _probe(env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    import os

    proc = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_nvml_through_ctypes(tmp_path: Path) -> None:
    env = {**no_gpu_env(tmp_path), "SNEAKERNET_NVML_LIBRARY": str(fake_nvml(tmp_path))}
    doc = _probe(env)
    assert (doc["source"], doc["driverVersion"], doc["cudaDriverVersion"]) == ("nvml", "550.54.15", "12.4")
    assert doc["gpus"] == [{"index": i, "name": "NVIDIA H100 80GB HBM3", "brand": "NVIDIA", "computeCapability": "9.0",
                            "datacenter": True} for i in range(2)]


def test_nvml_absent_falls_back_to_nvidia_smi_then_to_none(tmp_path: Path) -> None:
    assert _probe(gpu_env(tmp_path, "b200-r570"))["source"] == "nvidia-smi"
    doc = _probe(no_gpu_env(tmp_path))
    assert doc["source"] is None and doc["gpus"] == [] and doc["toolkit"]["mode"] is None


@pytest.mark.parametrize("host", HOSTS)
def test_smi_parsers_on_the_golden_outputs(host: str) -> None:
    doc = parse_smi_q((SMI_DIR / f"{host}.q.txt").read_text())
    caps = parse_compute_caps((SMI_DIR / f"{host}.compute_cap.csv").read_text())
    assert doc["driverVersion"] and doc["cudaDriverVersion"] and len(doc["gpus"]) == len(caps)
    assert {g["name"] for g in doc["gpus"]} and all(g["brand"] for g in doc["gpus"])


@pytest.mark.parametrize("text", [
    "", "garbage\x00\xff", "Driver Version : \nCUDA Version : x\n", "GPU :\n" * 1000,
    "    Product Name : orphan before any GPU\n", "A" * 1_000_000,
])
def test_smi_parser_on_hostile_text(text: str) -> None:
    doc = parse_smi_q(text)
    assert len(doc["gpus"]) <= 64
    target = cudafit.target_from_gpu_doc(doc)
    fit = cudafit.decide(cudafit.ImageNeeds(cuda="12.4.1"), target)
    assert fit.status in cudafit.STATUSES and fit.reason
    assert parse_compute_caps("0, 9.0\n1, x\nfoo\n2, 99999.1\n") == {0: "9.0"}


@pytest.mark.parametrize("gpu", [
    None, [], "x", {"gpus": "no"}, {"gpus": [1, None, {"name": 5}]}, {"driverVersion": 550, "cudaDriverVersion": []},
    {"toolkit": "cdi", "gpus": [{"name": "NVIDIA H100", "datacenter": "yes", "brand": 3}]},
])
def test_inventory_gpu_object_with_hostile_values(gpu: object) -> None:
    target = cudafit.target_from_gpu_doc(gpu)
    fit = cudafit.decide(cudafit.ImageNeeds(cuda="12.4.1"), target)
    assert fit.status in (cudafit.UNKNOWN, cudafit.NO_GPU) and not fit.refused


# ============================== digits outside ASCII 0-9 are no version (issue 38, class 6)
HOSTILE = pytest.mark.parametrize("bad", list(HOSTILE_VERSIONS.values()), ids=list(HOSTILE_VERSIONS))


def _fit(doc: dict, bad: str = "") -> tuple:  # type: ignore[type-arg]
    """The decision on this GPU side for a 12.4 image, the hostile value written as 'abc'."""
    fit = cudafit.decide(cudafit.ImageNeeds(cuda="12.4.1"), cudafit.target_from_gpu_doc(doc))
    return fit.status, fit.reason.replace(bad, "abc") if bad else fit.reason, fit.admitted


@HOSTILE
def test_nvidia_smi_with_non_ascii_digits_reads_as_garbage(bad: str, tmp_path: Path) -> None:
    """nvidia-smi printing another script's digits for the driver, its CUDA, the compute
    capability and the toolkit's version: each is as unparseable as 'abc', nothing crashes."""
    caps = f"0, {bad}\n{bad}, 9.0\n\u00b2, 9.0\n"
    got = _probe(gpu_env(tmp_path / "bad", "h100-r550", driver=bad, cuda=bad, ctk_version=bad, caps=caps))
    abc = _probe(gpu_env(tmp_path / "abc", "h100-r550", driver="abc", cuda="abc", ctk_version="abc",
                         caps="0, abc\nabc, 9.0\nx, 9.0\n"))
    assert (got["driverVersion"], got["cudaDriverVersion"]) == (bad, bad)  # recorded as printed, judged unparseable
    assert [g["computeCapability"] for g in got["gpus"]] == [g["computeCapability"] for g in abc["gpus"]]
    assert got["toolkit"]["ctkVersion"] is None and abc["toolkit"]["ctkVersion"] is None
    assert cudafit.target_from_gpu_doc(got).driver_cuda() is None
    assert _fit(got, bad) == _fit(abc)
    assert parse_compute_caps(caps) == {}


@HOSTILE
def test_nvml_driver_with_non_ascii_digits_reads_as_garbage(bad: str, tmp_path: Path) -> None:
    env = {**no_gpu_env(tmp_path), "SNEAKERNET_NVML_LIBRARY": str(fake_nvml(tmp_path, driver=bad))}
    doc = _probe(env)
    assert doc["source"] == "nvml" and cudafit.parse_version(doc["driverVersion"]) is None
    assert doc["cudaDriverVersion"] == "12.4"  # NVML's integer, not text
    assert cudafit.cuda_of_driver(doc["driverVersion"]) is None
