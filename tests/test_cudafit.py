"""The GPU fit decision (importer/format/cudafit.py, docs/gpu-fit.md), table-driven from NVIDIA's
tables: the CUDA Compatibility guide (minor-version compatibility minimums: 11.x >= 450.80.02,
12.x >= 525.60.13; forward compatibility on data-center GPUs only) and the CUDA Toolkit release
notes' "CUDA Toolkit and Corresponding Driver Versions" table (Linux x86_64: 12.4 GA >= 550.54.14,
12.6 GA >= 560.28.03, 12.8 GA >= 570.26, 12.9 GA >= 575.51.03, 13.0 GA >= 580.65.06). Targets are
the hosts the inventory fixtures describe (tests/data/gpu/), images the env of nvidia/cuda base
images (tests/kit/imagegen.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional, Tuple

import pytest

from importer.format import cudafit
from importer.format.cudafit import (
    FITS,
    FITS_FORWARD,
    FITS_MINOR,
    GPU,
    NO_CUDA,
    NO_GPU,
    UNFIT,
    UNKNOWN,
    ImageNeeds,
    Target,
    admission,
    cuda_of_driver,
    decide,
    min_driver,
    needs_from_dict,
    needs_from_env,
)
from importer.smoke.tree import write_tree
from tests.kit.gpukit import HOSTILE_VERSIONS
from tests.kit.imagegen import CUDA_IMAGES, cuda_env

H100 = GPU("NVIDIA H100 80GB HBM3", "NVIDIA", "9.0", True)
H200 = GPU("NVIDIA H200", "NVIDIA", "9.0", True)
B200 = GPU("NVIDIA B200", "NVIDIA", "10.0", True)
A100 = GPU("NVIDIA A100-SXM4-80GB", "NVIDIA", "8.0", True)
L4 = GPU("NVIDIA L4", "NVIDIA", "8.9", True)
RTX4090 = GPU("NVIDIA GeForce RTX 4090", "GEFORCE_RTX", "8.9", False)


def host(gpu: GPU, driver: str, cuda: str, mode: Optional[str] = "legacy", n: int = 8) -> Target:
    return Target(driver, cuda, (gpu,) * n, mode)


def image(tag: str, *, compat: bool = True, extra: Tuple[str, ...] = ()) -> ImageNeeds:
    lib = CUDA_IMAGES[tag][2]
    return needs_from_env([*cuda_env(tag), *extra], compat_libs=(lib,) if compat else ())


# ============================== the toolkit release notes' driver table
@pytest.mark.parametrize(("cuda", "driver"), [
    ((11, 8), "520.61.05"), ((12, 0), "525.60.13"), ((12, 2), "535.54.03"), ((12, 4), "550.54.14"),
    ((12, 6), "560.28.03"), ((12, 7), "570.26"),  # no 12.7 release: the next one's driver
    ((12, 8), "570.26"), ((12, 9), "575.51.03"), ((13, 0), "580.65.06"), ((13, 9), None),
])
def test_min_driver_follows_the_release_notes_table(cuda: Tuple[int, int], driver: Optional[str]) -> None:
    assert min_driver(cuda) == driver


@pytest.mark.parametrize(("driver", "cuda"), [
    ("535.104.05", (12, 2)), ("550.54.15", (12, 4)), ("470.82.01", (11, 4)), ("570.124.06", (12, 8)),
    ("580.65.06", (13, 0)), ("440.33.01", None), ("garbage", None), ("", None),
])
def test_the_driver_says_which_cuda_it_runs(driver: str, cuda: Optional[Tuple[int, int]]) -> None:
    assert cuda_of_driver(driver) == cuda


# ============================== both rules, on realistic hosts and nvidia/cuda images
TABLE = [
    # host, image needs, status, admitted, needed driver
    ("H100 r550, 12.4 image", host(H100, "550.54.15", "12.4"), image("12.4.1-runtime-ubuntu22.04"),
     FITS, True, "550.54.14"),
    ("H100 r535, 12.4 image: admitted by brand=nvidia,driver>=535; compat libs, data-center",
     host(H100, "535.104.05", "12.2"), image("12.4.1-runtime-ubuntu22.04"), FITS_FORWARD, True, "550.54.14"),
    ("RTX 4090 r535, 12.4 image: no forward compat on GeForce, minor-version compat",
     host(RTX4090, "535.104.05", "12.2", n=1), image("12.4.1-runtime-ubuntu22.04"), FITS_MINOR, True, "550.54.14"),
    ("L4 r545, 12.4 image: r545 is in no brand group and 12.3 < 12.4: the hook refuses",
     host(L4, "545.23.08", "12.3"), image("12.4.1-runtime-ubuntu22.04"), UNFIT, False, "550.54.14"),
    ("L4 r545, 12.4 image, NVIDIA_DISABLE_REQUIRE=1: forward compat",
     host(L4, "545.23.08", "12.3"), image("12.4.1-runtime-ubuntu22.04", extra=("NVIDIA_DISABLE_REQUIRE=1",)),
     FITS_FORWARD, None, "550.54.14"),
    ("L4 r545, 12.4 image, CDI mode: the requirement is not checked",
     host(L4, "545.23.08", "12.3", mode="cdi"), image("12.4.1-runtime-ubuntu22.04"), FITS_FORWARD, None, "550.54.14"),
    ("A100 r470 (CUDA 11.4), 12.4 image with compat libs: forward compat",
     host(A100, "470.82.01", "11.4"), image("12.4.1-runtime-ubuntu22.04"), FITS_FORWARD, True, "550.54.14"),
    ("A100 r470, 12.4 image without compat libs: another major, unfit",
     host(A100, "470.82.01", "11.4"), image("12.4.1-runtime-ubuntu22.04", compat=False), UNFIT, True, "550.54.14"),
    ("B200 r570, 13.0 image: admitted (r570 group), forward compat with 580.65.06 libs",
     host(B200, "570.124.06", "12.8"), image("13.0.0-runtime-ubuntu24.04"), FITS_FORWARD, True, "580.65.06"),
    ("RTX 4090 r570, 13.0 image: another major, no forward compat on GeForce",
     host(RTX4090, "570.124.06", "12.8", n=1), image("13.0.0-runtime-ubuntu24.04"), UNFIT, True, "580.65.06"),
    ("H200 r560, 12.8 image: forward compat", host(H200, "560.35.03", "12.6"), image("12.8.1-runtime-ubuntu24.04"),
     FITS_FORWARD, True, "570.26"),
    ("H200 r560, 12.8 image without compat libs: minor-version compat",
     host(H200, "560.35.03", "12.6"), image("12.8.1-runtime-ubuntu24.04", compat=False), FITS_MINOR, True, "570.26"),
    ("H100 r575, 12.8 image", host(H100, "575.51.03", "12.9"), image("12.8.1-runtime-ubuntu24.04"),
     FITS, True, "570.26"),
    ("11.8 image on r450.80.02 (the 11.x minimum): minor-version compat",
     host(RTX4090, "450.80.02", "11.0", n=1), image("11.8.0-runtime-ubuntu22.04"), FITS_MINOR, True, "520.61.05"),
    ("11.8 image on r450.51.06, below the 11.x minimum", host(RTX4090, "450.51.06", "11.0", n=1),
     image("11.8.0-runtime-ubuntu22.04"), UNFIT, True, "520.61.05"),
    ("no CUDA in the image", host(H100, "550.54.15", "12.4"), needs_from_env(["PATH=/bin"]), NO_CUDA, None, None),
    ("old inventory: nothing known", Target(known=False), image("12.4.1-runtime-ubuntu22.04"), UNKNOWN, None,
     "550.54.14"),
    ("no NVIDIA driver on the target", Target(), image("12.4.1-runtime-ubuntu22.04"), NO_GPU, None, "550.54.14"),
    ("torch's CUDA when the image declares none", host(H100, "535.104.05", "12.2"),
     needs_from_env([], torch_cuda="12.4"), FITS_MINOR, None, "550.54.14"),
]


@pytest.mark.parametrize(("what", "target", "needs", "status", "admitted", "driver"), TABLE, ids=[t[0] for t in TABLE])
def test_fit_table(what: str, target: Target, needs: ImageNeeds, status: str, admitted: Optional[bool],
                   driver: Optional[str]) -> None:
    fit = decide(needs, target)
    assert (fit.status, fit.admitted, fit.needed_driver) == (status, admitted, driver), fit.reason
    assert fit.reason and fit.refused == (status == UNFIT)
    assert fit.use_compat_libs == (status == FITS_FORWARD)


def test_unfit_says_what_failed_and_which_driver_fits() -> None:
    refused = decide(image("12.4.1-runtime-ubuntu22.04"), host(L4, "545.23.08", "12.3"))
    assert "unsatisfied condition: cuda>=12.4" in refused.reason and "550.54.14 or newer" in refused.reason
    geforce = decide(image("13.0.0-runtime-ubuntu24.04"), host(RTX4090, "570.124.06", "12.8", n=1))
    assert "804" in geforce.reason and "580.65.06 or newer" in geforce.reason
    minor = decide(image("12.4.1-runtime-ubuntu22.04"), host(RTX4090, "535.104.05", "12.2", n=1))
    assert any("PTX" in c for c in minor.caveats)
    native = decide(image("12.4.1-runtime-ubuntu22.04"), host(H100, "570.124.06", "12.8"))
    assert native.status == FITS and any("803" in c for c in native.caveats)


def test_compat_libs_too_old_for_the_image_do_not_bridge() -> None:
    needs = needs_from_env(cuda_env("12.8.1-runtime-ubuntu24.04"), compat_libs=("550.54.15",))
    fit = decide(needs, host(A100, "470.82.01", "11.4"))
    assert fit.status == UNFIT and "too old" in fit.reason


# ============================== the admission rule alone
@pytest.mark.parametrize(("require", "target", "admitted"), [
    ("cuda>=12.4", host(H100, "550.54.15", "12.4"), True),
    ("cuda>=12.4", host(H100, "535.104.05", "12.2"), False),
    ("cuda>=12.4 brand=tesla,driver>=535,driver<536", host(H100, "535.104.05", "12.2"), False),  # H100 is "nvidia"
    ("cuda>=12.4 brand=nvidia,driver>=535,driver<536", host(H100, "535.104.05", "12.2"), True),
    ("cuda>=12.4 brand=nvidia,driver>=535,driver<536", host(H100, "536.0", "12.2"), False),
    ("arch>=9.0", host(H100, "550.54.15", "12.4"), True),
    ("arch>=9.0", host(A100, "550.54.15", "12.4"), False),
    ("cuda>=12.0,arch>=8.0 cuda>=13.0", host(A100, "550.54.15", "12.4"), True),
    ("brand=geforcertx", host(RTX4090, "550.54.15", "12.4", n=1), True),
    ("driver>=garbage", host(H100, "550.54.15", "12.4"), False),
    ("nonsense", host(H100, "550.54.15", "12.4"), False),
])
def test_admission_ors_spaces_and_ands_commas(require: str, target: Target, admitted: bool) -> None:
    got, why = admission(ImageNeeds(require={"NVIDIA_REQUIRE_CUDA": require}), target)
    assert got is admitted, why


def test_every_require_variable_must_hold() -> None:
    needs = ImageNeeds(require={"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_ARCH": "arch>=9.0"})
    assert admission(needs, host(H100, "550.54.15", "12.4"))[0] is True
    got, why = admission(needs, host(A100, "550.54.15", "12.4"))
    assert got is False and "NVIDIA_REQUIRE_ARCH" in why


# ============================== bundle.json's cuda object, and hostile values
def test_needs_round_trip_and_hostile_values() -> None:
    needs = image("12.4.1-runtime-ubuntu22.04")
    assert needs_from_dict(needs.to_dict()) == needs
    assert needs_from_dict(None) is None and needs_from_dict([1]) is None
    odd = needs_from_dict({"cudaVersion": 12, "require": {"X": 1, "NVIDIA_REQUIRE_CUDA": "cuda>=x"},
                           "compatLibs": "550", "disableRequire": "yes", "torchCuda": None})
    assert odd == ImageNeeds(require={"NVIDIA_REQUIRE_CUDA": "cuda>=x"})
    assert cudafit.runtime_fit(odd, host(H100, "550.54.15", "12.4")).status == NO_CUDA
    assert decide(odd, host(H100, "550.54.15", "12.4")).status == UNFIT  # the toolkit refuses what it cannot parse
    # a legacy image whose CUDA_VERSION semver cannot parse (over 256 bytes): the hook fails every container
    too_long = decide(needs_from_env(["CUDA_VERSION=" + "9" * 5000]), host(H100, "550.54.15", "12.4"))
    assert too_long.status == UNFIT and "invalid CUDA version" in too_long.reason and too_long.image_cuda is None
    assert cudafit.parse_version("12." + "4" * 20) is None and cudafit.parse_version("12.4.1-1") == (12, 4, 1)
    assert needs_from_env(["NVIDIA_DISABLE_REQUIRE=false"]).disable_require is False
    assert needs_from_env(["NVIDIA_DISABLE_REQUIRE=true", 7, "junk"]).disable_require is True


def test_the_smoke_suite_carries_the_same_decision(tmp_path: Path) -> None:
    """The worker runs inside the image with only the suite's tree: cudafit travels with it."""
    root = write_tree(str(tmp_path / "t"))
    code = ("from importer.smoke.worker.compat import decide_compat; "
            "d = decide_compat(device='cuda', host_cuda=(11, 8), image_cuda=(12, 4), datacenter=True, "
            "compat_dir=None); print(d.status)")
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {root!r}); {code}"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "FAIL"
    assert cudafit.runtime_fit(ImageNeeds(cuda="12.4"), Target(cuda="11.8", gpus=(A100,))).status == UNFIT


