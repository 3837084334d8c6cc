"""GPU hosts as data (docs/gpu-fit.md): a fake ``nvidia-smi`` (and ``nvidia-ctk``) printing the
recorded-format outputs of tests/golden/nvidia-smi/, so ``bundle-import --inventory`` and the
import-side fit check run their nvidia-smi path on a machine with no GPU. Only the absent
hardware is faked: NVML is pointed at a library that does not exist (``SNEAKERNET_NVML_LIBRARY``),
everything else is the real code path."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.kit.helpers import run_cli

SMI_DIR = Path(__file__).resolve().parents[1] / "golden" / "nvidia-smi"
HOSTS = sorted(p.name[:-len(".q.txt")] for p in SMI_DIR.glob("*.q.txt"))

_SMI = """#!{python}
import sys
args = sys.argv[1:]
if args == ["-q"]:
    sys.stdout.write(open({q!r}).read())
elif args and args[0].startswith("--query-gpu=index,compute_cap"):
    sys.stdout.write(open({caps!r}).read())
else:
    sys.stderr.write("unexpected arguments: %r\\n" % (args,))
    sys.exit(2)
"""


def gpu_env(tmp: Path, host: str, *, mode: str | None = "legacy") -> dict[str, str]:
    """Variables that make ``host`` (a file stem of tests/golden/nvidia-smi) this machine's GPU
    side: a fake nvidia-smi and nvidia-ctk first on PATH, the toolkit's config.toml with ``mode``."""
    bin_dir = tmp / f"gpu-{host}" / "bin"
    bin_dir.mkdir(parents=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(_SMI.format(python=sys.executable, q=str(SMI_DIR / f"{host}.q.txt"),
                               caps=str(SMI_DIR / f"{host}.compute_cap.csv")))
    ctk = bin_dir / "nvidia-ctk"
    ctk.write_text(f"#!{sys.executable}\nprint('NVIDIA Container Toolkit CLI version 1.16.2')\n"
                   "print('commit: a5a5833c14a15fd9c86bcece85d5ec6621b65652')\n")
    for f in (smi, ctk):
        os.chmod(f, 0o755)
    config = tmp / f"gpu-{host}" / "config"
    if mode is not None:
        (config / "nvidia-container-runtime").mkdir(parents=True)
        (config / "nvidia-container-runtime" / "config.toml").write_text(
            f'[nvidia-container-runtime]\nlog-level = "info"\nmode = "{mode}"\nruntimes = ["runc"]\n')
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "SNEAKERNET_NVML_LIBRARY": str(tmp / "no-libnvml.so"),
            "XDG_CONFIG_HOME": str(config)}


def no_gpu_env(tmp: Path) -> dict[str, str]:
    """This machine as it is when it has no NVIDIA driver (whatever the test machine has)."""
    empty = tmp / "no-gpu-bin"
    empty.mkdir(exist_ok=True)
    path = ":".join(p for p in os.environ.get("PATH", "").split(":") if not (Path(p) / "nvidia-smi").exists())
    return {"PATH": path, "SNEAKERNET_NVML_LIBRARY": str(tmp / "no-libnvml.so"), "XDG_CONFIG_HOME": str(empty)}


def take_inventory(tmp: Path, docker_host: str, host: str, **kw: str | None) -> Path:
    """``bundle-import --inventory`` of the engine at ``docker_host``, on GPU host ``host``."""
    proc = run_cli("importer", "--inventory", "--docker-host", docker_host, env=gpu_env(tmp, host, **kw))
    assert proc.returncode == 0, proc.stderr
    path = tmp / f"inventory-{host}.json"
    path.write_text(proc.stdout)
    json.loads(proc.stdout)
    return path


# A stand-in for libnvidia-ml.so.1 (absent hardware): the NVML calls importer/inventory/gpuhost.py
# makes, answering as two H100s on driver 550.54.15 do. Built with the C compiler at test time.
FAKE_NVML_C = r"""
#include <string.h>
typedef void *nvmlDevice_t;
static int inited = 0;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { strncpy(v, "550.54.15", n); return inited ? 0 : 1; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *c) { *c = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { *d = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetName(nvmlDevice_t d, char *v, unsigned int n) { strncpy(v, "NVIDIA H100 80GB HBM3", n); return 0; }
int nvmlDeviceGetBrand(nvmlDevice_t d, int *b) { *b = 14; return 0; }
int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *ma, int *mi) { *ma = 9; *mi = 0; return 0; }
"""


def fake_nvml(tmp: Path) -> Path:
    """Compile the NVML stand-in; its path, for ``SNEAKERNET_NVML_LIBRARY``."""
    import shutil
    import subprocess

    from tests.kit import engines

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        engines.unavailable("a C compiler (cc) to build the NVML stand-in")
    src = tmp / "fake_nvml.c"
    src.write_text(FAKE_NVML_C)
    lib = tmp / "libfake-nvml.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True, timeout=120)
    return lib
