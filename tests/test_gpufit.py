"""GPU fit before the gap (docs/gpu-fit.md), end to end with a real dockerd and images that carry
what nvidia/cuda base images carry (tests/kit/imagegen.py cuda_context: their env, their compat
libraries, a torch/version.py): bundle.json records each image's CUDA needs (schema 3.4),
`bundle export --have INVENTORY` judges them on the inventory's host (inventories taken with the
nvidia-smi outputs of tests/golden/nvidia-smi, tests/kit/gpukit.py) and `bundle-import` on its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.kit import engines
from tests.kit.clijson import failed, ok, validate
from tests.kit.gpukit import HOSTS, gpu_env, no_gpu_env, take_inventory
from tests.kit.helpers import REPO, docker, run_cli, run_pyz
from tests.kit.imagegen import cuda_context, simple_context

pytestmark = pytest.mark.engine

IMG124 = "gpufit/cuda124:1"  # nvidia/cuda:12.4.1-runtime-ubuntu22.04's env and compat libs, torch cu124
IMG130 = "gpufit/cuda130:1"  # nvidia/cuda:13.0.0-runtime-ubuntu24.04's
PLAIN = "gpufit/plain:1"  # no CUDA at all
BARE124 = "gpufit/cuda124-nocompat:1"  # 12.4.1's env without the compat libraries


@pytest.fixture(scope="module")
def images(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("gpufit-ctx")
    engines.build_image(docker_host, cuda_context(root / "a", busybox, "12.4.1-runtime-ubuntu22.04",
                                                  torch_cuda="12.4"), IMG124)
    engines.build_image(docker_host, cuda_context(root / "b", busybox, "13.0.0-runtime-ubuntu24.04"), IMG130)
    engines.build_image(docker_host, simple_context(root / "c", busybox, "plain\n"), PLAIN)
    engines.build_image(docker_host, cuda_context(root / "d", busybox, "12.4.1-runtime-ubuntu22.04", compat=False),
                        BARE124)
    return docker_host


@pytest.fixture(scope="module")
def inventories(images: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("inv")
    return {host: take_inventory(tmp, images, host) for host in ("h100-r550", "l4-r545", "rtx4090-r535", "a100-r470")}


def _bundle_json(path: Path) -> Any:
    return json.loads((path / "bundle.json").read_text())


def test_bundle_json_records_each_images_cuda_needs(images: str, tmp_path: Path) -> None:
    out = tmp_path / "b"
    run_cli("bundle", "export", IMG124, IMG130, PLAIN, "-o", str(out), docker_host=images, check=True)
    doc = _bundle_json(out)
    schema = json.loads((REPO / "schemas/bundle/v3.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["schemaVersion"] == "3.4"
    cuda = {i["refs"][0]: i.get("cuda") for i in doc["images"]}
    assert cuda[PLAIN] is None
    a = cuda[IMG124]
    assert a["cudaVersion"] == "12.4.1" and a["compatLibs"] == ["550.54.15"] and a["torchCuda"] == "12.4"
    assert a["require"]["NVIDIA_REQUIRE_CUDA"].startswith("cuda>=12.4 brand=tesla,driver>=470,driver<471 ")
    assert a["disableRequire"] is False
    assert cuda[IMG130]["compatLibs"] == ["580.65.06"] and cuda[IMG130]["torchCuda"] is None
    info = ok("inspect", run_cli("bundle", "inspect", str(out), "--json"))
    assert {i["refs"][0]: i["cuda"] for i in info["images"]} == cuda
    human = run_cli("bundle", "inspect", str(out), check=True).stdout
    assert (f"cuda: {IMG124}: CUDA 12.4 (CUDA_VERSION); compat libraries 550.54.15; torch built for CUDA 12.4; "
            "requires NVIDIA_REQUIRE_CUDA") in human
    # an older importer (the golden 3.0 bundle's) still verifies it: the field is optional
    old = run_pyz(out, "--verify-only", pyz=REPO / "tests/golden/bundles/v3/bundle-import.pyz")
    assert old.returncode == 0, old.stderr


def test_layers_are_scanned_on_the_blob_copy_path_too(images: str, tmp_path: Path) -> None:
    """An OCI layout source (a bundle folder is one) copies compressed blobs as they are: the
    compat libraries and torch's CUDA are seen while they are decompressed for the diff_id."""
    first = tmp_path / "first"
    run_cli("bundle", "export", IMG124, "-o", str(first), "--compression", "gzip", docker_host=images, check=True)
    again = tmp_path / "again"
    run_cli("bundle", "export", f"oci:{first}:{IMG124}", "-o", str(again), check=True)
    want = _bundle_json(first)["images"][0]["cuda"]
    assert want["compatLibs"] == ["550.54.15"] and want["torchCuda"] == "12.4"
    assert _bundle_json(again)["images"][0]["cuda"] == want