def test_the_smoke_gate_reads_the_compat_libraries_version(tmp_path: Path) -> None:
    """Inside the image the suite names the compat libraries by their file: too old ones do not bridge."""
    from importer.smoke.worker.compat import MODE_FORWARD, compat_version, decide_compat

    old = tmp_path / "usr/local/cuda-12.8/compat"
    old.mkdir(parents=True)
    (old / "libcuda.so.1").write_bytes(b"")
    assert compat_version(str(old)) is None
    (old / "libcuda.so.550.54.15").write_bytes(b"")
    assert compat_version(str(old)) == "550.54.15"
    stale = decide_compat(device="cuda", host_cuda=(11, 4), image_cuda=(12, 8), datacenter=True, compat_dir=str(old))
    assert stale.status == "FAIL" and "too old" in stale.reason
    (old / "libcuda.so.570.124.06").write_bytes(b"")
    fresh = decide_compat(device="cuda", host_cuda=(11, 4), image_cuda=(12, 8), datacenter=True, compat_dir=str(old))
    assert (fresh.mode, fresh.status, fresh.use_compat_libs) == (MODE_FORWARD, "PASS", True)


# ============================== digits outside ASCII 0-9 are no version (issue 38, class 6)
HOSTILE = pytest.mark.parametrize("bad", list(HOSTILE_VERSIONS.values()), ids=list(HOSTILE_VERSIONS))


