"""Will this image run on that host: one decision from the image's CUDA needs and the host's
driver, used by ``bundle export --have``, ``bundle-import`` and the smoke suite's compat gate
(docs/gpu-fit.md), so the three can never disagree. Stdlib only, Python 3.8: the smoke suite
copies this file into the image.

Two rules, NVIDIA's (CUDA Compatibility guide; nvidia-container-toolkit):

1. Admission (legacy mode of the container toolkit): every ``NVIDIA_REQUIRE_*`` variable must
   hold; inside one, space-separated alternatives are ORed and comma-separated constraints
   ANDed (``cuda>=12.4 brand=tesla,driver>=535,driver<536``). ``NVIDIA_DISABLE_REQUIRE`` set
   turns the check off. CDI mode does not check. A refusal reads ``nvidia-container-cli:
   requirement error: unsatisfied condition: cuda>=12.4``.
2. Runtime against driver: native when the image's CUDA <= the driver's CUDA; minor-version
   compatibility when the major is the same and the driver is at least that family's minimum
   (:data:`MINOR_COMPAT_MIN`; kernels JIT-compiled from newer PTX fail, error 222); forward
   compatibility through the image's ``/usr/local/cuda*/compat`` libraries, on data-center GPUs
   only (error 804 elsewhere), when those libraries are new enough for the image's CUDA;
   otherwise unfit (CUDA init error 35), and :func:`min_driver` says which driver would fit."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

Version = Tuple[int, ...]

FITS = "fits"  # native: the driver supports the image's CUDA
FITS_MINOR = "fits-minor-compat"
FITS_FORWARD = "fits-forward-compat"
UNFIT = "unfit"
UNKNOWN = "unknown"  # the target's GPU side is not known (old inventory, no NVML)
NO_GPU = "no-gpu"  # the target has no NVIDIA GPU/driver; the image wants CUDA
NO_CUDA = "no-cuda"  # the image declares no CUDA: nothing to check
STATUSES = (FITS, FITS_MINOR, FITS_FORWARD, UNFIT, UNKNOWN, NO_GPU, NO_CUDA)

#: Minor-version compatibility: the oldest driver of each CUDA major family (CUDA Compatibility
#: guide, "Minor Version Compatibility" table).
MINOR_COMPAT_MIN: Dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

#: The oldest Linux x86_64 driver of each toolkit's GA release (CUDA Toolkit release notes,
#: "CUDA Toolkit and Corresponding Driver Versions"). A driver at least this new reports at
#: least this CUDA version.
TOOLKIT_DRIVER: Dict[Tuple[int, int], str] = {
    (11, 0): "450.36.06", (11, 1): "455.23.05", (11, 2): "460.27.03", (11, 3): "465.19.01",
    (11, 4): "470.42.01", (11, 5): "495.29.05", (11, 6): "510.39.01", (11, 7): "515.43.04",
    (11, 8): "520.61.05", (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03",
    (12, 3): "545.23.06", (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03",
    (12, 8): "570.26", (12, 9): "575.51.03", (13, 0): "580.65.06",
}

# ASCII digits only: int() and \d also take other scripts' digits (Arabic-Indic, fullwidth), which no driver
# or toolkit writes; such a value is as unparseable as 'abc'. The lookahead refuses a number that
# runs on into more digits, ASCII or not.
_NUM = re.compile(r"^\s*v?([0-9]{1,9}(?:\.[0-9]{1,9}){0,5})(?![0-9.]*[0-9])")
_TOKEN = re.compile(r"\S*")  # what runs on from the number up to the next space
_REQUIRE_CUDA = re.compile(r"(?:^|\s)cuda>=([^\s,]*)")
_CONSTRAINT = re.compile(r"^(cuda|driver|arch|brand)(>=|<=|==|=|>|<)(.+)$")
_DISABLED = ("", "0", "false", "no")


def parse_version(text: Any) -> Optional[Version]:
    """"535.104.05" -> (535, 104, 5); "12.4" -> (12, 4); None for anything else, and for a
    version written with any digit outside ASCII 0-9 (Arabic-Indic or fullwidth digits, a superscript)."""
    if text is None:
        return None
    text = str(text)[:80]
    m = _NUM.match(text)
    if m is None or _foreign_digit(_TOKEN.match(text, m.end()).group()):  # type: ignore[union-attr]
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def _foreign_digit(text: str) -> bool:
    """Whether ``text`` holds a digit or number sign other than ASCII 0-9 (any script's digits,
    superscripts, fractions), or a byte that did not decode (U+FFFD: NVML's driver string)."""
    return any((c.isnumeric() and not "0" <= c <= "9") or c == "\ufffd" for c in text)


def major_minor(text: Any) -> Optional[Tuple[int, int]]:
    v = parse_version(text)
    if v is None or len(v) < 2:
        return None
    return v[0], v[1]


def fmt(v: Optional[Sequence[int]]) -> Optional[str]:
    return ".".join(str(p) for p in v) if v else None


def min_driver(cuda: Tuple[int, int]) -> Optional[str]:
    """The oldest driver that runs CUDA ``cuda`` natively: that release's GA driver, else the
    next release's listed (a release this table lacks, such as 12.7)."""
    later = sorted(k for k in TOOLKIT_DRIVER if k >= cuda)
    return TOOLKIT_DRIVER[later[0]] if later else None


def cuda_of_driver(driver: Any) -> Optional[Tuple[int, int]]:
    """The newest CUDA a driver version supports, from the table (for a driver with no NVML)."""
    v = parse_version(driver)
    if v is None:
        return None
    fit = [k for k, d in TOOLKIT_DRIVER.items() if _cmp(v, parse_version(d) or ()) >= 0]
    return max(fit) if fit else None


def _cmp(a: Sequence[int], b: Sequence[int]) -> int:
    n = max(len(a), len(b))
    x, y = tuple(a) + (0,) * (n - len(a)), tuple(b) + (0,) * (n - len(b))
    return (x > y) - (x < y)


@dataclass(frozen=True)
class ImageNeeds:
    """What an image asks of the driver (bundle.json ``cuda``; docs/bundle-format.md)."""

    cuda: Optional[str] = None  # CUDA_VERSION, "12.4.1"
    require: Dict[str, str] = field(default_factory=dict)  # NVIDIA_REQUIRE_* -> value
    disable_require: bool = False
    compat_libs: Tuple[str, ...] = ()  # driver versions of /usr/local/cuda*/compat/libcuda.so.X
    torch_cuda: Optional[str] = None  # torch/version.py's cuda = '12.4'

    def wanted(self) -> Tuple[Optional[Tuple[int, int]], str]:
        """The CUDA the image runs: CUDA_VERSION, else NVIDIA_REQUIRE_CUDA's cuda>=, else torch's."""
        v = major_minor(self.cuda)
        if v is not None:
            return v, "CUDA_VERSION"
        for m in _REQUIRE_CUDA.finditer(self.require.get("NVIDIA_REQUIRE_CUDA", "")):
            v = major_minor(m.group(1))
            if v is not None:
                return v, "NVIDIA_REQUIRE_CUDA"
        v = major_minor(self.torch_cuda)
        return (v, "torch") if v is not None else (None, "")

    def to_dict(self) -> Dict[str, Any]:
        return {"cudaVersion": self.cuda, "require": dict(sorted(self.require.items())),
                "disableRequire": self.disable_require, "compatLibs": list(self.compat_libs),
                "torchCuda": self.torch_cuda}

    @property
    def empty(self) -> bool:
        return not (self.cuda or self.require or self.compat_libs or self.torch_cuda)


def needs_from_env(env: Any, *, compat_libs: Sequence[str] = (), torch_cuda: Optional[str] = None) -> ImageNeeds:
    """From an image config's ``Env`` (a list of ``K=V``) or a mapping."""
    pairs: Dict[str, str] = {}
    if isinstance(env, Mapping):
        pairs = {str(k): str(v) for k, v in env.items()}
    elif isinstance(env, list):
        for item in env:
            if isinstance(item, str) and "=" in item:
                k, _, v = item.partition("=")
                pairs[k] = v
    require = {k: v for k, v in pairs.items() if k.startswith("NVIDIA_REQUIRE_")}
    disabled = pairs.get("NVIDIA_DISABLE_REQUIRE", "").strip().lower() not in _DISABLED
    cuda = pairs.get("CUDA_VERSION") or None
    return ImageNeeds(cuda, require, disabled, tuple(sorted(set(compat_libs), key=lambda s: parse_version(s) or ())),
                      torch_cuda)


def needs_from_dict(doc: Any) -> Optional[ImageNeeds]:
    """bundle.json's ``cuda`` object back; None when absent or malformed."""
    if not isinstance(doc, dict):
        return None
    req = doc.get("require")
    libs = doc.get("compatLibs")
    return ImageNeeds(
        cuda=doc["cudaVersion"] if isinstance(doc.get("cudaVersion"), str) else None,
        require={str(k): str(v) for k, v in req.items() if isinstance(v, str)} if isinstance(req, dict) else {},
        disable_require=doc.get("disableRequire") is True,
        compat_libs=tuple(x for x in libs if isinstance(x, str)) if isinstance(libs, list) else (),
        torch_cuda=doc["torchCuda"] if isinstance(doc.get("torchCuda"), str) else None,
    )


# Brand names (NVML nvmlBrandType_t) that are never data-center parts.
_CONSUMER_BRANDS = {"GEFORCE", "GEFORCE_RTX", "TITAN", "TITAN_RTX", "NVIDIA_RTX", "QUADRO", "QUADRO_RTX", "NVS"}
_DATACENTER_NAME = re.compile(
    r"\b(Tesla|A100|A800|A30|A40|A10G?|A16|A2|H100|H800|H200|H20|GH200|B100|B200|B300|GB200|GB300|"
    r"L4|L40S?|L20|T4|V100|P100|P40|P4|K80|M60|M40)\b"
)


def is_datacenter(name: str, brand: Optional[str] = None) -> Optional[bool]:
    """True for data-center parts (forward compatibility supported), False for GeForce/RTX
    workstation parts, None when neither the brand nor the name tells."""
    b = (brand or "").upper()
    if b in _CONSUMER_BRANDS or re.search(r"\b(GeForce|TITAN|Quadro|RTX)\b", name or ""):
        return False
    if b == "TESLA" or _DATACENTER_NAME.search(name or ""):
        return True
    return None


@dataclass(frozen=True)
class GPU:
    name: str
    brand: Optional[str] = None  # NVML brand, "TESLA", "NVIDIA", "GEFORCE_RTX"
    compute_capability: Optional[str] = None  # "9.0"
    datacenter: Optional[bool] = None


@dataclass(frozen=True)
class Target:
    """The host side: driver, its CUDA, the GPUs, the container toolkit's mode."""

    driver: Optional[str] = None
    cuda: Optional[str] = None  # nvmlSystemGetCudaDriverVersion, "12.4"
    gpus: Tuple[GPU, ...] = ()
    toolkit_mode: Optional[str] = None  # "legacy", "cdi" or None (unknown)
    known: bool = True  # False: nothing is known of the GPU side

    def driver_cuda(self) -> Optional[Tuple[int, int]]:
        return major_minor(self.cuda) or cuda_of_driver(self.driver)

    def datacenter(self) -> Optional[bool]:
        flags = [g.datacenter for g in self.gpus]
        if not flags:
            return None
        if any(f is False for f in flags):
            return False
        return True if all(flags) else None


def _brand_name(brand: Optional[str]) -> str:
    """NVML's brand as the toolkit spells it in constraints: GEFORCE_RTX -> geforcertx."""
    return (brand or "unknown").replace("_", "").lower()


def _holds(term: str, target: Target) -> bool:
    m = _CONSTRAINT.match(term.strip())
    if m is None:
        return False  # the toolkit refuses a constraint it cannot parse
    key, op, value = m.groups()
    if key == "brand":
        want = value.strip().lower()
        names = [_brand_name(g.brand) for g in target.gpus] or ["unknown"]
        return all((n == want) == (op in ("=", "==")) for n in names)
    if key == "cuda":
        have: Optional[Sequence[int]] = target.driver_cuda()
    elif key == "driver":
        have = parse_version(target.driver)
    else:
        caps = [parse_version(g.compute_capability) for g in target.gpus]
        if not caps or any(c is None for c in caps):
            return False
        return all(_compare(c or (), op, value) for c in caps)
    return have is not None and _compare(have, op, value)


def _compare(have: Sequence[int], op: str, value: str) -> bool:
    want = parse_version(value)
    if want is None:
        return False
    c = _cmp(have, want)
    return {">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0, "=": c == 0, "==": c == 0}[op]


def admission(needs: ImageNeeds, target: Target) -> Tuple[Optional[bool], str]:
    """The container toolkit's legacy-mode check of ``NVIDIA_REQUIRE_*``: (admitted, why).
    None: not checked (disabled, CDI mode, nothing required)."""
    if needs.disable_require:
        return None, "NVIDIA_DISABLE_REQUIRE is set: the toolkit checks no requirement"
    if not needs.require:
        return None, "the image sets no NVIDIA_REQUIRE_*"
    if target.toolkit_mode == "cdi":
        return None, "the toolkit runs in CDI mode: NVIDIA_REQUIRE_* is not checked"
    for name, value in sorted(needs.require.items()):
        alternatives = [a for a in value.split() if a]
        if alternatives and not any(all(_holds(t, target) for t in a.split(",") if t) for a in alternatives):
            return False, (f"nvidia-container-cli: requirement error: unsatisfied condition: {alternatives[0]} "
                           f"({name}; driver {target.driver}, CUDA {fmt(target.driver_cuda())})")
    return True, "NVIDIA_REQUIRE_* holds on this driver and GPU"


@dataclass(frozen=True)
class Fit:
    status: str
    reason: str
    image_cuda: Optional[str] = None
    needed_driver: Optional[str] = None  # the oldest driver that would run it natively
    use_compat_libs: bool = False
    admitted: Optional[bool] = None
    caveats: Tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return self.status == UNFIT

    def to_dict(self) -> Dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "imageCuda": self.image_cuda,
                "neededDriver": self.needed_driver, "useCompatLibs": self.use_compat_libs,
                "admitted": self.admitted, "caveats": list(self.caveats)}


def _newest_compat(needs: ImageNeeds) -> Optional[str]:
    libs = sorted(needs.compat_libs, key=lambda s: parse_version(s) or ())
    return libs[-1] if libs else None


def _compat_enough(lib: str, image: Tuple[int, int]) -> Optional[bool]:
    """Whether compat libraries of driver version ``lib`` carry CUDA ``image``; None: unknown."""
    v, need = parse_version(lib), min_driver(image)
    if v is None or need is None:
        return None
    return _cmp(v, parse_version(need) or ()) >= 0


def runtime_fit(needs: ImageNeeds, target: Target) -> Fit:
    """Rule 2 alone: the image's CUDA runtime against the target's driver."""
    image, source = needs.wanted()
    i = fmt(image)
    if image is None:
        return Fit(NO_CUDA, "the image declares no CUDA (CUDA_VERSION, NVIDIA_REQUIRE_CUDA, torch)")
    need = min_driver(image)
    if not target.known:
        return Fit(UNKNOWN, f"image CUDA {i}; the target's driver is not known", i, need)
    host = target.driver_cuda()
    if host is None:
        return Fit(NO_GPU, f"image CUDA {i}; the target reports no NVIDIA driver", i, need)
    h = fmt(host)
    lib = _newest_compat(needs)
    if host >= image:
        note = (f"the image's compat libraries ({lib}) are NOT used: forcing them on a newer driver "
                "fails with error 803",) if lib else ()
        return Fit(FITS, f"driver supports CUDA {h} >= image CUDA {i} ({source}): native", i, need,
                   caveats=note)
    dc = target.datacenter()
    enough = _compat_enough(lib, image) if lib else False
    if lib and dc is not False and enough is not False:
        caveats = ["forward compatibility needs a driver branch NVIDIA supports for it"]
        if dc is None:
            caveats.append("could not tell whether the GPU is a data-center part (error 804 if not)")
        if enough is None:
            caveats.append("the compat libraries' version is unknown")
        return Fit(FITS_FORWARD, f"image CUDA {i} > driver CUDA {h}: forward compatibility with the image's "
                   f"compat libraries ({lib}) first on LD_LIBRARY_PATH", i, need, True, caveats=tuple(caveats))
    why_not = ""
    if lib and dc is False:
        why_not = (f"; the image has compat libraries ({lib}) but forward compatibility is unsupported on "
                   "non-data-center GPUs (error 804)")
    elif lib and enough is False:
        why_not = f"; the image's compat libraries ({lib}) are too old for CUDA {i} (need {need} or newer)"
    family = MINOR_COMPAT_MIN.get(image[0])
    drv = parse_version(target.driver)
    if host[0] == image[0] and (drv is None or family is None or _cmp(drv, parse_version(family) or ()) >= 0):
        return Fit(FITS_MINOR, f"image CUDA {i} > driver CUDA {h}: minor-version compatibility (same major, "
                   f"driver >= {family}){why_not}", i, need,
                   caveats=("kernels JIT-compiled from newer PTX fail (error 222); features of the newer "
                            "minor that need the newer driver are unavailable",))
    return Fit(UNFIT, f"image needs CUDA {i}, the driver ({target.driver}) supports up to {h} and the image "
               f"cannot bridge the gap (CUDA init fails with error 35 or `unsatisfied condition: cuda>={i}`)"
               f"{why_not or '; the image has no /usr/local/cuda*/compat libraries'}; driver {need} or newer "
               "fits", i, need)


def decide(needs: ImageNeeds, target: Target) -> Fit:
    """Both rules: admission by the container toolkit, then runtime against driver."""
    fit = runtime_fit(needs, target)
    if fit.status in (NO_CUDA, UNKNOWN, NO_GPU) and not (fit.status == NO_CUDA and needs.require):
        return fit
    if not target.known or target.driver_cuda() is None:
        return fit
    admitted, why = admission(needs, target)
    if admitted is False:
        return Fit(UNFIT, f"{why}: the container will not start; driver {fit.needed_driver or '?'} or newer fits",
                   fit.image_cuda, fit.needed_driver, False, False, fit.caveats)
    return Fit(fit.status, fit.reason, fit.image_cuda, fit.needed_driver, fit.use_compat_libs, admitted, fit.caveats)


def line(name: str, fit: Fit) -> str:
    """One human line: ``app:1  fits-minor-compat  image CUDA 12.8 > driver CUDA 12.2: ...``."""
    extra = f" (caveat: {'; '.join(fit.caveats)})" if fit.caveats else ""
    return f"gpu fit: {name}: {fit.status}: {fit.reason}{extra}"


def target_from_gpu_doc(doc: Any) -> Target:
    """An inventory's ``gpu`` object (inventory 1.3) -> Target; unknown when absent."""
    if not isinstance(doc, dict):
        return Target(known=False)
    gpus: List[GPU] = []
    for g in doc.get("gpus") or []:
        if isinstance(g, dict) and isinstance(g.get("name"), str):
            dc = g.get("datacenter")
            gpus.append(GPU(g["name"], g.get("brand") if isinstance(g.get("brand"), str) else None,
                            g.get("computeCapability") if isinstance(g.get("computeCapability"), str) else None,
                            dc if isinstance(dc, bool) else None))
    toolkit = doc.get("toolkit")
    toolkit = toolkit if isinstance(toolkit, dict) else {}
    mode = toolkit.get("mode") if isinstance(toolkit.get("mode"), str) else None
    driver = doc.get("driverVersion") if isinstance(doc.get("driverVersion"), str) else None
    cuda = doc.get("cudaDriverVersion") if isinstance(doc.get("cudaDriverVersion"), str) else None
    return Target(driver, cuda, tuple(gpus), mode, known=True)
