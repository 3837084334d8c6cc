"""This host's GPU side for the inventory (``gpu``, inventory 1.3) and the import-side fit check
(docs/gpu-fit.md): driver version, the newest CUDA it supports, each GPU's name, brand, compute
capability and whether it is a data-center part, and the container toolkit's version and mode.

NVML through ctypes (``libnvidia-ml.so.1``; ``SNEAKERNET_NVML_LIBRARY`` names another) when it
loads, else ``nvidia-smi -q`` (with ``--query-gpu=index,compute_cap`` for the compute
capability), else "no NVIDIA driver". The toolkit: ``nvidia-ctk --version``,
``nvidia-container-cli --version`` and the ``mode`` of its config.toml
(``$XDG_CONFIG_HOME/nvidia-container-runtime/config.toml``, else ``/etc/...``)."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from typing import Any, Dict, List, Optional

from importer.errors import BundleError
from importer.format import cudafit
from importer.streams.commands import run

NVML_ENV = "SNEAKERNET_NVML_LIBRARY"
#: NVML's nvmlBrandType_t, as nvidia-smi -q prints "Product Brand" (upper case, spaces as _)
BRANDS = {0: "UNKNOWN", 1: "QUADRO", 2: "TESLA", 3: "NVS", 4: "GRID", 5: "GEFORCE", 6: "TITAN",
          7: "NVIDIA_VAPPS", 8: "NVIDIA_VPC", 9: "NVIDIA_VCS", 10: "NVIDIA_VWS", 11: "NVIDIA_CLOUD_GAMING",
          12: "QUADRO_RTX", 13: "NVIDIA_RTX", 14: "NVIDIA", 15: "GEFORCE_RTX", 16: "TITAN_RTX"}
_FIELD = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9 ()/.-]*?)\s*:\s*(.*?)\s*$")
# ASCII digits only (int() and \d also take Arabic-Indic and fullwidth digits, isdigit()
# superscripts): anything else is no version
_VERSION = re.compile(r"([0-9]+\.[0-9]+(?:\.[0-9]+)?)")
_GPU_INDEX = re.compile(r"[0-9]{1,3}")
_COMPUTE_CAP = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
_MODE = re.compile(r'^\s*mode\s*=\s*"([A-Za-z-]+)"', re.M)


def gpu_entry(index: int, name: str, brand: Optional[str], cc: Optional[str]) -> Dict[str, Any]:
    return {"index": index, "name": name, "brand": brand, "computeCapability": cc,
            "datacenter": cudafit.is_datacenter(name, brand)}


def from_nvml(lib: Any) -> Dict[str, Any]:
    """Facts through NVML's C API; raises OSError when a call fails."""
    def call(fn: str, *args: Any) -> None:
        rc = getattr(lib, fn)(*args)
        if rc != 0:
            raise OSError(f"NVML {fn} returned {rc}")

    call("nvmlInit_v2")
    try:
        buf = ctypes.create_string_buffer(96)
        call("nvmlSystemGetDriverVersion", buf, 96)
        driver = buf.value.decode("utf-8", "replace")  # recorded as it is; cudafit reads ASCII digits only
        cuda = ctypes.c_int()
        call("nvmlSystemGetCudaDriverVersion", ctypes.byref(cuda))
        count = ctypes.c_uint()
        call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        gpus = []
        for i in range(min(count.value, 64)):
            handle = ctypes.c_void_p()
            call("nvmlDeviceGetHandleByIndex_v2", i, ctypes.byref(handle))
            call("nvmlDeviceGetName", handle, buf, 96)
            name = buf.value.decode("utf-8", "replace")
            brand = ctypes.c_int()
            major, minor = ctypes.c_int(), ctypes.c_int()
            b = BRANDS.get(brand.value) if lib.nvmlDeviceGetBrand(handle, ctypes.byref(brand)) == 0 else None
            ok = lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) == 0
            gpus.append(gpu_entry(i, name, b, f"{major.value}.{minor.value}" if ok else None))
    finally:
        lib.nvmlShutdown()
    v = cuda.value
    return {"source": "nvml", "driverVersion": driver,
            "cudaDriverVersion": f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else None, "gpus": gpus}


