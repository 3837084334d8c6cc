"""The host gate: driver version, the newest CUDA it supports, the GPUs and their topology.

NVML through ``nvidia-ml-py`` (module ``pynvml``) when it is importable, else ``nvidia-smi``;
with neither, or without an NVIDIA driver, the gate is SKIP with the reason."""

from __future__ import annotations

import contextlib
import importlib
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from importer.errors import BundleError
from importer.inventory.gpuhost import BRANDS as _BRANDS  # NVML brand names, one table
from importer.smoke.worker import compat
from importer.smoke.worker.protocol import FAIL, PASS, SKIP, Stopwatch, result
from importer.streams.commands import run

# NVML errors that mean "no NVIDIA driver here" rather than "the driver is broken".
_ABSENT = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")


@dataclass
class HostGPU:
    index: int
    name: str
    uuid: str
    memory_total: int
    pci_bus_id: str
    brand: Optional[str] = None

    @property
    def datacenter(self) -> Optional[bool]:
        return compat.is_datacenter_gpu(self.name, self.brand)

    def to_dict(self) -> Dict[str, Any]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "memoryTotalBytes": self.memory_total,
                "pciBusId": self.pci_bus_id, "brand": self.brand, "datacenter": self.datacenter}


@dataclass
class HostFacts:
    source: Optional[str] = None  # "nvml", "nvidia-smi" or None
    driver_version: Optional[str] = None
    cuda_version: Optional[str] = None  # newest CUDA the driver supports, "12.4"
    gpus: List[HostGPU] = field(default_factory=list)
    topology: Optional[str] = None

    def selected(self, indices: Optional[List[int]]) -> List[HostGPU]:
        if indices is None:
            return list(self.gpus)
        return [g for g in self.gpus if g.index in indices]

    def datacenter(self, indices: Optional[List[int]]) -> Optional[bool]:
        flags = [g.datacenter for g in self.selected(indices)]
        if not flags:
            return None
        if any(f is False for f in flags):
            return False
        return True if all(flags) else None

    def to_dict(self) -> Dict[str, Any]:
        return {"source": self.source, "driverVersion": self.driver_version, "cudaDriverVersion": self.cuda_version,
                "gpus": [g.to_dict() for g in self.gpus], "topology": self.topology}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def load_nvml() -> Any:
    """The ``pynvml`` module of nvidia-ml-py, or None when it is not importable."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def facts_from_nvml(nvml: Any) -> HostFacts:
    """Read the facts through NVML; raises nvml.NVMLError (and subclasses) as NVML does."""
    nvml.nvmlInit()
    try:
        facts = HostFacts(source="nvml")
        facts.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        facts.cuda_version = compat.fmt(compat.version_from_nvml(int(nvml.nvmlSystemGetCudaDriverVersion())))
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                brand: Optional[str] = _BRANDS.get(int(nvml.nvmlDeviceGetBrand(h)), "UNKNOWN")
            except Exception:  # old drivers: no brand query
                brand = None
            facts.gpus.append(HostGPU(
                index=i,
                name=_text(nvml.nvmlDeviceGetName(h)),
                uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                memory_total=int(nvml.nvmlDeviceGetMemoryInfo(h).total),
                pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(h).busId),
                brand=brand,
            ))
        return facts
    finally:
        with contextlib.suppress(Exception):  # shutting down, perhaps after a failed init
            nvml.nvmlShutdown()


_SMI_CUDA = re.compile(r"CUDA Version:\s*(\S*)")
# ASCII digits: int() also takes Arabic-Indic and fullwidth digits, isdigit() superscripts
_COUNT = re.compile(r"[0-9]{1,12}")


def parse_smi_query(text: str) -> Tuple[Optional[str], List[HostGPU]]:
    """``nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id,driver_version
    --format=csv,noheader,nounits`` -> (driver version, GPUs)."""
    driver = None
    gpus = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 6 or not _COUNT.fullmatch(cols[0]):
            continue
        mib = int(cols[3]) if _COUNT.fullmatch(cols[3]) else 0
        gpus.append(HostGPU(int(cols[0]), cols[1], cols[2], mib * 1024 * 1024, cols[4]))
        driver = cols[5]
    return driver, gpus


def parse_smi_cuda(text: str) -> Optional[str]:
    """The "CUDA Version: 12.4" of plain ``nvidia-smi`` output; None when it is not a version
    (ASCII digits only, importer/format/cudafit.py)."""
    m = _SMI_CUDA.search(text)
    return compat.fmt(compat.parse_version(m.group(1))) if m else None


def facts_from_smi(smi: str) -> HostFacts:
    q = run([smi, "--query-gpu=index,name,uuid,memory.total,pci.bus_id,driver_version",
             "--format=csv,noheader,nounits"], what="asking nvidia-smi for the GPUs", timeout=60)
    driver, gpus = parse_smi_query(q.stdout.decode("utf-8", "replace"))
    plain = run([smi], what="asking nvidia-smi for the driver's CUDA version", timeout=60, check=False)
    return HostFacts(source="nvidia-smi", driver_version=driver,
                     cuda_version=parse_smi_cuda(plain.stdout.decode("utf-8", "replace")), gpus=gpus)


def topology() -> Optional[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        res = run([smi, "topo", "-m"], what="reading the GPU topology", timeout=60, check=False)
    except BundleError:
        return None
    text = res.stdout.decode("utf-8", "replace").strip()
    return text[:16384] if res.returncode == 0 and text else None


def probe_host(nvml: Any = None, *, smi: Optional[str] = None,
               use_defaults: bool = True) -> Tuple[HostFacts, Dict[str, Any]]:
    """Host facts and the host gate's result. ``nvml``/``smi`` default to the real pynvml module
    and the nvidia-smi on PATH (``use_defaults=False`` looks for neither)."""
    watch = Stopwatch()
    if use_defaults:
        nvml = nvml if nvml is not None else load_nvml()
        smi = smi or shutil.which("nvidia-smi")
    facts = HostFacts()
    if nvml is not None:
        try:
            facts = facts_from_nvml(nvml)
        except Exception as e:
            kind = type(e).__name__
            text = f"NVML: {kind}: {e}"
            if kind in _ABSENT or (kind == "NVMLError" and "not found" in str(e).lower()):
                return facts, result("host", SKIP, watch.seconds, facts.to_dict(), None,
                                     f"{text}: no usable NVIDIA driver on this host")
            return facts, result("host", FAIL, watch.seconds, facts.to_dict(), text,
                                 "NVML answered with an error: check the driver (nvidia-smi) before training here")
    elif smi is not None:
        try:
            facts = facts_from_smi(smi)
        except BundleError as e:
            return facts, result("host", FAIL, watch.seconds, facts.to_dict(), f"nvidia-smi: {e.message}",
                                 e.context or "")
    else:
        return facts, result("host", SKIP, watch.seconds, facts.to_dict(), None,
                             "no NVML: nvidia-ml-py (pynvml) is not importable and nvidia-smi is not on PATH")
    facts.topology = topology()
    if not facts.gpus:
        return facts, result("host", SKIP, watch.seconds, facts.to_dict(), None,
                             f"driver {facts.driver_version} reports no GPU")
    return facts, result("host", PASS, watch.seconds, facts.to_dict(), None,
                         f"driver {facts.driver_version} (CUDA {facts.cuda_version}), {len(facts.gpus)} GPU(s) "
                         f"via {facts.source}")