def test_export_have_prints_one_fit_line_per_image(images: str, inventories: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "fit"
    proc = run_cli("bundle", "export", IMG124, PLAIN, "-o", str(out), "--have", str(inventories["h100-r550"]),
                   docker_host=images, check=True)
    assert f"gpu fit: {IMG124}: fits: driver supports CUDA 12.4 >= image CUDA 12.4" in proc.stdout
    assert f"gpu fit: {PLAIN}: no-cuda" in proc.stdout
    doc = ok("export", run_cli("bundle", "export", IMG124, "-o", str(tmp_path / "j"), "--have",
                               str(inventories["rtx4090-r535"]), "--json", docker_host=images))
    fit = doc["gpuFit"]
    assert fit["driverVersion"] == "535.104.05" and fit["cudaDriverVersion"] == "12.2"
    assert [(i["image"], i["status"], i["admitted"]) for i in fit["images"]] == [(IMG124, "fits-minor-compat", True)]


def test_export_refuses_an_unfit_image_and_writes_nothing(images: str, inventories: dict[str, Path],
                                                          tmp_path: Path) -> None:
    # L4 on r545: 12.3 < 12.4 and r545 is in none of the image's brand groups: the hook refuses it
    out = tmp_path / "refused"
    proc = run_cli("bundle", "export", IMG124, "-o", str(out), "--have", str(inventories["l4-r545"]), "--json",
                   docker_host=images)
    doc = failed("export", proc, "gpu-unfit", 7)
    assert "unsatisfied condition: cuda>=12.4" in doc["error"]["message"]
    assert "550.54.14 or newer" in doc["error"]["message"]
    assert "config alone" in doc["error"]["message"]  # no layer can change the toolkit's admission
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no bundle, no .partial- folder
    # with --allow-unfit it is carried, and the JSON says why it will not run
    doc = ok("export", run_cli("bundle", "export", IMG124, "-o", str(out), "--have", str(inventories["l4-r545"]),
                               "--allow-unfit", "--json", docker_host=images))
    assert doc["gpuFit"]["allowUnfit"] is True and doc["gpuFit"]["images"][0]["status"] == "unfit"
    assert (out / "bundle.json").is_file()


def test_the_config_alone_refuses_before_any_layer_is_read(images: str, inventories: dict[str, Path],
                                                           tmp_path: Path) -> None:
    # 13.0 on a GeForce r535 host: another major, and no forward compatibility on GeForce
    proc = run_cli("bundle", "export", IMG130, "-o", str(tmp_path / "x"), "--have",
                   str(inventories["rtx4090-r535"]), "--json", docker_host=images)
    doc = failed("export", proc, "gpu-unfit", 7)
    msg = doc["error"]["message"]
    assert "by its config alone, before any layer was read" in msg
    assert "non-data-center" in msg and "580.65.06 or newer" in msg
    assert list(tmp_path.iterdir()) == []


def test_what_the_layers_show_decides_after_the_one_pass(images: str, inventories: dict[str, Path],
                                                         tmp_path: Path) -> None:
    # A100 on r470 (CUDA 11.4) admits 12.4 images (brand=nvidia,driver>=470,driver<471): the compat
    # libraries in a layer bridge the major (forward compatibility); without them it is unfit
    doc = ok("export", run_cli("bundle", "export", IMG124, "-o", str(tmp_path / "fwd"), "--have",
                               str(inventories["a100-r470"]), "--json", docker_host=images))
    assert doc["gpuFit"]["images"][0]["status"] == "fits-forward-compat"
    out = tmp_path / "bare"
    doc = failed("export", run_cli("bundle", "export", BARE124, "-o", str(out), "--have",
                                   str(inventories["a100-r470"]), "--json", docker_host=images), "gpu-unfit", 7)
    assert "config alone" not in doc["error"]["message"] and "no /usr/local/cuda*/compat" in doc["error"]["message"]
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["fwd"]  # the half-made bundle is gone


def test_an_inventory_without_the_gpu_side_is_unknown_not_refused(images: str, inventories: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    from importer.inventory.engine import checksum

    doc = json.loads(inventories["l4-r545"].read_text())
    del doc["gpu"]
    doc["inventoryVersion"] = "1.2"
    doc["checksum"] = checksum(doc)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    res = ok("export", run_cli("bundle", "export", IMG124, "-o", str(tmp_path / "b"), "--have", str(old), "--json",
                               docker_host=images))
    assert res["gpuFit"]["images"][0]["status"] == "unknown" and res["gpuFit"]["known"] is False


@pytest.mark.parametrize("host", HOSTS)
def test_inventory_records_the_gpu_side(images: str, host: str, tmp_path: Path) -> None:
    path = take_inventory(tmp_path, images, host)
    doc = json.loads(path.read_text())
    validate("inventory", doc)
    gpu = doc["gpu"]
    assert doc["inventoryVersion"] == "1.5" and gpu["source"] == "nvidia-smi"
    smi = (REPO / "tests/golden/nvidia-smi" / f"{host}.q.txt").read_text()
    assert f"Driver Version                            : {gpu['driverVersion']}\n" in smi
    assert f"CUDA Version                              : {gpu['cudaDriverVersion']}\n" in smi
    assert gpu["gpus"] and all(g["computeCapability"] for g in gpu["gpus"])
    assert all(g["datacenter"] is (not host.startswith("rtx")) for g in gpu["gpus"])
    assert gpu["toolkit"]["ctkVersion"] == "1.16.2" and gpu["toolkit"]["mode"] == "legacy"


def test_inventory_says_when_there_is_no_gpu(images: str, tmp_path: Path) -> None:
    proc = run_cli("importer", "--inventory", "--docker-host", images, env=no_gpu_env(tmp_path))
    doc = json.loads(proc.stdout)
    assert doc["gpu"]["source"] is None and doc["gpu"]["gpus"] == [] and "no NVIDIA driver" in doc["gpu"]["note"]


def test_import_checks_the_fit_on_the_host_before_loading(images: str, tmp_path: Path) -> None:
    out = tmp_path / "b"
    run_cli("bundle", "export", IMG124, "-o", str(out), docker_host=images, check=True)
    docker(images, "image", "rm", IMG124)
    l4 = gpu_env(tmp_path, "l4-r545")
    refused = run_cli("importer", str(out), "--docker-host", images, "--require-fit", "--json",
                      "--receipt", str(tmp_path / "r1.json"), env=l4)
    doc = failed("import", refused, "gpu-unfit", 7)
    assert "unsatisfied condition: cuda>=12.4" in doc["error"]["message"]
    assert engines.docker(images, "image", "ls", "-q", IMG124).strip() == ""  # nothing loaded
    warned = run_cli("importer", str(out), "--docker-host", images, "--json", "--receipt",
                     str(tmp_path / "r2.json"), env=l4)
    receipt = ok("import", warned)
    assert f"warning: gpu fit: {IMG124}: unfit" in warned.stderr
    assert receipt["gpuFit"]["images"][0]["status"] == "unfit"
    assert json.loads((tmp_path / "r2.json").read_text())["gpuFit"] == receipt["gpuFit"]
    again = ok("import", run_cli("importer", str(out), "--docker-host", images, "--json", "--require-fit",
                                 "--receipt", str(tmp_path / "r3.json"), env=gpu_env(tmp_path, "h100-r550")))
    assert again["gpuFit"]["images"][0]["status"] == "fits"