def parse_smi_q(text: str) -> Dict[str, Any]:
    """``nvidia-smi -q`` -> driver, CUDA, and per GPU its name and brand."""
    driver = cuda = None
    gpus: List[Dict[str, Any]] = []
    current: Optional[Dict[str, Any]] = None
    for line in text.splitlines()[:100000]:
        if line.startswith("GPU ") and ":" in line[4:]:
            current = {"name": "", "brand": None}
            gpus.append(current)
            continue
        m = _FIELD.match(line)
        if not m:
            continue
        indent, key, value = len(m.group(1)), m.group(2), m.group(3)
        if indent == 0 and key == "Driver Version":
            driver = value
        elif indent == 0 and key == "CUDA Version":
            cuda = value
        elif current is not None and indent == 4 and key == "Product Name":
            current["name"] = value
        elif current is not None and indent == 4 and key == "Product Brand":
            current["brand"] = value.upper().replace(" ", "_")
    return {"source": "nvidia-smi", "driverVersion": driver, "cudaDriverVersion": cuda,
            "gpus": [gpu_entry(i, g["name"], g["brand"], None) for i, g in enumerate(gpus[:64])]}


def parse_compute_caps(text: str) -> Dict[int, str]:
    """``nvidia-smi --query-gpu=index,compute_cap --format=csv,noheader`` -> {index: "9.0"}."""
    found = {}
    for line in text.splitlines()[:64]:
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 2 and _GPU_INDEX.fullmatch(cols[0]) and _COMPUTE_CAP.fullmatch(cols[1]):
            found[int(cols[0])] = cols[1]
    return found


def from_smi(smi: str) -> Dict[str, Any]:
    res = run([smi, "-q"], what="asking nvidia-smi for the driver and GPUs", timeout=60, check=False,
              limit=16 * 1024 * 1024)
    if res.returncode != 0:
        return no_gpu(f"nvidia-smi -q failed (exit {res.returncode}): "
                      f"{res.stderr.strip()[:200]}")
    doc = parse_smi_q(res.stdout.decode("utf-8", "replace"))
    caps = run([smi, "--query-gpu=index,compute_cap", "--format=csv,noheader"], what="asking nvidia-smi for "
               "the compute capabilities", timeout=60, check=False, limit=1024 * 1024)
    if caps.returncode == 0:  # drivers before r510 know no compute_cap field
        by_index = parse_compute_caps(caps.stdout.decode("utf-8", "replace"))
        for g in doc["gpus"]:
            g["computeCapability"] = by_index.get(g["index"])
    return doc


def no_gpu(note: str) -> Dict[str, Any]:
    return {"source": None, "driverVersion": None, "cudaDriverVersion": None, "gpus": [], "note": note}


def _version_of(tool: str) -> Optional[str]:
    path = shutil.which(tool)
    if path is None:
        return None
    try:
        res = run([path, "--version"], what=f"asking {tool} for its version", timeout=30, check=False)
    except BundleError:
        return None
    text = res.stdout.decode("utf-8", "replace")
    m = _VERSION.search(text)
    if m is None or res.returncode != 0 or cudafit.parse_version(text[m.start():]) is None:
        return None  # none, or one running on into other digits (any script's)
    if m.start() and (text[m.start() - 1].isnumeric() or text[m.start() - 1] == "."):
        return None  # one that other digits run into
    return m.group(1)


def toolkit() -> Dict[str, Any]:
    """The NVIDIA container toolkit: versions and mode ("legacy", "cdi", "auto", "csv"; None: unknown)."""
    base = os.environ.get("XDG_CONFIG_HOME") or "/etc"
    config = os.path.join(base, "nvidia-container-runtime", "config.toml")
    mode = None
    try:
        with open(config, "rb") as f:
            m = _MODE.search(f.read(1024 * 1024).decode("utf-8", "replace"))
        mode = m.group(1) if m else "auto"  # the toolkit's default
    except OSError:
        pass
    return {"ctkVersion": _version_of("nvidia-ctk"), "cliVersion": _version_of("nvidia-container-cli"),
            "mode": mode, "config": config if mode is not None else None}


def probe() -> Dict[str, Any]:
    """This host's ``gpu`` object (inventory 1.3)."""
    doc: Optional[Dict[str, Any]] = None
    try:
        doc = from_nvml(ctypes.CDLL(os.environ.get(NVML_ENV) or "libnvidia-ml.so.1"))
    except (OSError, AttributeError):
        doc = None
    if doc is None:
        smi = shutil.which("nvidia-smi")
        try:
            doc = from_smi(smi) if smi else no_gpu("no NVIDIA driver: neither NVML (libnvidia-ml.so.1) nor "
                                                   "nvidia-smi is here")
        except BundleError as e:
            doc = no_gpu(f"nvidia-smi: {e.message}")
    doc["toolkit"] = toolkit()
    return doc
