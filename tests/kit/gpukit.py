"""GPU hosts as data (docs/gpu-fit.md): a fake ``nvidia-smi`` (and ``nvidia-ctk``) printing the
recorded-format outputs of tests/golden/nvidia-smi/, so ``bundle-import --inventory`` and the
import-side fit check run their nvidia-smi path on a machine with no GPU. Only the absent
hardware is faked: NVML is pointed at a library that does not exist (``SNEAKERNET_NVML_LIBRARY``),
everything else is the real code path."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from tests.kit.helpers import run_cli

SMI_DIR = Path(__file__).resolve().parents[1] / "golden" / "nvidia-smi"
HOSTS = sorted(p.name[:-len(".q.txt")] for p in SMI_DIR.glob("*.q.txt"))

#: versions written with digits that int(), str.isdigit() or \d take but no driver or toolkit
#: writes: Arabic-Indic, extended Arabic-Indic, fullwidth, Devanagari, superscripts, and ASCII
#: versions with one such digit mixed in
HOSTILE_VERSIONS = {
    "arabic-indic": "\u0665\u0665\u0660.\u0665\u0664.\u0661\u0665",  # 550.54.15
    "extended-arabic-indic": "\u06f1\u06f2.\u06f4",  # 12.4
    "fullwidth": "\uff15\uff15\uff10.\uff15\uff14.\uff11\uff15",  # 550.54.15
    "devanagari": "\u0967\u0968.\u096a",  # 12.4
    "superscript": "\u00b9\u00b2.\u2074",  # 12.4
    "mixed-arabic-indic": "12.\u0664",
    "mixed-fullwidth": "550.54.1\uff15",
    "mixed-superscript": "12.4\u00b2",
    "mixed-leading": "\u0661" + "2.4",
    "fraction": "12.4\u00bd",
}

_SMI = """#!{python}
import sys
args = sys.argv[1:]
if args == ["-q"]:
    sys.stdout.buffer.write(open({q!r}, "rb").read())
elif args and args[0].startswith("--query-gpu=index,compute_cap"):
    sys.stdout.buffer.write(open({caps!r}, "rb").read())
else:
    sys.stderr.write("unexpected arguments: %r\\n" % (args,))
    sys.exit(2)
"""


def gpu_env(tmp: Path, host: str, *, mode: str | None = "legacy", driver: str | None = None,
            cuda: str | None = None, ctk_version: str = "1.16.2", caps: str | None = None) -> dict[str, str]:
    """Variables that make ``host`` (a file stem of tests/golden/nvidia-smi) this machine's GPU
    side: a fake nvidia-smi and nvidia-ctk first on PATH, the toolkit's config.toml with ``mode``.
    ``driver``/``cuda``: what nvidia-smi -q prints as the Driver and CUDA Version instead of the
    recording's; ``ctk_version``: nvidia-ctk's; ``caps``: the compute_cap query's whole answer."""
    bin_dir = tmp / f"gpu-{host}" / "bin"
    bin_dir.mkdir(parents=True)
    q = SMI_DIR / f"{host}.q.txt"
    if driver is not None or cuda is not None:
        text = q.read_text()
        for key, value in (("Driver Version", driver), ("CUDA Version", cuda)):
            if value is not None:
                text = re.sub(rf"(?m)^({key} +: ).*$", lambda m, v=value: m.group(1) + v, text)  # type: ignore[misc]
        q = bin_dir.parent / "q.txt"
        q.write_text(text, encoding="utf-8")
    cap_file = SMI_DIR / f"{host}.compute_cap.csv"
    if caps is not None:
        cap_file = bin_dir.parent / "compute_cap.csv"
        cap_file.write_text(caps, encoding="utf-8")
    smi = bin_dir / "nvidia-smi"
    smi.write_text(_SMI.format(python=sys.executable, q=str(q), caps=str(cap_file)))
    ctk = bin_dir / "nvidia-ctk"
    said = f"NVIDIA Container Toolkit CLI version {ctk_version}\ncommit: a5a5833c14a15fd9c86bcece85d5ec6621b65652\n"
    ctk.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write({said.encode()!r})\n")
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
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { strncpy(v, DRIVER, n); return inited ? 0 : 1; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *c) { *c = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { *d = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetName(nvmlDevice_t d, char *v, unsigned int n) { strncpy(v, "NVIDIA H100 80GB HBM3", n); return 0; }
int nvmlDeviceGetBrand(nvmlDevice_t d, int *b) { *b = 14; return 0; }
int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *ma, int *mi) { *ma = 9; *mi = 0; return 0; }
"""


def fake_nvml(tmp: Path, driver: str = "550.54.15") -> Path:
    """Compile the NVML stand-in (its driver version ``driver``, as UTF-8); its path, for
    ``SNEAKERNET_NVML_LIBRARY``."""
    import shutil
    import subprocess

    from tests.kit import engines

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        engines.unavailable("a C compiler (cc) to build the NVML stand-in")
    src = tmp / "fake_nvml.c"
    quoted = "".join(f"\\x{b:02x}" for b in driver.encode())
    src.write_text(f'#define DRIVER "{quoted}"\n' + FAKE_NVML_C)
    lib = tmp / "libfake-nvml.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True, timeout=120)
    return lib
