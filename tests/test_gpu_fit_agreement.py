"""scripts/gpu-fit-agreement.py (issue 39, point 4) without a GPU: its decisions, the commands it
runs and the table it writes, against a fake runner standing in for the engine. The run itself
needs a GPU host (docs/gpu-fit.md, "Agreement run on a GPU host"); nothing here starts a container."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from importer.format import cudafit
from tests.kit.helpers import REPO

H100 = cudafit.GPU("NVIDIA H100 80GB HBM3", "NVIDIA", "9.0", True)
HOST = cudafit.Target(driver="535.104.05", cuda="12.2", gpus=(H100, H100), toolkit_mode="legacy")
REFUSED = ("docker: Error response from daemon: failed to create task for container: OCI runtime create failed: "
           "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update your driver")

# image -> (Config.Env, compat libraries the scan lists, start outcome (rc, stderr), probe (rc, stdout, stderr))
IMAGES: dict[str, Any] = {
    "fits:1": (["CUDA_VERSION=12.1.0", "NVIDIA_REQUIRE_CUDA=cuda>=12.1"], [], (0, ""), (0, "cuda-ok 2 12.1", "")),
    "needs-newer:1": (["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"], [], (125, REFUSED), None),
    "wrong:1": (["CUDA_VERSION=13.0.0"], [], (0, ""), (1, "", "RuntimeError: CUDA driver initialization failed (35)")),
    "cpu-only:1": (["PATH=/usr/bin"], [], (0, ""), (1, "", "ModuleNotFoundError: No module named 'torch'")),
}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_fit_agreement", REPO / "scripts" / "gpu-fit-agreement.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _fake(script: ModuleType, calls: list[list[str]]) -> Any:
    def runner(argv: list[str], timeout: float, name: Optional[str]) -> Any:
        calls.append(argv)
        assert timeout == 30 and argv[0] == "docker"
        if argv[1:3] == ["image", "inspect"]:
            image = argv[-1]
            if image not in IMAGES:
                return script.Ran(1, "", f"Error: No such image: {image}")
            return script.Ran(0, json.dumps(IMAGES[image][0]) + "\n", "")
        assert argv[1] == "run" and "--network" in argv and argv[argv.index("--network") + 1] == "none"
        assert name is not None and argv[argv.index("--name") + 1] == name  # removed by name at a timeout
        entry = argv[argv.index("--entrypoint") + 1]
        image = argv[argv.index("--entrypoint") + 2]
        _, libs, start, probe = IMAGES[image]
        if entry == "sh" and argv[-1] == script.SCAN:
            assert "--gpus" not in argv  # the scan needs no GPU
            return script.Ran(0, "".join(f"/usr/local/cuda-12.4/compat/libcuda.so.{v}\n" for v in libs), "")
        assert argv[argv.index("--gpus") + 1] == "all"
        if entry == "true":
            return script.Ran(start[0], "", start[1])
        assert entry == "python3" and argv[-1] == script.PROBE
        return script.Ran(*probe)

    return runner


def test_the_table_puts_each_decision_beside_its_outcome(tmp_path: Path) -> None:
    script = _script()
    calls: list[list[str]] = []
    out, js = tmp_path / "agreement.md", tmp_path / "agreement.json"
    code = script.main([*IMAGES, "missing:1", "--timeout", "30", "--cuda-probe", "--out", str(out), "--json", str(js)],
                       runner=_fake(script, calls), target=HOST)
    assert code == 1  # wrong:1 started, though the decision says the toolkit refuses it
    table = out.read_text()
    assert table.splitlines()[0] == ("host: driver 535.104.05 (CUDA 12.2), 2 GPU(s): NVIDIA H100 80GB HBM3; "
                                     "toolkit mode legacy; GPUs by --gpus all")
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert lines["fits:1"] == "| fits:1 | 12.1 | fits | yes | started | yes | ok | yes |"
    assert lines["needs-newer:1"] == "| needs-newer:1 | 12.4 | unfit | no | refused | - | - | yes |"
    assert lines["wrong:1"] == "| wrong:1 | 13.0 | unfit | no | started | - | fail | **NO** |"
    assert lines["cpu-only:1"] == "| cpu-only:1 | - | no-cuda | yes | started | - | no-torch | yes |"
    assert lines["missing:1"] == "| missing:1 | - | not-judged | - | - | - | - | n/a |"
    assert "- needs-newer:1: unfit: " in table and "(start: docker: Error response" in table  # reasons whole
    assert "- missing:1: not-judged: missing:1: not in the engine (Error: No such image: missing:1)" in table
    assert table.endswith("agreement: 3 agree, 1 disagree, 1 not comparable, of 5 image(s)\n")
    rows = {r["image"]: r for r in json.loads(js.read_text())["rows"]}
    assert rows["wrong:1"]["agree"] is False and rows["fits:1"]["needs"]["cudaVersion"] == "12.1.0"
    # no probe where the container did not start; nothing ran with a GPU before the decision
    assert not any("python3" in c and "needs-newer:1" in c for c in calls)


def test_cdi_and_podman_judge_as_the_cdi_mode() -> None:
    """CDI injection checks no NVIDIA_REQUIRE_*: the image the legacy hook refuses starts, and the
    decision (judged as the cdi mode) says so."""
    script = _script()
    assert script.gpu_args("docker", "auto") == ["--gpus", "all"]
    assert script.gpu_args("podman", "auto") == ["--device", "nvidia.com/gpu=all"]
    assert script.gpu_args("docker", "cdi") == ["--device", "nvidia.com/gpu=all"]
    needs = cudafit.needs_from_env(IMAGES["needs-newer:1"][0])
    started = []

    def runner(argv: list[str], timeout: float, name: Optional[str]) -> Any:
        started.append(argv)
        return script.Ran(0, "", "")

    cdi = cudafit.Target(driver=HOST.driver, cuda=HOST.cuda, gpus=HOST.gpus, toolkit_mode="cdi")
    row = script.judge("needs-newer:1", needs, cdi, engine="podman", flag="auto", runner=runner, timeout=5,
                       cuda_probe=False)
    assert row.expect_start is True and row.started == "started" and row.agree is True
    assert row.decision == "fits-minor-compat" and row.cuda_init == "not-run"
    assert "nvidia.com/gpu=all" in started[0]


def test_no_gpu_here_is_exit_2(capsys: Any) -> None:
    script = _script()
    assert script.main(["fits:1"], runner=lambda *a: None, target=cudafit.Target(known=False)) == 2
    assert "needs a GPU host" in capsys.readouterr().err