@HOSTILE
def test_a_version_with_non_ascii_digits_is_unparseable(bad: str) -> None:
    assert cudafit.parse_version(bad) is None and cudafit.major_minor(bad) is None
    assert cuda_of_driver(bad) is None
    assert cudafit.parse_version(f"v{bad}") is None and cudafit.parse_version(f" {bad} (r550)") is None


#: where a version comes from: (image env, host driver, host CUDA); "{v}" marks the value tried
SOURCES = {
    "CUDA_VERSION": (["CUDA_VERSION={v}"], "550.54.15", "12.4"),
    "NVIDIA_REQUIRE_CUDA cuda>=": (["NVIDIA_REQUIRE_CUDA=cuda>={v} brand=tesla,driver>=470,driver<471"], "550.54.15",
                                   "12.4"),
    "NVIDIA_REQUIRE_CUDA driver>=": (["CUDA_VERSION=12.2.0", "NVIDIA_REQUIRE_CUDA=driver>={v}"], "550.54.15", "12.4"),
    "driver version (nvidia-smi, NVML, inventory)": (["CUDA_VERSION=12.4.1"], "{v}", ""),
    "driver's CUDA version": (["CUDA_VERSION=12.4.1"], "550.54.15", "{v}"),
    "compat library": (["CUDA_VERSION=12.8.1"], "535.104.05", "12.2"),
}


