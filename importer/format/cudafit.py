"""Will this image run on that host: one decision from the image's CUDA needs and the host's
driver, used by ``bundle export --have``, ``bundle-import`` and the smoke suite's compat gate
(docs/gpu-fit.md), so the three can never disagree. Stdlib only, Python 3.8: the smoke suite
copies this file into the image.

Two rules, NVIDIA's (CUDA Compatibility guide; nvidia-container-toolkit):

1. Admission, exactly as the container toolkit decides (docs/gpu-fit.md cites the source for
   each rule): the requirements are nvidia-container-toolkit's ``CUDA.GetRequirements``
   (internal/config/image/cuda_image.go: every ``NVIDIA_REQUIRE_*`` but ``NVIDIA_REQUIRE_JETPACK*``,
   plus ``cuda>=MAJOR.MINOR`` for a legacy image; none when ``NVIDIA_DISABLE_REQUIRE`` is true
   to Go's ``strconv.ParseBool``). In legacy mode each is one ``--require`` that
   libnvidia-container's ``dsl_evaluate`` (src/cli/dsl.c) checks for every visible GPU
   (src/cli/configure.c ``configure_command``): space-separated groups ORed, comma-separated
   terms ANDed, left to right, and an invalid term fails the container when it is reached. In
   CSV mode (Jetson) the toolkit's own internal/requirements checks them; CDI and jit-cdi modes
   check nothing.
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
    disable_require: bool = False  # NVIDIA_DISABLE_REQUIRE is true to Go's strconv.ParseBool
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
    disabled = go_parse_bool(pairs["NVIDIA_DISABLE_REQUIRE"]) is True if "NVIDIA_DISABLE_REQUIRE" in pairs else False
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
    toolkit_mode: Optional[str] = None  # "legacy", "auto", "csv", "cdi", "jit-cdi" or None (unknown)
    known: bool = True  # False: nothing is known of the GPU side
    cli_version: Optional[str] = None  # nvidia-container-cli's version: brand names before 1.9.0

    def driver_cuda(self) -> Optional[Tuple[int, int]]:
        return major_minor(self.cuda) or cuda_of_driver(self.driver)

    def datacenter(self) -> Optional[bool]:
        flags = [g.datacenter for g in self.gpus]
        if not flags:
            return None
        if any(f is False for f in flags):
            return False
        return True if all(flags) else None


# ============================== rule 1: admission, as the container toolkit's source decides
#: libnvidia-container src/driver.c ``driver_get_device_brand_1_svc``: the string a GPU's NVML
#: brand becomes, which ``brand`` terms compare with (case-insensitively). Before
#: libnvidia-container 1.9.0 only these six had a name; every other brand was "Unknown".
_CLI_BRANDS_OLD = {"QUADRO": "Quadro", "TESLA": "Tesla", "NVS": "NVS", "GRID": "GRID", "GEFORCE": "GeForce",
                   "TITAN": "TITAN"}
#: 1.9.0 ("Update switch statement to include new brands from latest nvml.h"): the names
#: NVIDIA's own base images list in their brand groups (nvidiartx, quadrortx, vapps, vpc, vcs,
#: vws, cloudgaming, geforcertx, titanrtx, nvidia).
_CLI_BRANDS = {**_CLI_BRANDS_OLD, "NVIDIA_VAPPS": "VApps", "NVIDIA_VPC": "VPC", "NVIDIA_VCS": "VCS",
               "NVIDIA_VWS": "VWS", "NVIDIA_CLOUD_GAMING": "CloudGaming", "NVIDIA_VGAMING": "CloudGaming",
               "QUADRO_RTX": "QuadroRTX", "NVIDIA_RTX": "NvidiaRTX", "NVIDIA": "Nvidia", "GEFORCE_RTX": "GeForceRTX",
               "TITAN_RTX": "TitanRTX"}
#: nvidia-smi -q's "Product Brand" for the vGPU brands, as the inventory records it
_SMI_BRANDS = {"NVIDIA_VIRTUAL_APPLICATIONS": "NVIDIA_VAPPS", "NVIDIA_VIRTUAL_PC": "NVIDIA_VPC",
               "NVIDIA_VIRTUAL_COMPUTE_SERVER": "NVIDIA_VCS", "NVIDIA_RTX_VIRTUAL_WORKSTATION": "NVIDIA_VWS"}

#: modes of nvidia-container-runtime that check no NVIDIA_REQUIRE_* (internal/modifier/mode.go:
#: the CDI modifiers call no checkRequirements)
UNCHECKED_MODES = ("cdi", "jit-cdi")
_REQUIRE_PREFIX = "NVIDIA_REQUIRE_"  # internal/config/image/envvars.go NvidiaRequirePrefix
_JETPACK = "NVIDIA_REQUIRE_JETPACK"  # EnvVarNvidiaRequireJetpack: skipped by GetRequirements
_EXPR_MAX = 128  # src/cli/dsl.c EXPR_MAX
_UINTMAX = 2 ** 64 - 1
_INVALID = -1  # dsl.c: an invalid expression


def go_parse_bool(text: str) -> Optional[bool]:
    """Go's ``strconv.ParseBool``: None where it returns an error (the toolkit's
    ``HasDisableRequire`` then reads false)."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def cli_brand(brand: Optional[str], cli_version: Optional[str] = None) -> Optional[str]:
    """An inventory's GPU brand (NVML's enum name, or nvidia-smi's "Product Brand" upper-cased)
    as libnvidia-container names it; None when the inventory does not say."""
    if brand is None:
        return None
    key = brand.strip().upper().replace(" ", "_")
    key = _SMI_BRANDS.get(key, key)
    v = parse_version(cli_version)
    table = _CLI_BRANDS_OLD if v is not None and _cmp(v, (1, 9)) < 0 else _CLI_BRANDS
    return table.get(key, "Unknown")  # the switch's default


