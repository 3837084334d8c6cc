"""Smoke suite, the parts that need no engine and no GPU: the CUDA compatibility table, NVML
absent or answering (absent hardware is the one thing mocked), settings, engine command lines,
the gates -> verdict rules, the receipt schema, the suite's files in the zipapp, time limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from importer.smoke import container as ctr
from importer.smoke import runner
from importer.smoke.host import HostFacts, HostGPU, parse_smi_cuda, parse_smi_query, probe_host
from importer.smoke.receipt import build_qualification_receipt
from importer.smoke.results import RunOutcome, order, required_gates, restart_gate, suite_gates, verdict
from importer.smoke.runner import Qualification, run_bounded
from importer.smoke.settings import SmokeConfigError, SmokeSettings, build_settings, choose_engine, read_env_file
from importer.smoke.tree import write_tree
from importer.smoke.worker import MODULES
from importer.smoke.worker.compat import (
    MODE_FORWARD,
    MODE_NATIVE,
    decide_compat,
    find_compat_dirs,
    image_cuda_from_env,
    is_datacenter_gpu,
    parse_version,
    version_from_nvml,
)
from importer.smoke.worker.protocol import SELECTABLE, result
from tests.kit.gpukit import HOSTILE_VERSIONS
from tests.kit.helpers import REPO, run_cli, run_zipapp
from tests.kit.smokekit import schema_errors

# ============================== the compat decision table
# host CUDA, image CUDA, data-center GPU, compat libs -> mode, status, compat libs used
TABLE = [
    ((12, 4), (12, 4), True, None, MODE_NATIVE, "PASS", False),
    ((12, 8), (12, 1), False, None, MODE_NATIVE, "PASS", False),
    ((12, 8), (12, 1), True, "/usr/local/cuda/compat", MODE_NATIVE, "PASS", False),  # never force compat (803)
    ((12, 2), (12, 8), True, "/usr/local/cuda/compat", MODE_FORWARD, "PASS", True),
    ((11, 8), (12, 4), True, "/usr/local/cuda/compat", MODE_FORWARD, "PASS", True),
    ((11, 8), (12, 4), None, "/usr/local/cuda/compat", MODE_FORWARD, "WARN", True),
    ((11, 8), (12, 4), False, "/usr/local/cuda/compat", MODE_NATIVE, "FAIL", False),  # 804 on GeForce
    ((12, 2), (12, 8), False, "/usr/local/cuda/compat", MODE_NATIVE, "WARN", False),  # minor-version compat
    ((12, 2), (12, 8), True, None, MODE_NATIVE, "WARN", False),
    ((11, 8), (12, 4), True, None, MODE_NATIVE, "FAIL", False),  # error 35 / cuda>=12.4
    ((12, 4), None, True, None, MODE_NATIVE, "WARN", False),
    (None, (12, 4), True, "/usr/local/cuda/compat", "unknown", "SKIP", False),
]


@pytest.mark.parametrize(("host", "image", "datacenter", "compat", "mode", "status", "use"), TABLE)
def test_compat_decision_table(host: Any, image: Any, datacenter: Any, compat: Any, mode: str, status: str,
                               use: bool) -> None:
    d = decide_compat(device="cuda", host_cuda=host, image_cuda=image, datacenter=datacenter, compat_dir=compat)
    assert (d.mode, d.status, d.use_compat_libs) == (mode, status, use), d.reason
    assert d.reason


def test_compat_says_why() -> None:
    newer_host = decide_compat(device="cuda", host_cuda=(12, 8), image_cuda=(12, 1), datacenter=True,
                               compat_dir="/usr/local/cuda-12.1/compat")
    assert "803" in newer_host.reason
    geforce = decide_compat(device="cuda", host_cuda=(11, 8), image_cuda=(12, 4), datacenter=False,
                            compat_dir="/usr/local/cuda/compat")
    assert "unsupported on non-data-center" in geforce.reason and "804" in geforce.reason
    old_driver = decide_compat(device="cuda", host_cuda=(11, 8), image_cuda=(12, 4), datacenter=True, compat_dir=None)
    assert "cuda>=12.4" in old_driver.reason
    cpu = decide_compat(device="cpu", host_cuda=None, image_cuda=(12, 4), datacenter=None, compat_dir=None)
    assert (cpu.mode, cpu.status) == ("not-applicable", "SKIP")


def test_cuda_versions_from_image_env_and_nvml(tmp_path: Path) -> None:
    assert parse_version("12.4.1") == (12, 4) and parse_version("x") is None and parse_version(None) is None
    assert version_from_nvml(12040) == (12, 4) and version_from_nvml(11080) == (11, 8) and version_from_nvml(0) is None
    assert image_cuda_from_env({"CUDA_VERSION": "12.6.3"}) == ((12, 6), "CUDA_VERSION")
    assert image_cuda_from_env({"NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471"}) == (
        (12, 4), "NVIDIA_REQUIRE_CUDA")
    assert image_cuda_from_env({}) == (None, None)
    compat = tmp_path / "usr/local/cuda-12.4/compat"
    compat.mkdir(parents=True)
    (tmp_path / "usr/local/cuda-12.4/lib64").mkdir()
    assert find_compat_dirs(str(tmp_path)) == []  # a compat folder without libcuda does not count
    (compat / "libcuda.so.550.54.15").write_bytes(b"")
    assert find_compat_dirs(str(tmp_path)) == [str(compat)]


@pytest.mark.parametrize(("name", "brand", "expected"), [
    ("NVIDIA H200", "NVIDIA", True), ("NVIDIA A100-SXM4-80GB", None, True), ("Tesla T4", "TESLA", True),
    ("NVIDIA L40S", "NVIDIA", True), ("NVIDIA GeForce RTX 4090", "GEFORCE_RTX", False),
    ("NVIDIA RTX A6000", "NVIDIA_RTX", False), ("Quadro RTX 8000", "QUADRO_RTX", False),
    ("NVIDIA Mystery 1", "NVIDIA", None),
])
def test_datacenter_gpus(name: str, brand: Any, expected: Any) -> None:
    assert is_datacenter_gpu(name, brand) is expected


# ============================== NVML: absent here for real, answering only through a stand-in
def test_real_nvml_on_this_host() -> None:
    """The real nvidia-ml-py: on a host without the NVIDIA driver NVML raises
    NVMLError_LibraryNotFound and the host gate is SKIP (never PASS)."""
    from tests.kit import engines

    try:
        import pynvml  # noqa: F401
    except ImportError:
        engines.unavailable("nvidia-ml-py is not installed (pip install -e .[dev])")
    facts, res = probe_host()
    if os.path.exists("/dev/nvidiactl"):
        assert res["status"] == "PASS" and facts.gpus and facts.source == "nvml"
    else:
        assert res["status"] == "SKIP", res
        assert "NVMLError_LibraryNotFound" in res["detail"] or "DriverNotLoaded" in res["detail"]
        assert res["error"] is None and facts.gpus == []


class _NVMLError(Exception):
    pass


def _fake_nvml(init_error: type | None = None, gpus: int = 0) -> Any:
    """A stand-in for pynvml on hardware we do not have."""
    mod = types.SimpleNamespace()
    mod.NVMLError = _NVMLError
    mod.NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (_NVMLError,), {})
    mod.NVMLError_Unknown = type("NVMLError_Unknown", (_NVMLError,), {})
    state = {"shutdown": 0}

    def init() -> None:
        if init_error is not None:
            raise getattr(mod, init_error.__name__)("NVML Shared Library Not Found")

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)
    mod.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    mod.nvmlSystemGetCudaDriverVersion = lambda: 12040
    mod.nvmlDeviceGetCount = lambda: gpus
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30)
    mod.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0".encode())
    mod.nvmlDeviceGetBrand = lambda h: 14
    mod.state = state
    return mod


def test_nvml_library_not_found_is_skip() -> None:
    nvml = _fake_nvml(init_error=type("NVMLError_LibraryNotFound", (), {}))
    facts, res = probe_host(nvml, use_defaults=False)
    assert res["status"] == "SKIP" and "NVMLError_LibraryNotFound" in res["detail"]
    assert facts.driver_version is None and nvml.state["shutdown"] == 0  # init failed: nothing to shut


def test_nvml_other_error_is_fail() -> None:
    nvml = _fake_nvml(init_error=type("NVMLError_Unknown", (), {}))
    _, res = probe_host(nvml, use_defaults=False)
    assert res["status"] == "FAIL" and "NVMLError_Unknown" in res["error"]


def test_nvml_facts_of_two_gpus() -> None:
    nvml = _fake_nvml(gpus=2)
    facts, res = probe_host(nvml, use_defaults=False)
    assert nvml.state["shutdown"] == 1
    assert res["status"] == "PASS", res
    assert (facts.driver_version, facts.cuda_version, facts.source) == ("550.54.15", "12.4", "nvml")
    assert [g.to_dict() for g in facts.gpus][1] == {
        "index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000001", "memoryTotalBytes": 80 * 2**30,
        "pciBusId": "00000000:19:00.0", "brand": "NVIDIA", "datacenter": True}
    assert facts.datacenter(None) is True and facts.selected([1])[0].uuid == "GPU-00000001"


def test_no_nvml_and_no_nvidia_smi_is_skip() -> None:
    _, res = probe_host(None, smi=None, use_defaults=False)
    assert res["status"] == "SKIP" and "nvidia-ml-py" in res["detail"]


def test_nvidia_smi_output_parsing() -> None:
    driver, gpus = parse_smi_query("0, NVIDIA H200, GPU-abc, 143771, 00000000:18:00.0, 550.54.15\n"
                                   "1, NVIDIA H200, GPU-def, 143771, 00000000:2A:00.0, 550.54.15\n")
    assert driver == "550.54.15" and [g.uuid for g in gpus] == ["GPU-abc", "GPU-def"]
    assert gpus[0].memory_total == 143771 * 2**20 and gpus[0].datacenter is True
    assert parse_smi_cuda("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |") == "12.4"


# ============================== settings
def _settings(**kw: Any) -> SmokeSettings:
    base: dict[str, Any] = dict(device="cpu", no_container=False, gpus=None, env=[], env_files=[], restart=False,
                                timeout=60.0, rank_timeout=30.0, nproc=0, gates=None, fault=None, volumes=[],
                                python=None, docker_host=None)
    base.update(kw)
    return build_settings(**base)


def test_job_environment(tmp_path: Path) -> None:
    f = tmp_path / "job.env"
    f.write_text("# NCCL settings of the job\nNCCL_P2P_DISABLE=1\n\nNCCL_NVLS_ENABLE=0\nTORCH_X=a=b\nHOME\n")
    s = _settings(env_files=[str(f)], env=["NCCL_NVLS_ENABLE=1"], gpus="0,1")
    env, applied = s.job_environment()
    assert env == {"NCCL_RAS_ENABLE": "0", "NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "1", "TORCH_X": "a=b",
                   "HOME": os.environ["HOME"], "CUDA_VISIBLE_DEVICES": "0,1"}
    assert applied == {"NCCL_RAS_ENABLE": "0"}
    env, applied = _settings(env=["NCCL_RAS_ENABLE=1"]).job_environment()
    assert env == {"NCCL_RAS_ENABLE": "1"} and applied == {}
    # without a container the current environment counts as set
    assert _settings().job_environment({"NCCL_RAS_ENABLE": "1"}) == ({}, {})


@pytest.mark.parametrize("kw", [
    {"env": ["1BAD=x"]}, {"env": ["NOEQUALS"]}, {"gpus": "0,0"}, {"gpus": "a"}, {"gates": "matmul,bogus"},
    {"fault": "explode"}, {"volumes": ["/nonexistent-xyz:/x"]}, {"volumes": ["/tmp:relative"]},
    {"gpus": "0", "env": ["CUDA_VISIBLE_DEVICES=1"]}, {"timeout": 0.0},
])
def test_bad_settings_are_configuration_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(SmokeConfigError) as e:
        _settings(**kw)
    assert e.value.exit_code == 2 and e.value.reference == "smoke-config"


def test_env_file_errors_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.env"
    f.write_text("OK=1\nnot valid line\n")
    with pytest.raises(SmokeConfigError, match="line 2"):
        read_env_file(str(f))


def test_gate_selection_always_keeps_torch() -> None:
    assert _settings(gates="allreduce").gates == ["torch", "allreduce"]
    assert _settings().gates == list(SELECTABLE)
    assert _settings(fault="segv:1").to_dict()["injectedFault"] == "segv:1"


# ============================== engine command lines
def _spec(device: str = "cuda", gpus: Any = None) -> ctr.ContainerSpec:
    return ctr.ContainerSpec(image="sha256:abc", name="sneakernet-smoke-x", tree="/tmp/t", device=device, gpus=gpus,
                             env={"NCCL_RAS_ENABLE": "0"}, volumes=[("/data", "/data")])


def test_docker_command_lines() -> None:
    base = ctr.docker_base("unix:///run/d.sock")
    argv = ctr.docker_run(base, _spec(), "run", "--device", "cuda")
    assert argv[:4] == ["docker", "-H", "unix:///run/d.sock", "run"]
    for flags in (["--rm"], ["--pull", "never"], ["--network", "none"], ["--ipc=host"], ["--gpus", "all"],
                  ["-e", "NCCL_RAS_ENABLE=0"], ["-v", "/tmp/t:/sneakernet-smoke:ro"], ["-v", "/data:/data:ro"],
                  ["--entrypoint", "python3", "sha256:abc", "-c"]):
        assert any(argv[i:i + len(flags)] == flags for i in range(len(argv))), flags
    assert argv[-3:] == ["run", "--device", "cuda"]
    cpu = ctr.docker_run(base, _spec("cpu"), "run")
    assert "--gpus" not in cpu
    detached = ctr.docker_run(["docker"], _spec("cpu"), "idle", detach=True)
    assert "-d" in detached and "--rm" not in detached and detached[-1] == "idle"
    assert ctr.docker_exec(["docker"], _spec(), "run")[:4] == ["docker", "exec", "sneakernet-smoke-x", "python3"]
    assert ctr.docker_restart(["docker"], "n") == ["docker", "restart", "-t", "10", "n"]


def test_podman_and_containerd_command_lines() -> None:
    pod = ctr.podman_run(["podman"], _spec(gpus=[0, 1]), "run")
    assert pod[pod.index("--device"):pod.index("--device") + 2] == ["--device", "nvidia.com/gpu=0"]
    assert "nvidia.com/gpu=1" in pod and "--pull" in pod and "none" in pod and "--gpus" not in pod
    assert "nvidia.com/gpu=all" in ctr.podman_run(["podman"], _spec(), "run")
    c = ctr.ctr_run(["ctr", "-n", "default"], _spec(), "run", gpu_count=2)
    assert c[:4] == ["ctr", "-n", "default", "run"] and c.count("--gpus") == 2
    assert "type=bind,src=/tmp/t,dst=/sneakernet-smoke,options=rbind:ro" in c
    assert "--net-host" not in c and c[c.index("sha256:abc") + 1] == "sneakernet-smoke-x"
    assert "--gpus" not in ctr.ctr_run(["ctr"], _spec("cpu"), "run", gpu_count=2)


def test_gpu_access_per_engine_cdi_runtime_or_ctr_gpus(tmp_path: Path) -> None:
    """GPU paths cannot run here (no GPU): how each engine is handed the GPUs, from what the host has."""
    none: Any = lambda _name: None  # noqa: E731
    runtime: Any = lambda name: f"/usr/bin/{name}" if name == ctr.NVIDIA_RUNTIME else None  # noqa: E731
    cli: Any = lambda name: "/usr/bin/nvidia-container-cli" if name == "nvidia-container-cli" else None  # noqa: E731
    empty = [str(tmp_path / "none")]
    assert ctr.gpu_access("docker", which=none, cdi_dirs=empty) == "docker-gpus"
    assert ctr.gpu_access("podman", which=runtime, cdi_dirs=empty) is None
    assert ctr.gpu_access("containerd", which=runtime, cdi_dirs=empty) == "nvidia-runtime"
    assert ctr.gpu_access("containerd", which=cli, cdi_dirs=empty) == "ctr-gpus"
    assert ctr.gpu_access("containerd", which=none, cdi_dirs=empty) is None
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "other.yaml").write_text("cdiVersion: 0.5.0\nkind: vendor.com/device\n")
    assert ctr.gpu_access("podman", which=none, cdi_dirs=[str(cdi)]) is None
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n")
    assert ctr.nvidia_cdi_spec([str(cdi)]) == str(cdi / "nvidia.yaml")
    for kind in ("podman", "containerd"):
        assert ctr.gpu_access(kind, which=runtime, cdi_dirs=[str(cdi)]) == "cdi"


def test_containerd_gpu_command_lines() -> None:
    base = ["ctr", "--address", "/run/c.sock", "--namespace", "k8s.io"]
    c = ctr.ctr_run(base, _spec(gpus=[0, 1]), "run", gpu="cdi", snapshotter="overlayfs")
    assert c[c.index("--device"):c.index("--device") + 4] == ["--device", "nvidia.com/gpu=0", "--device",
                                                              "nvidia.com/gpu=1"]
    assert c[c.index("--snapshotter"):c.index("--snapshotter") + 2] == ["--snapshotter", "overlayfs"]
    assert "nvidia.com/gpu=all" in ctr.ctr_run(base, _spec(), "run", gpu="cdi")
    r = ctr.ctr_run(base, _spec(gpus=[1]), "run", gpu="nvidia-runtime",
                    runtime_binary="/usr/bin/nvidia-container-runtime")
    assert r[r.index("--runc-binary") + 1] == "/usr/bin/nvidia-container-runtime"
    assert "NVIDIA_VISIBLE_DEVICES=1" in r and "--gpus" not in r and "--device" not in r
    assert "NVIDIA_VISIBLE_DEVICES=all" in ctr.ctr_run(base, _spec(), "run", gpu="nvidia-runtime")
    assert ctr.ctr_run(base, _spec(), "run", gpu="ctr-gpus", gpu_count=2).count("--gpus") == 2
    for gpu in ("cdi", "nvidia-runtime", "ctr-gpus", None):
        cpu = ctr.ctr_run(base, _spec("cpu"), "run", gpu=gpu, gpu_count=2)
        assert not {"--gpus", "--device", "--runc-binary"} & set(cpu)
    assert "--net-host" in ctr.ctr_run(base, _spec("cpu"), "run", net_host=True)


def test_engines_built_from_the_import_options() -> None:
    none: Any = lambda _name: None  # noqa: E731
    c = ctr.build_engine("containerd", address="/run/c.sock", namespace="k8s.io", which=none, cdi_dirs=[])
    assert c.base == ["ctr", "--address", "/run/c.sock", "--namespace", "k8s.io"]
    assert c.describe() == {"kind": "containerd", "address": "/run/c.sock", "namespace": "k8s.io",
                            "snapshotter": "overlayfs", "gpuAccess": None}
    assert c.kill_argv("n") == [*c.base, "tasks", "kill", "--signal", "SIGKILL", "n"]
    assert [a[len(c.base):] for a in c.cleanup_argvs("n")] == [["tasks", "delete", "--force", "n"],
                                                               ["containers", "delete", "n"]]
    run_ = c.run_argv(_spec("cpu"), "run")
    assert run_[len(c.base):len(c.base) + 2] == ["run", "--rm"] and "--snapshotter" in run_
    p = ctr.build_engine("podman", podman_root="/s/root", podman_runroot="/s/run", storage_driver="vfs",
                         ulimits=["nofile=1024:1024"], which=none, cdi_dirs=[])
    assert p.base == ["podman", "--root", "/s/root", "--runroot", "/s/run", "--storage-driver", "vfs"]
    argv = p.run_argv(_spec("cpu"), "run")
    assert argv[argv.index("--ulimit"):argv.index("--ulimit") + 2] == ["--ulimit", "nofile=1024:1024"]
    assert p.cleanup_argvs("n") == [] and p.kill_argv("n") == [*p.base, "kill", "n"]
    d = ctr.build_engine("docker", docker_host="unix:///d.sock")
    assert d.describe()["address"] == "unix:///d.sock" and d.run_argv(_spec(), "run")[:4] == [
        "docker", "-H", "unix:///d.sock", "run"]
    with pytest.raises(SmokeConfigError, match="expected an engine that runs containers"):
        ctr.build_engine("oci")


def test_smoke_engine_choice_and_refusals() -> None:
    assert choose_engine(None, {}) == "docker"
    assert choose_engine(None, {"address": "/c.sock"}) == "containerd"
    assert choose_engine(None, {"podman_root": "/r"}) == "podman"
    assert choose_engine("podman", {"storage_driver": "vfs"}) == "podman"
    with pytest.raises(SmokeConfigError, match="expected only its own options, found --address"):
        choose_engine("podman", {"address": "/c.sock"})
    with pytest.raises(SmokeConfigError, match="containerd and podman given together"):
        choose_engine(None, {"address": "/c.sock", "podman_root": "/r"})
    common: Any = dict(device="cpu", no_container=False, gpus=None, env=[], env_files=[], timeout=10.0,
                       rank_timeout=5.0, nproc=0, gates=None, fault=None, volumes=[], python=None, docker_host=None)
    with pytest.raises(SmokeConfigError, match="containerd \\(ctr\\) runs the suite once"):
        build_settings(restart=True, engine="containerd", **common)
    with pytest.raises(SmokeConfigError, match="--ulimit is for docker and podman"):
        build_settings(restart=False, engine="containerd", ulimits=["nofile=1:1"], **common)
    with pytest.raises(SmokeConfigError, match="expected NAME=SOFT"):
        build_settings(restart=False, engine="podman", ulimits=["files=1"], **common)
    s = build_settings(restart=False, engine="containerd", engine_options={"address": "/c.sock", "namespace": "ns"},
                       **common)
    assert (s.engine, s.address, s.namespace, s.docker_host) == ("containerd", "/c.sock", "ns", None)
    assert s.to_dict()["engine"] == "containerd"


def test_gpu_without_a_way_into_the_container_is_a_configuration_error() -> None:
    eng = ctr.Engine("podman", ["podman"], "podman default storage", gpu=None)
    facts = HostFacts(gpus=[HostGPU(0, "NVIDIA H200", "GPU-1", 2**30, "00000000:18:00.0", "NVIDIA")])
    with pytest.raises(SmokeConfigError, match=r"expected a CDI spec for nvidia\.com/gpu") as e:
        runner._check_gpu_access(SmokeSettings(device="cuda"), eng, facts)
    assert "nvidia-ctk cdi generate" in (e.value.hint or "")
    runner._check_gpu_access(SmokeSettings(device="cpu"), eng, facts)  # CPU: no GPU needed
    runner._check_gpu_access(SmokeSettings(device="cuda"), eng, HostFacts())  # no GPU: gates SKIP, no refusal


# ============================== gates -> verdict
def _gates(**status: str) -> list[dict[str, Any]]:
    names = ["host", "compat", "torch", "matmul", "compile", "optimizer", "allreduce", "shutdown"]
    out = {n: dict(result(n, status.get(n, "PASS"), 0.0, None, "x" if status.get(n) == "FAIL" else None),
                   name=n) for n in names}
    return order(out, required_gates("cpu", False))


def test_verdict() -> None:
    assert verdict(_gates(host="SKIP", compat="SKIP")) == "pass"  # not required on the CPU
    assert verdict(_gates(matmul="WARN")) == "pass"
    assert verdict(_gates(compile="SKIP")) == "candidate"
    assert verdict(_gates(compile="SKIP", shutdown="FAIL")) == "fail"
    assert verdict(_gates(host="FAIL")) == "fail"
    assert "host" in required_gates("cuda", False) and "restart" in required_gates("cpu", True)


def test_a_killed_suite_still_reports_every_gate() -> None:
    events = [{"event": "env"}, {"event": "compat-decided", "status": "SKIP", "reason": "CPU run"},
              dict(result("torch", "PASS", 1.0)), {"event": "start", "gate": "matmul"}]
    out = RunOutcome(events=events, returncode=-9, failure="the suite was killed after 60 s (--timeout 30)")
    gates = suite_gates(out)
    assert gates["torch"]["status"] == "PASS" and gates["compat"]["status"] == "SKIP"
    assert gates["matmul"]["status"] == "FAIL" and "while this gate ran" in gates["matmul"]["error"]
    assert gates["compile"]["status"] == "SKIP" and gates["compile"]["detail"].startswith("not run: the suite")
    nothing = suite_gates(RunOutcome(returncode=127, failure="could not start `python3` in the image"))
    assert nothing["torch"]["status"] == "FAIL" and "python3" in nothing["torch"]["error"]
    assert all(nothing[g]["status"] == "SKIP" for g in ("matmul", "allreduce", "shutdown"))


def test_restart_gate() -> None:
    ok = RunOutcome(events=[dict(result(g, "PASS", 0.0)) for g in ("compat", "torch", "matmul", "compile",
                                                                   "optimizer", "allreduce", "shutdown")]
                    + [{"event": "done"}])
    assert restart_gate("container", ok, 1.5, None)["status"] == "PASS"
    bad = restart_gate("container", None, 1.0, "docker restart exited with status 1: boom")
    assert bad["status"] == "FAIL" and "boom" in bad["error"]


# ============================== the receipt
def _receipt(verdict_: str, gates: list[dict[str, Any]]) -> dict[str, Any]:
    facts = HostFacts(source="nvml", driver_version="550.54.15", cuda_version="12.4",
                      gpus=[HostGPU(0, "NVIDIA H200", "GPU-1", 2**30, "00000000:18:00.0", "NVIDIA")])
    q = Qualification(settings=SmokeSettings(device="cpu"), host=facts, gates=gates, verdict=verdict_,
                      image={"ref": "x:1", "id": "sha256:" + "0" * 64, "repoTags": ["x:1"], "repoDigests": [],
                             "platform": "linux/amd64", "cudaVersion": None, "requireCuda": None},
                      bundle={"path": "/b", "digest": "sha256:" + "1" * 64},
                      engine={"kind": "docker", "address": "unix:///x"},
                      environment={"job": {"NCCL_RAS_ENABLE": "0"}, "defaults": {"NCCL_RAS_ENABLE": "0"},
                                   "inForce": {"NCCL_RAS_ENABLE": "0"}},
                      suite=dict(RunOutcome(returncode=0).to_dict(), python="3.11.7", executable="/usr/bin/python3"))
    return build_qualification_receipt(q)


def test_receipt_matches_its_schema_and_the_schema_bites() -> None:
    good = _receipt("pass", _gates(host="SKIP", compat="SKIP"))
    assert not schema_errors(good)
    assert not schema_errors(_receipt("fail", _gates(allreduce="FAIL")))
    assert not schema_errors(_receipt("candidate", _gates(compile="SKIP")))

    for breaks in (lambda r: r.update(verdict="pass", exitCode=1),
                   lambda r: r.update(verdict="fail"),  # no gate failed
                   lambda r: r["gates"][2].update(status="FAIL"),  # FAIL needs an error, and verdict pass
                   lambda r: r["gates"][0].update(status="OK"),
                   lambda r: r["environment"].pop("inForce"),
                   lambda r: r.update(gates=r["gates"][:3])):
        r = json.loads(json.dumps(good))
        breaks(r)
        assert schema_errors(r), breaks


def test_the_receipt_says_where_the_gates_ran_and_on_which_gpus() -> None:
    """Issue 39: a qualification says what it qualified: where (the image or this Python) and the
    GPUs the gates ran on, as torch in the suite saw them (none on the CPU)."""
    cpu = _receipt("pass", _gates())
    assert cpu["receiptVersion"] == "1.1" and cpu["device"] == "cpu" and cpu["where"] == "image"
    assert cpu["gpus"] == {"count": 0, "models": []}  # the host has a GPU; a CPU run used none
    gates = _gates()
    gates[2]["metrics"] = {"cudaAvailable": True, "deviceCount": 3, "devices": [
        {"index": n, "name": name, "capability": "9.0"} for n, name in enumerate(["NVIDIA H200", "NVIDIA H200", "X"])]}
    facts = HostFacts(source="nvml", gpus=[HostGPU(0, "NVIDIA H200", "GPU-1", 1, "0", "NVIDIA")])
    for no_container, where in ((False, "image"), (True, "host-python")):
        q = Qualification(settings=SmokeSettings(device="cuda", no_container=no_container), host=facts, gates=gates,
                          verdict="pass")
        r = build_qualification_receipt(q)
        assert r["where"] == where and r["gpus"] == {"count": 3, "models": ["NVIDIA H200", "X"]}
    for breaks in (lambda r: r.pop("where"), lambda r: r.pop("gpus"), lambda r: r.update(where="docker"),
                   lambda r: r["gpus"].update(count=1),  # the CPU used no GPU
                   lambda r: r.update(where="host-python")):  # this Python ran no image
        r = json.loads(json.dumps(cpu))
        breaks(r)
        assert schema_errors(r), breaks
    old = json.loads(json.dumps(cpu))
    for key in ("where", "gpus"):
        old.pop(key)
    assert not schema_errors(dict(old, receiptVersion="1.0"))  # receipts of 1.0 stay valid


def test_candidate_has_its_own_exit_code_not_the_configuration_errors() -> None:
    from importer.cli.smoke import EXIT_CONFIG

    cand = _receipt("candidate", _gates(compile="SKIP"))
    assert cand["exitCode"] == 10 != EXIT_CONFIG and not schema_errors(cand)
    assert schema_errors(dict(cand, exitCode=1))


# ============================== the suite's files, also out of the zipapp
def test_worker_module_list_is_complete(tmp_path: Path) -> None:
    on_disk = sorted(p.stem for p in (REPO / "importer/smoke/worker").glob("*.py"))
    assert sorted(MODULES) == on_disk
    root = write_tree(str(tmp_path / "t"))
    assert sorted(p.name for p in (Path(root) / "importer/smoke/worker").glob("*.py")) == [f"{m}.py" for m in
                                                                                           sorted(MODULES)]
    assert oct(os.stat(root).st_mode & 0o777) == oct(0o755)


def test_suite_files_come_out_of_the_pyz(tmp_path: Path) -> None:
    from bundle.embed import build_pyz

    pyz = tmp_path / "bundle-import.pyz"
    pyz.write_bytes(build_pyz())
    code = ("import sys; from importer.smoke.tree import write_tree; write_tree(sys.argv[1]); "
            "from importer.smoke.worker.suite import tree_root; print(tree_root())")
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(pyz)!r}); {code}",
                           str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for m in MODULES:
        src = (REPO / "importer/smoke/worker" / f"{m}.py").read_bytes()
        assert (tmp_path / "out/importer/smoke/worker" / f"{m}.py").read_bytes() == src
    help_ = run_zipapp(pyz, "smoke", "--help", drop_env=())
    assert help_.returncode == 0 and "--no-container" in help_.stdout


# ============================== time limits and the command line
def test_run_bounded_kills_what_outlives_its_timeout() -> None:
    t0 = time.monotonic()
    out = run_bounded(["sh", "-c", "echo '@@sneakernet-smoke {\"event\": \"env\"}'; sleep 60 & sleep 60"],
                      timeout=1.0, new_session=True)
    assert out.timed_out and out.returncode == -9 and time.monotonic() - t0 < 20
    assert out.events == [{"event": "env"}]  # what it wrote before is kept


def test_cli_configuration_errors_exit_2(tmp_path: Path) -> None:
    proc = run_cli("importer", "smoke", "--device", "cpu")
    assert proc.returncode == 2 and "error[smoke-config]" in proc.stderr and "expected an IMAGE" in proc.stderr
    proc = run_cli("importer", "smoke", "--no-container", "--gates", "nope", "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["id"] == "smoke-config"
    proc = run_cli("importer", str(tmp_path), "--verify-only", "--smoke")
    assert proc.returncode == 2 and "--smoke runs after an import" in proc.stderr


# ============================== the suite's compat step (no process is started)
def _suite(tmp_path: Path, env: dict[str, str], host_cuda: str = "12.2", datacenter: Any = True) -> Any:
    from importer.smoke.worker.suite import Suite

    s = Suite(device="cuda", host_cuda=host_cuda, datacenter=datacenter, host_gpus=1, nproc=0, gates=["torch"],
              fault=None, fault_rank=0, budget=60, rank_timeout=30, sizes=None)
    s.env = dict(env)
    s.compat_root = str(tmp_path)
    return s


def test_suite_puts_compat_libraries_first_when_the_driver_is_older(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    compat = tmp_path / "usr/local/cuda-12.8/compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.1").write_bytes(b"")
    s = _suite(tmp_path, {"CUDA_VERSION": "12.8.1", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"})
    decision, facts = s.decide()
    assert decision.mode == MODE_FORWARD and s.env["LD_LIBRARY_PATH"] == f"{compat}:/usr/local/nvidia/lib64"
    s.results["torch"] = dict(result("torch", "FAIL", 0.0, {"torch": "2.6.0", "cuda": "12.8"},
                                     "CUDA is not usable: RuntimeError: Error 804: forward compatibility was "
                                     "attempted on non supported HW"), name="torch")
    s.finish_compat(decision, facts, 0.1)
    res = s.results["compat"]
    assert res["status"] == "FAIL" and "Error 804" in res["error"] and res["metrics"]["mode"] == MODE_FORWARD
    assert res["metrics"]["imageCudaSource"] == "CUDA_VERSION" and "@@sneakernet-smoke" in capsys.readouterr().out


def test_suite_judges_an_undeclared_image_by_its_torch(tmp_path: Path) -> None:
    s = _suite(tmp_path, {}, host_cuda="11.8")
    decision, facts = s.decide()
    assert decision.status == "WARN" and "LD_LIBRARY_PATH" not in s.env
    s.results["torch"] = dict(result("torch", "FAIL", 0.0, {"torch": "2.6.0", "cuda": "12.4"}, "CUDA error 35"),
                              name="torch")
    s.finish_compat(decision, facts, 0.1)
    res = s.results["compat"]
    assert res["status"] == "FAIL" and "torch was built for CUDA 12.4" in res["error"]
    s.results["torch"] = dict(result("torch", "PASS", 0.0, {"torch": "2.6.0", "cuda": "12.4"}), name="torch")
    s.finish_compat(decision, facts, 0.1)  # the table says no, CUDA says yes: a warning, not a verdict
    res = s.results["compat"]
    assert res["status"] == "WARN" and res["error"] is None and "yet CUDA initialised" in res["detail"]


# ============================== digits outside ASCII 0-9 are no version (issue 38, class 6)
@pytest.mark.parametrize("bad", list(HOSTILE_VERSIONS.values()), ids=list(HOSTILE_VERSIONS))
def test_the_suite_reads_versions_in_ascii_digits_only(bad: str) -> None:
    """CUDA_VERSION, NVIDIA_REQUIRE_CUDA and nvidia-smi's CUDA Version in another script's digits
    read as 'abc' does: no version, nothing crashes."""
    assert parse_version(bad) is None and parse_version("abc") is None
    for env in ({"CUDA_VERSION": bad}, {"NVIDIA_REQUIRE_CUDA": f"cuda>={bad} brand=tesla,driver>=470"},
                {"CUDA_VERSION": bad, "NVIDIA_REQUIRE_CUDA": f"cuda >= {bad}"}):
        assert image_cuda_from_env(env) == image_cuda_from_env({k: "abc" for k in env}) == (None, None)
    assert image_cuda_from_env({"CUDA_VERSION": bad, "NVIDIA_REQUIRE_CUDA": f"cuda>={bad} cuda>=12.4"}) == (
        (12, 4), "NVIDIA_REQUIRE_CUDA")  # the first term that is a version
    assert parse_smi_cuda(f"| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: {bad}     |") is None
    driver, gpus = parse_smi_query(f"{bad}, NVIDIA H200, GPU-a, 143771, 00000000:18:00.0, 550.54.15\n"
                                   f"\u00b2, NVIDIA H200, GPU-b, 143771, 00000000:2A:00.0, 550.54.15\n"
                                   f"1, NVIDIA H200, GPU-c, {bad}, 00000000:3A:00.0, {bad}\n")
    assert [(g.index, g.uuid, g.memory_total) for g in gpus] == [(1, "GPU-c", 0)] and driver == bad


@pytest.mark.parametrize("kw", [{"gpus": "\u0660,\u0661"}, {"gpus": "\u00b2"}, {"gpus": "\uff10"},
                                {"fault": "segv:\u00b2"}, {"fault": "hang:\u0661"}])
def test_smoke_options_in_other_digits_are_configuration_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(SmokeConfigError) as e:
        _settings(**kw)
    assert e.value.exit_code == 2 and e.value.reference == "smoke-config"