@HOSTILE
@pytest.mark.parametrize("source", list(SOURCES))
def test_non_ascii_digits_decide_as_any_unparseable_value(source: str, bad: str) -> None:
    """Whatever carries the version, the decision is the one 'abc' in its place gives."""
    env, driver, cuda = SOURCES[source]

    def decision(value: str) -> cudafit.Fit:
        libs = (value,) if source == "compat library" else ()
        needs = needs_from_env([e.format(v=value) for e in env], compat_libs=libs, torch_cuda=None)
        target = Target(driver.format(v=value), cuda.format(v=value) or None, (H100,) * 2, "legacy")
        return decide(needs, target)

    got = decision(bad)
    assert replace(got, reason=got.reason.replace(bad, "abc")) == decision("abc")  # the reason quotes the value
    assert got.status in cudafit.STATUSES
    torch_only = needs_from_env([], torch_cuda=bad)
    assert torch_only.wanted() == (None, "") and decide(torch_only, host(H100, "550.54.15", "12.4")).status == NO_CUDA


@HOSTILE
def test_an_inventory_with_non_ascii_digits_reads_as_one_with_garbage(bad: str) -> None:
    def target(value: str) -> Target:
        return cudafit.target_from_gpu_doc({"driverVersion": value, "cudaDriverVersion": value,
                                            "gpus": [{"name": "NVIDIA H100", "computeCapability": value}]})

    needs = image("12.4.1-runtime-ubuntu22.04")
    assert target(bad).driver_cuda() is None
    got = decide(needs, target(bad))
    assert replace(got, reason=got.reason.replace(bad, "abc")) == decide(needs, target("abc"))
    at = host(H100, "550.54.15", "12.4")
    admitted, why = admission(ImageNeeds(require={"NVIDIA_REQUIRE_ARCH": f"arch>={bad}"}), at)
    assert (admitted, why.replace(bad, "abc")) == admission(ImageNeeds(require={"NVIDIA_REQUIRE_ARCH": "arch>=abc"}),
                                                            host(H100, "550.54.15", "12.4"))