_SEMVER = re.compile(r"^v?([0-9]+)(\.[0-9]+)?(\.[0-9]+)?(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
                     r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$")
_Semver = Tuple[int, int, int, Tuple[Any, ...]]


def go_semver(text: str) -> Optional[_Semver]:
    """Masterminds/semver v3 ``NewVersion`` (coercing, as vendored by the toolkit): None where it
    fails. The prerelease as a tuple of identifiers ((0, n) numeric, (1, s) not), () for none."""
    m = _SEMVER.match(text) if len(text) <= 256 else None
    if m is None:
        return None
    parts = [int(g.lstrip(".")) if g else 0 for g in m.group(1, 2, 3)]
    if any(p > _UINTMAX for p in parts):
        return None  # strconv.ParseUint(.., 10, 64) overflows
    pre: List[Tuple[Any, ...]] = []
    for ident in (m.group(4) or "").split(".") if m.group(4) else ():
        if ident.isdigit() and ident.isascii():
            if len(ident) > 1 and ident[0] == "0":
                return None  # validatePrerelease: ErrSegmentStartsZero
            pre.append((0, int(ident)))
        else:
            pre.append((1, ident))
    return parts[0], parts[1], parts[2], tuple(pre)


def _semver_cmp(a: _Semver, b: _Semver) -> int:
    """Masterminds ``Version.Compare``: major, minor, patch, then a release above its prerelease."""
    x, y = a[:3], b[:3]
    if x != y:
        return (x > y) - (x < y)
    if a[3] == b[3]:
        return 0
    if not a[3] or not b[3]:
        return 1 if not a[3] else -1
    return (a[3] > b[3]) - (a[3] < b[3])


@dataclass(frozen=True)
class Requirements:
    """What the toolkit passes on (``CUDA.GetRequirements``): the requirement strings, each with
    the variable it came from, or the error that fails every container."""

    items: Tuple[Tuple[str, str], ...] = ()
    error: Optional[str] = None
    disabled: bool = False


def requirements(needs: ImageNeeds) -> Requirements:
    """nvidia-container-toolkit internal/config/image/cuda_image.go ``GetRequirements``."""
    if needs.disable_require:  # HasDisableRequire
        return Requirements(disabled=True)
    items = [(k, v) for k, v in sorted(needs.require.items())
             if k.startswith(_REQUIRE_PREFIX) and not k.startswith(_JETPACK)]
    if needs.cuda and not needs.require.get("NVIDIA_REQUIRE_CUDA"):  # IsLegacy
        v = go_semver(needs.cuda)  # legacyVersion -> parseMajorMinorVersion
        if v is None:
            return Requirements(tuple(items), f"failed to get requirements failed to get version: invalid CUDA "
                                f"version {needs.cuda[:80]}: invalid version string")
        items.append(("CUDA_VERSION (legacy image)", f"cuda>={v[0]}.{v[1]}"))
    return Requirements(tuple(items))


# ------------------------------ libnvidia-container src/cli/dsl.c
_DSL_OPS = (("=", "eq"), ("!=", "ne"), ("<", "lt"), ("<=", "le"), (">", "gt"), (">=", "ge"))


def _strtoumax(s: str, i: int) -> Tuple[int, int]:
    j = i
    while j < len(s) and "0" <= s[j] <= "9":
        j += 1
    return (int(s[i:j]) if j > i else 0), j


def dsl_compare_version(v1: str, cmp: str, v2: str) -> int:
    """dsl.c ``dsl_compare_version``: 1 true, 0 false, -1 invalid (a character other than
    ASCII digits and dots, or a number strtoumax cannot hold)."""
    if any(c not in "0123456789." for c in v1 + v2):
        return _INVALID
    i = j = 0
    while i < len(v1) and j < len(v2):
        n1, e1 = _strtoumax(v1, i)
        n2, e2 = _strtoumax(v2, j)
        if e1 == i or e2 == j or n1 >= _UINTMAX or n2 >= _UINTMAX:
            return _INVALID
        if n1 != n2:
            if cmp in ("eq", "ne"):
                return int(cmp == "ne")
            return int(n1 < n2) if cmp in ("lt", "le") else int(n1 > n2)
        i, j = len(v1) - len(v1[e1:].lstrip(".")), len(v2) - len(v2[e2:].lstrip("."))
    r1, r2 = v1[i:].lstrip(".0"), v2[j:].lstrip(".0")
    if cmp == "ne":
        return int(bool(r1 or r2))
    if cmp in ("eq", "le", "ge"):
        if not r1 and not r2:
            return 1
        if cmp == "eq":
            return 0
    if cmp in ("lt", "le"):
        return int(not r1 and bool(r2))
    return int(bool(r1) and not r2)


def _ascii_lower(s: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def dsl_compare_string(s1: str, cmp: str, s2: str) -> int:
    """dsl.c ``dsl_compare_string``: ``=``/``!=`` ignoring ASCII case (str_case_equal); any
    other operator is invalid."""
    if cmp in ("eq", "ne"):
        return int((_ascii_lower(s1) == _ascii_lower(s2)) == (cmp == "eq"))
    return _INVALID


#: one evaluation's facts (src/cli/configure.c ``dsl_data``): the driver's CUDA and version, the
#: GPU's arch and brand; None where the C pointer is NULL (no GPU visible), which holds
Facts = Dict[str, Optional[str]]


def _evaluate_rule(expr: str, facts: Facts) -> int:
    """dsl.c ``evaluate_rule``: KEY OP VALUE, the operator the longest run of ``<>=!`` that some
    operator of the table starts with (``!`` reads ``!=``; ``==``, ``=<`` are no operator)."""
    n = next((k for k, c in enumerate(expr) if c in "<>=!"), len(expr))
    if n == 0:
        return _INVALID
    key, rest = expr[:n], expr[n:]
    m = len(rest) - len(rest.lstrip("<>=!"))
    if m == 0:
        return _INVALID
    run = rest[:m]
    op = next(((s, c) for s, c in _DSL_OPS if s.startswith(run)), None)
    value = rest[m:]
    if op is None or not value:
        return _INVALID
    name = _ascii_lower(key)  # str_case_equal against the rules' names
    if name not in ("cuda", "driver", "arch", "brand"):
        return _INVALID
    have = facts.get(name)
    if have is None:
        ret = 1  # configure.c check_*: no driver info / no device visible: assumed ok
    elif name == "brand":
        ret = dsl_compare_string(have, op[1], value)
    else:
        ret = dsl_compare_version(have, op[1], value)
    if ret == 0 and len(f"{key} {op[0]} {value}".encode("utf-8", "surrogatepass")) >= _EXPR_MAX:
        return _INVALID  # the snprintf of the failed expression into buf[EXPR_MAX] overflows
    return ret


def dsl_evaluate(predicate: str, facts: Facts) -> Tuple[bool, str]:
    """dsl.c ``dsl_evaluate``: (holds, nvidia-container-cli's error when not)."""
    ret = 1
    for or_expr in predicate.split(" "):
        if not or_expr:
            continue
        exhausted = True
        for and_expr in or_expr.split(","):
            if not and_expr:
                continue
            ret = _evaluate_rule(and_expr, facts)
            if ret < 0:
                return False, "invalid expression"
            if not ret:
                exhausted = False
                break
        if exhausted:
            break
    if ret:
        return True, ""
    first = predicate.split(" ")[0]
    if first.startswith("cuda>="):
        return False, (f"unsatisfied condition: {first}, please update your driver to a newer version, or use "
                       "an earlier cuda container")
    return False, f"unsatisfied condition: {first}"


# ------------------------------ nvidia-container-toolkit internal/requirements (CSV mode)
def _csv_assert(requirement_list: Sequence[str], facts: Facts) -> Tuple[bool, str]:
    """internal/requirements ``Requirements.Assert`` with the properties internal/modifier/csv.go
    ``checkRequirements`` sets: ``cuda`` (the driver's) and ``arch`` (CUDA device 0); ``driver``
    and ``brand`` stay empty. Property names are case-sensitive, unknown ones skipped."""
    props = {"cuda": facts.get("cuda") or "", "arch": facts.get("arch") or "", "driver": "", "brand": ""}
    parsed: List[List[List[Tuple[str, str, str]]]] = []
    for req in requirement_list:  # constraints.New: every requirement parsed first
        if not req.strip():
            continue
        terms = []
        for term in req.split(" "):
            factors = []
            for factor in term.split(","):
                if not factor.strip():
                    continue
                end = next((k for k, c in enumerate(factor) if c in "<>=!"), -1)
                if end < 0:
                    return False, f"requirements not met: invalid constraint: {factor}"
                prop, cond = factor[:end], factor[end:]
                if prop not in props:
                    continue  # "Skipping unsupported constraint"
                op = next((o for o in ("!=", "<=", ">=", "=", "<", ">") if cond.startswith(o)), "")
                value = cond[len(op):]
                if prop != "brand" and go_semver(value) is None:
                    return False, f"requirements not met: invalid version string: {value}"
                factors.append((prop, op, value))
            if factors:
                terms.append(factors)
        if terms:
            parsed.append(terms)

    def binary(prop: str, op: str, value: str) -> Optional[bool]:  # None: an error
        if prop == "brand":
            c = (props[prop] > value) - (props[prop] < value)
        else:
            have, want = go_semver(props[prop]), go_semver(value)
            if have is None or want is None:
                return None
            c = _semver_cmp(have, want)
        ok = {"=": c == 0, "!=": c != 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}.get(op)
        return ok

    for terms in parsed:
        if not any(all(binary(*f) is True for f in factors) for factors in terms):
            first = ",".join(f"{p}{o}{v}" for p, o, v in terms[0])
            return False, f"requirements not met: unsatisfied condition: {first}"
    return True, ""


def _facts(target: Target) -> Tuple[Optional[str], Optional[str], List[Tuple[Optional[str], Optional[str]]]]:
    """The host's CUDA and driver as libnvidia-container reads them (``%u.%u`` of
    nvmlSystemGetCudaDriverVersion; nvmlSystemGetDriverVersion), and each GPU's (arch, brand);
    None where the inventory does not say."""
    cuda = target.driver_cuda()
    driver = parse_version(target.driver)
    gpus = []
    for g in target.gpus:
        cc = parse_version(g.compute_capability)
        gpus.append((f"{cc[0]}.{cc[1]}" if cc and len(cc) >= 2 else None, cli_brand(g.brand, target.cli_version)))
    return (f"{cuda[0]}.{cuda[1]}" if cuda else None), fmt(driver), gpus


def _candidates(key: str, reqs: Sequence[str]) -> List[str]:
    """Stand-ins for a fact the inventory lacks: every value the requirements compare ``key``
    with, one just above each, and the extremes; for brand, each named brand and one named by none."""
    values = set()
    for req in reqs:
        for term in re.split(r"[ ,]", req):
            n = next((k for k, c in enumerate(term) if c in "<>=!"), 0)
            if n and _ascii_lower(term[:n]) == key:
                values.add(term[n:].lstrip("<>=!"))
    if key == "brand":
        return [*sorted(values), "\x01none"]
    out = {"0", "99999999"}
    for v in values:
        if v and all(c in "0123456789." for c in v):
            out.update((v, v.rstrip(".") + ".0.1"))
    return sorted(out)


def admission(needs: ImageNeeds, target: Target) -> Tuple[Optional[bool], str]:
    """The container toolkit's check of the image's requirements on ``target``: (admitted, why).
    None: nothing is checked (disabled, CDI mode, no requirement), or the answer turns on a fact
    the inventory lacks (a GPU's brand or arch)."""
    reqs = requirements(needs)
    if reqs.disabled:
        return None, "NVIDIA_DISABLE_REQUIRE is true: the toolkit checks no requirement"
    mode = (target.toolkit_mode or "").lower()
    if mode in UNCHECKED_MODES:
        return None, f"the toolkit runs in {mode} mode: NVIDIA_REQUIRE_* is not checked"
    if reqs.error:
        return False, f"nvidia-container-runtime-hook: {reqs.error}"
    if not reqs.items:
        return None, "the image sets no NVIDIA_REQUIRE_* the toolkit checks"
    where = f"driver {target.driver}, CUDA {fmt(target.driver_cuda())}"
    if any("\x00" in v for _, v in reqs.items):
        return False, f"nvidia-container-runtime-hook: exec failed: invalid argument (a NUL in a requirement; {where})"
    values = [v for _, v in reqs.items]
    cuda, driver, gpus = _facts(target)
    csv = mode == "csv"
    if csv:
        gpus = gpus[:1] or [(None, None)]  # cuda.ComputeCapability(0)
    elif not gpus:
        gpus = [(None, None)]  # configure.c: no GPU visible, dev NULL
    verdicts: List[Optional[Tuple[bool, str, str]]] = []
    for arch, brand in gpus:
        known: Facts = {"cuda": cuda, "driver": driver, "arch": arch, "brand": brand}
        # a fact the inventory lacks is tried at every value that can change the answer; arch and
        # brand of no GPU at all are the C code's NULL device, which holds
        asked = ["cuda", "arch"] if csv else ["cuda", "driver"] + (["arch", "brand"] if target.gpus else [])
        missing = [k for k in asked if known[k] is None]
        options: List[Facts] = [dict(known)]
        for k in missing:
            options = [{**o, k: c} for o in options for c in _candidates(k, values)][:20000]
        outcomes = set()
        first_fail: Optional[Tuple[bool, str, str]] = None
        for facts in options:
            if csv:
                ok, err = _csv_assert(values, facts)
                name = ""
            else:
                ok, err, name = True, "", ""
                for req_name, value in reqs.items:
                    ok, err = dsl_evaluate(value, facts)
                    if not ok:
                        name = req_name
                        break
            outcomes.add(ok)
            if not ok and first_fail is None:
                first_fail = (False, err, name)
        if outcomes == {True}:
            verdicts.append((True, "", ""))
        elif outcomes == {False} and first_fail is not None:
            return False, (f"nvidia-container-cli: requirement error: {first_fail[1]} ({first_fail[2]}; {where})"
                           if not csv else f"nvidia-container-runtime: {first_fail[1]} ({where})")
        else:
            verdicts.append(None)
    if all(v is not None for v in verdicts):
        return True, "the toolkit's requirements hold on this driver and every GPU"
    return None, ("whether the toolkit admits it turns on what the inventory does not record (a GPU's brand or "
                  "compute capability)")


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
    reqs = requirements(needs)
    checked = bool(reqs.items or reqs.error)
    if fit.status in (NO_CUDA, UNKNOWN, NO_GPU) and not (fit.status == NO_CUDA and checked):
        return fit
    if not target.known or target.driver_cuda() is None:
        return fit
    admitted, why = admission(needs, target)
    if admitted is False:
        hint = (f"; driver {fit.needed_driver or '?'} or newer fits" if "unsatisfied condition" in why
                else "; no driver fits: the image's requirements are what fails")
        return Fit(UNFIT, f"{why}: the container will not start{hint}", fit.image_cuda, fit.needed_driver, False,
                   False, fit.caveats)
    caveats = fit.caveats
    if admitted is None and checked and not reqs.disabled and "turns on" in why:
        caveats = (*caveats, why)
    return Fit(fit.status, fit.reason, fit.image_cuda, fit.needed_driver, fit.use_compat_libs, admitted, caveats)


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
    cli = toolkit.get("cliVersion") if isinstance(toolkit.get("cliVersion"), str) else None
    return Target(driver, cuda, tuple(gpus), mode, known=True, cli_version=cli)
