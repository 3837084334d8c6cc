"""importer/input/cudascan.py: what a layer's tar stream shows of CUDA, fed in arbitrary chunks,
and hostile streams it must survive without raising (the layer's bytes are checked elsewhere)."""

from __future__ import annotations

import io
import random
import tarfile
from typing import List, Tuple

import pytest

from importer.input.cudascan import CudaScan

TORCH_PY = b"from typing import Optional\n\n__version__ = '2.5.1+cu124'\ndebug = False\ncuda: Optional[str] = '12.4'\n"
OLD_TORCH_PY = b"__version__ = '1.13.1+cu117'\ndebug = False\ncuda = '11.7'\ngit_version = 'abc'\n"


def _tar(members: List[Tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT, links: Tuple[str, ...] = ()) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = "libcuda.so.550.54.15"
            tar.addfile(info)
    return out.getvalue()


def _scan(data: bytes, seed: int = 0) -> CudaScan:
    rng = random.Random(seed)
    scan = CudaScan()
    i = 0
    while i < len(data):
        n = rng.choice([1, 7, 511, 512, 513, 4096, 1 << 20])
        scan.feed(data[i:i + n])
        i += n
    return scan


LONG = "usr/local/lib/" + "x" * 120 + "/python3.11/site-packages/torch/version.py"


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compat_libs_and_torch_cuda_in_any_chunking(fmt: int, seed: int) -> None:
    members = [("usr/local/cuda-12.4/compat/libcuda.so.550.54.15", b"\x7fELF" * 300),
               ("usr/local/cuda-12.4/compat/libcudadebugger.so.1", b"x"),
               ("big.bin", random.Random(seed).randbytes(3 * 512 + 17)),
               ("usr/local/lib/python3.10/dist-packages/torch/version.py", TORCH_PY)]
    data = _tar(members, fmt, links=("usr/local/cuda-12.4/compat/libcuda.so.1",))
    assert _scan(data, seed).result() == (("550.54.15",), "12.4")


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_long_names_through_pax_and_gnu_records(fmt: int) -> None:
    data = _tar([(LONG, OLD_TORCH_PY)], fmt)
    assert _scan(data).result() == ((), "11.7")


def test_what_does_not_count() -> None:
    data = _tar([("opt/cuda-12.4/compat/libcuda.so.550.54.15", b""),  # not /usr/local
                 ("usr/local/cuda/compat/libcuda.so.1", b""),  # the soname carries no version
                 ("torch/version.py", TORCH_PY),  # not inside site-packages
                 ("usr/lib/python3/dist-packages/torch/version.py", b"cuda = None\n")])
    assert _scan(data).result() == ((), None)


@pytest.mark.parametrize("mangle", [
    lambda d: d[:700],  # truncated inside a member
    lambda d: b"\xff" * 512 + d,  # garbage where a header should be
    lambda d: d[:148] + b"99999999" + d[156:],  # a bad header checksum
    lambda d: d[:124] + b"7777777777777777" + d[140:],  # a huge size field (and a bad checksum)
    lambda d: b"",
    lambda d: bytes(random.Random(5).randbytes(5000)),
])
def test_hostile_streams_end_the_scan_quietly(mangle) -> None:  # type: ignore[no-untyped-def]
    data = _tar([("usr/local/cuda-12.4/compat/libcuda.so.550.54.15", b"x" * 600)], tarfile.USTAR_FORMAT)
    libs, torch = _scan(mangle(data)).result()
    assert torch is None and libs in ((), ("550.54.15",))


def test_an_oversized_version_py_is_not_kept() -> None:
    big = TORCH_PY + b"#" * (70 * 1024)
    assert _scan(_tar([("a/site-packages/torch/version.py", big)])).result() == ((), None)