# ============================== the toolkit's own decision, case for case (issue 39)
#: Each row: an image env, a host, and what the container toolkit does, with the source that
#: decides it. nvidia-container-toolkit: internal/config/image/cuda_image.go (CTK), the runtime
#: hook cmd/nvidia-container-runtime-hook/main.go (one --require per requirement), CSV mode
#: internal/modifier/csv.go + internal/requirements (REQ). libnvidia-container: src/cli/dsl.c
#: (DSL), src/cli/configure.c (CFG), src/driver.c (DRV). None: the toolkit checks nothing.
ORIN = GPU("Orin (nvgpu)", None, "8.7", None)
T4 = GPU("Tesla T4", "TESLA", "7.5", True)
R550, R535, R545 = host(H100, "550.54.15", "12.4"), host(H100, "535.104.05", "12.2"), host(L4, "545.23.08", "12.3")
GEFORCE = host(RTX4090, "535.104.05", "12.2", n=1)
JETSON6, JETSON5 = Target(None, "12.2", (ORIN,), "csv"), Target(None, "11.4", (ORIN,), "csv")
CUDA124 = cuda_env("12.4.1-runtime-ubuntu22.04")
#: nvcr.io/nvidia/pytorch:24.05-py3's CUDA env: NGC images require cuda>=9.0 and carry a
#: four-part CUDA_VERSION and an empty NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS
NGC_PYTORCH = ["CUDA_VERSION=12.4.1.003", "CUDA_DRIVER_VERSION=550.54.15", "NVIDIA_REQUIRE_CUDA=cuda>=9.0",
               "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=", "_CUDA_COMPAT_PATH=/usr/local/cuda/compat",
               "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video"]
