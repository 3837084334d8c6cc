"""`bundle copy SRC DST` (issue 5): a folder, a tar or parts copied to a destination folder,
skipping what is already there with the right digest, resuming a file cut short (even by
SIGKILL), ending with a verification of the copy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.kit.helpers import run_cli, run_zipapp, start_cli
from tests.kit.transferkit import random_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_bundle(tmp_path_factory.mktemp("copy") / "carry.bundle", mb=(8, 2))


def _copy(src: Path, dst: Path, *extra: str) -> dict:
    proc = run_cli("bundle", "copy", str(src), str(dst), "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_copy_a_folder_then_again_skips_everything(bundle: Path, tmp_path: Path) -> None:
    first = _copy(bundle, tmp_path / "dst")
    assert first["kind"] == "folder" and first["verification"]["ok"] and not first["skipped"]
    assert first["copied"][-1] == "bundle.json"  # bundle.json last: a half copy is not a bundle
    again = _copy(bundle, tmp_path / "dst")
    assert again["copied"] == [] and again["resumed"] == [] and again["bytesCopied"] == 0
    assert sorted(again["skipped"]) == sorted(first["copied"])


def test_a_wrong_file_at_the_destination_is_copied_again(bundle: Path, tmp_path: Path) -> None:
    _copy(bundle, tmp_path / "dst")
    layer = max((tmp_path / "dst" / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(layer.read_bytes())
    data[100] ^= 1
    layer.write_bytes(bytes(data))  # same size, other bytes
    out = _copy(bundle, tmp_path / "dst")
    assert out["copied"] == [f"blobs/sha256/{layer.name}"]


def test_copy_parts_and_a_tar(bundle: Path, tmp_path: Path) -> None:
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "src" / "c.tar"), "--split", "3M", check=True)
    out = _copy(tmp_path / "src" / "c.tar.parts.json", tmp_path / "dst")
    assert out["kind"] == "parts" and out["bundle"] == str(tmp_path / "dst" / "c.tar.parts.json")
    assert out["copied"][-1] == "c.tar.parts.json" and "bundle-import.pyz" in out["copied"]
    assert out["verification"]["ok"] and out["verification"]["layersChecked"] == 2
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "src2" / "one.tar"), check=True)
    out = _copy(tmp_path / "src2" / "one.tar", tmp_path / "dst2")
    assert out["kind"] == "tar" and sorted(out["copied"]) == ["bundle-import.pyz", "one.tar"]
    again = _copy(tmp_path / "src2" / "one.tar", tmp_path / "dst2")
    assert sorted(again["skipped"]) == ["bundle-import.pyz", "one.tar"]


def _kill_mid_copy(src: Path, dst: Path) -> str:
    """Start a throttled copy, SIGKILL it while a file is half written; return that file."""
    proc = start_cli("bundle", "copy", str(src), str(dst), "--bwlimit", "4M", "-q", stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            partial = [p for p in dst.rglob("*.partial") if p.stat().st_size > 1024 * 1024] if dst.exists() else []
            if partial:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return str(partial[0].relative_to(dst))[: -len(".partial")]
            time.sleep(0.05)
        raise AssertionError("the copy never got half way through a file")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("kind", ["folder", "parts"])
def test_an_interrupted_copy_is_finished_by_running_it_again(bundle: Path, tmp_path: Path, kind: str) -> None:
    src = bundle
    if kind == "parts":
        run_cli("bundle", "pack", str(bundle), str(tmp_path / "src" / "c.tar"), "--split", "6M", check=True)
        src = tmp_path / "src" / "c.tar.parts.json"
    dst = tmp_path / "dst"
    cut = _kill_mid_copy(src, dst)
    assert (dst / (cut + ".partial")).exists() and not (dst / cut).exists()
    out = _copy(src, dst)
    assert cut in out["resumed"], out
    assert out["verification"]["ok"]
    assert not list(dst.rglob("*.partial"))
    assert out["bytesCopied"] < sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())


def test_the_importer_copies_too_on_the_far_side(bundle: Path, tmp_path: Path) -> None:
    """Only python3 and the bundle-import.pyz beside the parts: `bundle-import.pyz copy SRC DST`."""
    usb = tmp_path / "usb"
    run_cli("bundle", "pack", str(bundle), str(usb / "c.tar"), "--split", "4M", check=True)
    proc = run_zipapp(usb / "bundle-import.pyz", "copy", str(usb / "c.tar.parts.json"), str(tmp_path / "disk"),
                      "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verification"]["ok"] and out["bundle"] == str(tmp_path / "disk" / "c.tar.parts.json")
