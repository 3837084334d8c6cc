"""CUDA compatibility between the image and the host driver: a pure decision table.

Facts (NVIDIA's CUDA compatibility guide): a driver runs CUDA up to the version it reports
(``nvmlSystemGetCudaDriverVersion``). An image built for a newer CUDA of the same major runs
through minor-version compatibility, except kernels JIT-compiled from PTX (error 222). A newer
major needs the image's forward-compatibility libraries (``/usr/local/cuda*/compat``) first on
``LD_LIBRARY_PATH``, and these work on data-center GPUs only (error 804 elsewhere). Forcing
them on a driver that is already newer breaks CUDA init (error 803). Without either, CUDA init
fails (error 35, or the runtime hook refuses: ``unsatisfied condition: cuda>=X``)."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from importer.format import cudafit
from importer.smoke.worker.protocol import FAIL, PASS, SKIP, WARN

Version = Tuple[int, int]

MODE_NATIVE = "native"
MODE_FORWARD = "forward-compat"
MODE_NOT_APPLICABLE = "not-applicable"
MODE_UNKNOWN = "unknown"

_REQUIRE_RE = re.compile(r"cuda\s*>=\s*([^\s,]*)")

def parse_version(text: Optional[str]) -> Optional[Version]:
    """"12.4.1" -> (12, 4); None for anything else, and for digits outside ASCII 0-9 (the
    parser of importer/format/cudafit.py, which `bundle-import` uses too)."""
    if not text:
        return None
    return cudafit.major_minor(text)


def version_from_nvml(value: Optional[int]) -> Optional[Version]:
    """nvmlSystemGetCudaDriverVersion's integer (12040) -> (12, 4)."""
    if not value or value <= 0:
        return None
    return (value // 1000, (value % 1000) // 10)


def fmt(version: Optional[Version]) -> Optional[str]:
    return f"{version[0]}.{version[1]}" if version else None


def image_cuda_from_env(environ: Mapping[str, str]) -> Tuple[Optional[Version], Optional[str]]:
    """The CUDA version an image declares: ``CUDA_VERSION`` (NVIDIA's base images), else the
    ``cuda>=X.Y`` term of ``NVIDIA_REQUIRE_CUDA``. Returns (version, source)."""
    v = parse_version(environ.get("CUDA_VERSION"))
    if v is not None:
        return v, "CUDA_VERSION"
    for m in _REQUIRE_RE.finditer(environ.get("NVIDIA_REQUIRE_CUDA", "")):
        v = cudafit.major_minor(m.group(1))
        if v is not None:
            return v, "NVIDIA_REQUIRE_CUDA"
    return None, None


def find_compat_dirs(root: str = "/") -> List[str]:
    """``/usr/local/cuda*/compat`` folders that hold a ``libcuda.so*``."""
    found = []
    for d in sorted(glob.glob(os.path.join(root, "usr/local/cuda*/compat"))):
        if os.path.isdir(d) and glob.glob(os.path.join(d, "libcuda.so*")):
            found.append(d)
    return found


def is_datacenter_gpu(name: str, brand: Optional[str] = None) -> Optional[bool]:
    """True for data-center parts, False for GeForce/RTX workstation parts, None when neither
    the brand nor the name tells (importer/format/cudafit.py decides)."""
    return cudafit.is_datacenter(name, brand)


@dataclass(frozen=True)
class CompatDecision:
    mode: str
    status: str
    use_compat_libs: bool
    reason: str

    def to_dict(self) -> Dict[str, Any]:
        return {"mode": self.mode, "status": self.status, "useCompatLibs": self.use_compat_libs,
                "reason": self.reason}


def compat_version(compat_dir: Optional[str]) -> Optional[str]:
    """The driver version of a compat folder's ``libcuda.so.550.54.15``; None when not named so."""
    if not compat_dir:
        return None
    found = []
    for path in glob.glob(os.path.join(compat_dir, "libcuda.so.*")):
        v = os.path.basename(path)[len("libcuda.so."):]
        if cudafit.parse_version(v) is not None and v.count(".") >= 1:
            found.append(v)
    return max(found, key=lambda s: cudafit.parse_version(s) or ()) if found else None


def decide_compat(*, device: str, host_cuda: Optional[Version], image_cuda: Optional[Version],
                  datacenter: Optional[bool], compat_dir: Optional[str]) -> CompatDecision:
    """The compatibility mode to run the image in, and whether that is expected to work: the
    runtime rule of importer/format/cudafit.py (the one `bundle export --have` and
    `bundle-import` apply), in the suite's terms.

    device      "cuda" or "cpu"
    host_cuda   the newest CUDA the host driver supports (NVML), None when unknown
    image_cuda  the CUDA the image was built for, None when it declares none
    datacenter  whether the selected GPUs are data-center parts (None: cannot tell)
    compat_dir  the image's forward-compatibility libraries, None when it has none
    """
    if device != "cuda":
        return CompatDecision(MODE_NOT_APPLICABLE, SKIP, False, "CPU run: no driver/CUDA compatibility to check")
    if host_cuda is None:
        return CompatDecision(MODE_UNKNOWN, SKIP, False,
                              "the host driver's CUDA version is unknown (NVML unavailable)")
    if image_cuda is None:
        return CompatDecision(MODE_NATIVE, WARN, False,
                              f"the image declares no CUDA version (CUDA_VERSION, NVIDIA_REQUIRE_CUDA); "
                              f"running natively on the driver's CUDA {fmt(host_cuda)}")
    lib = (compat_version(compat_dir) or compat_dir) if compat_dir else None
    needs = cudafit.ImageNeeds(cuda=fmt(image_cuda), compat_libs=(lib,) if lib else ())
    target = cudafit.Target(cuda=fmt(host_cuda), gpus=(cudafit.GPU("", datacenter=datacenter),))
    fit = cudafit.runtime_fit(needs, target)
    reason = fit.reason + "".join(f"; {c}" for c in fit.caveats)
    if fit.status == cudafit.FITS_FORWARD:
        return CompatDecision(MODE_FORWARD, PASS if datacenter else WARN, True, f"{reason} ({compat_dir})")
    status = {cudafit.FITS: PASS, cudafit.FITS_MINOR: WARN}.get(fit.status, FAIL)
    return CompatDecision(MODE_NATIVE, status, False, reason)