#: L4T images (l4t-base, l4t-jetpack): the JetPack CSV request, no CUDA requirement
L4T_BASE = ["NVIDIA_REQUIRE_JETPACK=csv-mounts=all", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"]
L4T_CUDA = [*L4T_BASE, "CUDA_VERSION=12.2.12", "NVIDIA_REQUIRE_CUDA=cuda>=12.2"]
LONG_BRAND = "brand=" + "x" * 130


def req(value: str, key: str = "NVIDIA_REQUIRE_CUDA") -> list:
    return [f"{key}={value}"]


TOOLKIT = [
    # --- which requirements the toolkit passes on
    ("CTK:GetRequirements: nvidia/cuda 12.4.1 on r550 (cuda>=12.4 holds)", CUDA124, R550, True),
    ("DSL:dsl_evaluate ORs space groups: 12.4.1 on H100 r535 via brand=nvidia,driver>=535,driver<536",
     CUDA124, R535, True),
    ("DSL:dsl_evaluate: 12.4.1 on L4 r545 (no group holds)", CUDA124, R545, False),
    ("CTK:HasDisableRequire ParseBool('1') true", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=1"], R545, None),
    ("CTK:HasDisableRequire ParseBool('true') true", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=true"], R545, None),
    ("CTK:HasDisableRequire ParseBool('True') true", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=True"], R545, None),
    ("CTK:HasDisableRequire ParseBool('T') true", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=T"], R545, None),
    ("CTK:HasDisableRequire ParseBool('TRUE') true", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=TRUE"], R545, None),
    ("CTK:HasDisableRequire ParseBool('yes') errors: read false, checked", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=yes"],
     R545, False),
    ("CTK:HasDisableRequire ParseBool('on') errors: checked", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=on"], R545, False),
    ("CTK:HasDisableRequire ParseBool(' 1') errors: checked", [*CUDA124, "NVIDIA_DISABLE_REQUIRE= 1"], R545, False),
    ("CTK:HasDisableRequire ParseBool('') errors: checked", [*CUDA124, "NVIDIA_DISABLE_REQUIRE="], R545, False),
    ("CTK:HasDisableRequire ParseBool('false') false: checked", [*CUDA124, "NVIDIA_DISABLE_REQUIRE=false"], R545,
     False),
    ("CTK:IsLegacy: CUDA_VERSION alone adds cuda>=12.4 (L4 r545 refused)", ["CUDA_VERSION=12.4.1"], R545, False),
    ("CTK:IsLegacy: CUDA_VERSION alone adds cuda>=12.4 (r550 admitted)", ["CUDA_VERSION=12.4.1"], R550, True),
    ("CTK:IsLegacy: NVIDIA_REQUIRE_CUDA set but empty is still legacy", ["CUDA_VERSION=12.4.1", *req("")], R545,
     False),
    ("CTK:legacyVersion: semver takes v12.4", ["CUDA_VERSION=v12.4"], R550, True),
    ("CTK:legacyVersion: semver refuses 12.4.1.003: the hook fails every container",
     ["CUDA_VERSION=12.4.1.003"], host(H100, "575.51.03", "12.9"), False),
    ("CTK:IsLegacy false when NVIDIA_REQUIRE_CUDA is set: NGC PyTorch's cuda>=9.0 on r545", NGC_PYTORCH, R545, True),
    ("CTK:GetRequirements skips NVIDIA_REQUIRE_JETPACK: l4t-base on a dGPU host", L4T_BASE, R550, None),
    ("CTK:GetRequirements skips NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS (prefix)",
     [*req("cuda>=12.0"), "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=/a,/b"], R550, True),
    ("CTK:GetRequirements passes any other NVIDIA_REQUIRE_*: an unknown key is DSL:evaluate_rule invalid",
     req("foo>=1", "NVIDIA_REQUIRE_FOO"), R550, False),
    ("CTK:GetRequirements: an empty NVIDIA_REQUIRE_* (no CUDA_VERSION) is DSL:dsl_evaluate('') true",
     req("", "NVIDIA_REQUIRE_DRIVER"), R550, True),
    ("CFG:configure_command ANDs --require: one failing variable refuses",
     [*req("cuda>=12.0"), *req("arch>=9.0", "NVIDIA_REQUIRE_ARCH")], host(A100, "550.54.15", "12.4"), False),
    # --- operators and terms, src/cli/dsl.c
    ("DSL:evaluate_rule: '==' is no operator: invalid expression", req("cuda==12.4"), R550, False),
    ("DSL:evaluate_rule: '=<' is no operator", req("cuda=<12.4"), R550, False),
    ("DSL:evaluate_rule: '!=' on a brand", req("brand!=geforce"), R550, True),
    ("DSL:evaluate_rule: a lone '!' reads '!='", req("brand!geforcertx"), GEFORCE, False),
    ("DSL:evaluate_rule: '=' is equality", req("driver=550.54.15"), R550, True),
    ("DSL:evaluate_rule: '<' and '>'", req("driver>550,driver<551"), R550, True),
    ("DSL:evaluate_rule: an empty value is invalid", req("cuda>="), R550, False),
    ("DSL:evaluate_rule: keys ignore case (str_case_equal)", req("CUDA>=12.4"), R550, True),
    ("DSL:dsl_compare_string: brands ignore case", req("brand=NVIDIA"), R550, True),
    ("DSL:dsl_compare_string: brand>= is invalid", req("brand>=tesla"), R550, False),
    ("DSL:dsl_compare_version: a letter in the value is invalid", req("cuda>=12.4a"), R550, False),
    ("DSL:dsl_compare_version: trailing .0 parts compare equal", req("cuda>=12.4.0.0,driver=550.54.15.0"), R550,
     True),
    ("DSL:dsl_compare_version: a number strtoumax cannot hold is invalid", req("driver<18446744073709551615"), R550,
     False),
    ("DSL:dsl_evaluate: an invalid term after a satisfied group is never reached", req("cuda>=12.0 cuda==12.4"),
     R550, True),
    ("DSL:dsl_evaluate: an invalid term reached after a failed group fails", req("cuda>=13.0 cuda==12.4"), R550,
     False),
    ("DSL:dsl_evaluate: a group stops at its first false term (the invalid one after it unread)",
     req("cuda>=13.0,cuda==12.4 driver>=550"), R550, True),
    ("DSL:evaluate_rule: a failed term over EXPR_MAX bytes is invalid, even before a true group",
     req(f"{LONG_BRAND} cuda>=12.0"), R550, False),
    # --- the host's facts: src/driver.c, src/cli/configure.c
    ("DRV:driver_get_device_brand: GEFORCE_RTX is GeForceRTX", req("brand=geforcertx"), GEFORCE, True),
    ("DRV:driver_get_device_brand: NVIDIA (H100) is Nvidia, not Tesla", req("brand=tesla"), R550, False),
    ("DRV:driver_get_device_brand: Tesla T4", req("brand=tesla,driver>=470,driver<471"),
     host(T4, "470.82.01", "11.4"), True),
    ("DRV:driver_get_device_brand before libnvidia-container 1.9.0: NVIDIA is Unknown", req("brand=unknown"),
     replace(R550, cli_version="1.8.1"), True),
    ("DRV:driver_get_device_arch: compute capability 9.0", req("arch>=9.0"), R550, True),
    ("CFG:configure_command: every visible GPU must pass", req("brand=nvidia"),
     Target("550.54.15", "12.4", (H100, RTX4090), "legacy"), False),
    ("CFG:check_device_brand: no GPU visible, brand holds", req("brand=tesla"), Target("550.54.15", "12.4", (),
                                                                                      "legacy"), True),
    # --- modes
    ("modifier/mode.go: CDI mode checks nothing", CUDA124, replace(R545, toolkit_mode="cdi"), None),
    ("modifier/mode.go: jit-cdi mode checks nothing", CUDA124, replace(R545, toolkit_mode="jit-cdi"), None),
    ("REQ:csv.go checkRequirements: l4t-cuda on JetPack 6 (CUDA 12.2)", L4T_CUDA, JETSON6, True),
    ("REQ:csv.go checkRequirements: l4t-cuda on JetPack 5 (CUDA 11.4)", L4T_CUDA, JETSON5, False),
    ("REQ:csv.go: l4t-base needs nothing on JetPack 5", L4T_BASE, JETSON5, None),
    ("REQ:csv.go: brand and driver stay empty: nvidia/cuda's brand groups never hold on Jetson",
     req("cuda>=12.4 brand=tesla,driver>=470,driver<471"), JETSON6, False),
    ("REQ:factory.parse: property names are case-sensitive, CUDA skipped", req("CUDA>=99.0"), JETSON6, True),
    ("REQ:factory.parse: '==' leaves '=12.2', no semver", req("cuda==12.2"), JETSON6, False),
]


@pytest.mark.parametrize(("env", "target", "admitted"), [t[1:] for t in TOOLKIT], ids=[t[0] for t in TOOLKIT])
def test_admission_is_the_toolkits(env: list, target: Target, admitted: Optional[bool]) -> None:
    got, why = admission(needs_from_env(env), target)
    assert got is admitted, why


def test_the_refusal_reads_as_the_toolkits() -> None:
    _, why = admission(needs_from_env(CUDA124), R545)
    assert "requirement error: unsatisfied condition: cuda>=12.4, please update your driver" in why
    assert "invalid expression" in admission(needs_from_env(req("cuda==12.4")), R550)[1]
    assert "invalid CUDA version 12.4.1.003" in admission(needs_from_env(["CUDA_VERSION=12.4.1.003"]), R550)[1]
    fit = decide(needs_from_env(req("cuda==12.4")), R550)
    assert fit.status == UNFIT and "no driver fits" in fit.reason


def test_a_fact_the_inventory_lacks_is_no_verdict() -> None:
    """Brand or compute capability unrecorded: admitted only when every value would admit it."""
    blind = Target("550.54.15", "12.4", (GPU("NVIDIA H100", None, None, True),), "legacy")
    assert admission(needs_from_env(CUDA124), blind)[0] is True  # cuda>=12.4 holds whatever the brand
    assert admission(needs_from_env(req("arch>=8.0")), blind)[0] is None
    assert admission(needs_from_env(req("brand=tesla cuda>=13.0")), blind)[0] is None
    assert admission(needs_from_env(req("brand>=tesla")), blind)[0] is False  # invalid whatever the brand
    fit = decide(needs_from_env([*CUDA124, *req("arch>=8.0", "NVIDIA_REQUIRE_ARCH")]), blind)
    assert fit.admitted is None and any("turns on" in c for c in fit.caveats) and fit.status == FITS


def test_go_parse_bool_and_semver() -> None:
    assert [cudafit.go_parse_bool(v) for v in ("1", "t", "T", "TRUE", "true", "True")] == [True] * 6
    assert [cudafit.go_parse_bool(v) for v in ("0", "f", "F", "FALSE", "false", "False")] == [False] * 6
    assert [cudafit.go_parse_bool(v) for v in ("yes", "on", "", " 1", "tRUE", "y")] == [None] * 6
    assert cudafit.go_semver("12.4.1")[:3] == (12, 4, 1) and cudafit.go_semver("v12")[:3] == (12, 0, 0)
    assert cudafit.go_semver("12.04.1")[:2] == (12, 4)  # coerced: leading zeros allowed
    assert cudafit.go_semver("12.4.1-rc.1") is not None and cudafit.go_semver("12.4.1-rc.01") is None
    assert cudafit.go_semver("12.4.1.003") is None and cudafit.go_semver("9" * 257) is None
    assert cudafit.go_semver("99999999999999999999") is None  # ParseUint(.., 64) overflows
