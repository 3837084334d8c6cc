"""Import preflight against nearly full file systems made here (tmpfs mounts): the temp dir
(TMPDIR) and the engine's data root (a private dockerd whose --data-root is a small tmpfs).
A failed preflight names the needed and available bytes and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from importer.format.manifest import load_bundle_manifest
from importer.pipeline.preflight import DATA_ROOT_MARGIN, TEMP_NEED, data_root_need, layer_bytes, vfs_bytes
from tests.kit import engines
from tests.kit.helpers import run_pyz
from tests.kit.trustkit import (
    SEC_REFS,
    build_sec_images,
    engine_listing,
    error_id,
    export_bundle,
    remove_images,
    staging_tags,
    tagged_images_verify,
)

pytestmark = pytest.mark.engine


# ============================================================================ the rule


def test_space_rule_counts_the_archive_twice_and_vfs_chains(tmp_path: Path) -> None:
    from tests.kit.bundlegen import make_bundle

    b = make_bundle(tmp_path / "b")
    m = load_bundle_manifest((b / "bundle.json").read_bytes())
    base, app = m.images
    layers = {x.diff_id: x.uncompressed_size for x in m.unique_layers()}
    configs = base.config.size + app.config.size
    assert layer_bytes(m.images) == sum(layers.values()) + configs
    assert data_root_need(m.images, "overlay2") == 2 * layer_bytes(m.images)
    # vfs: every chain prefix stored as a full copy; base's chains are app's first two
    sizes = [x.uncompressed_size for x in app.layers]
    assert vfs_bytes(m.images) == sizes[0] + (sizes[0] + sizes[1]) + sum(sizes)
    assert data_root_need(m.images, "vfs") == layer_bytes(m.images) + vfs_bytes(m.images)


# ============================================================================ tmpfs fixtures


def _mount_tmpfs(path: Path, size: str) -> None:
    engines.require_root("mounting a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        engines.unavailable(f"cannot mount a tmpfs at {path}: {proc.stderr.strip()}")


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(path: Path, leave: int) -> Path:
    """A file that leaves about ``leave`` bytes available on path's file system."""
    filler = path / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        while _free(path) - len(chunk) > leave:
            f.write(chunk)
            f.flush()
        rest = _free(path) - leave
        if rest > 0:
            f.write(b"\0" * rest)
    return filler


@pytest.fixture(scope="module")
def sec_bundle(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    build_sec_images(docker_host, busybox, tmp_path_factory.mktemp("ctx"))
    return export_bundle(docker_host, tmp_path_factory.mktemp("b") / "sec.bundle")


@pytest.fixture
def small_tmp(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    _mount_tmpfs(mnt, "20m")
    try:
        yield mnt
    finally:
        _umount(mnt)


def test_full_temp_dir_fails_preflight_and_changes_nothing(docker_host: str, sec_bundle: Path, small_tmp: Path,
                                                           tmp_path: Path) -> None:
    remove_images(docker_host)
    filler = _fill(small_tmp, 1 << 20)
    before = engine_listing(docker_host)
    receipt = tmp_path / "r.json"
    proc = run_pyz(sec_bundle, "--docker-host", docker_host, "--receipt", str(receipt),
                        env={"TMPDIR": str(small_tmp)})
    assert proc.returncode == 6 and error_id(proc.stderr) == "insufficient-space", proc.stderr
    assert str(small_tmp) in proc.stderr and "importer temp files" in proc.stderr
    need = TEMP_NEED
    assert f"need 4.0 MiB ({need} bytes)" in proc.stderr
    available = int(proc.stderr.split("available ")[1].split("(")[1].split(" bytes")[0])
    assert 0 < available <= (1 << 20) + (64 << 10)
    assert engine_listing(docker_host) == before
    doc = json.loads(receipt.read_text())
    assert doc["result"] == "fail" and doc["error"]["id"] == "insufficient-space"
    space = [c for c in doc["preflight"]["checks"] if c["name"] == "space" and not c["ok"]]
    assert space and space[0]["needBytes"] == need and space[0]["availableBytes"] == available
    filler.unlink()  # with room, the same import goes through
    proc = run_pyz(sec_bundle, "--docker-host", docker_host, "--no-receipt", env={"TMPDIR": str(small_tmp)})
    assert proc.returncode == 0, proc.stderr
    assert sorted(tagged_images_verify(docker_host, sec_bundle)) == sorted(SEC_REFS)


@pytest.fixture
def tmpfs_engine(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A private dockerd (vfs) whose --data-root is a 96 MiB tmpfs made here."""
    engines.require_root("starting a private dockerd")
    for tool in ("dockerd", "containerd", "runc", "docker"):
        engines.require(tool)
    mnt = tmp_path / "data-root"
    _mount_tmpfs(mnt, "96m")
    name = f"sec-tmpfs-{uuid.uuid4().hex[:6]}"
    try:
        try:
            url = engines.start_dockerd(name, "--storage-driver", "vfs", "--data-root", str(mnt), fresh=True)
        except engines.EngineError as e:
            engines.unavailable(f"could not start a dockerd on a tmpfs data root: {e}")
        try:
            yield url, mnt
        finally:
            engines.stop_dockerd(name, purge=True)
    finally:
        _umount(mnt)


def test_nearly_full_engine_data_root_fails_preflight(tmpfs_engine: tuple[str, Path], sec_bundle: Path,
                                                      tmp_path: Path) -> None:
    url, mnt = tmpfs_engine
    info = json.loads(subprocess.run(["docker", "-H", url, "info", "--format", "{{json .}}"], capture_output=True,
                                     text=True, check=True).stdout)
    assert info["DockerRootDir"] == str(mnt) and info["Driver"] == "vfs"
    m = load_bundle_manifest((sec_bundle / "bundle.json").read_bytes())
    need = data_root_need(m.images, "vfs") + DATA_ROOT_MARGIN
    filler = _fill(mnt, need - (1 << 20))
    before = engine_listing(url)
    receipt = tmp_path / "r.json"
    proc = run_pyz(sec_bundle, "--docker-host", url, "--receipt", str(receipt))
    assert proc.returncode == 6 and error_id(proc.stderr) == "insufficient-space", proc.stderr
    assert f"{mnt} (engine data root" in proc.stderr and f"({need} bytes)" in proc.stderr
    assert "hint: nothing was changed" in proc.stderr
    assert engine_listing(url) == before == []
    check = next(c for c in json.loads(receipt.read_text())["preflight"]["checks"]
                 if c["name"] == "space" and str(mnt) in c["paths"])
    assert check["needBytes"] == need and check["availableBytes"] < need
    # with the room the rule asks for, the import goes through, and uses no more than that
    filler.unlink()
    used_before = _free(mnt)
    proc = run_pyz(sec_bundle, "--docker-host", url, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert sorted(tagged_images_verify(url, sec_bundle)) == sorted(SEC_REFS)
    assert used_before - _free(mnt) <= need - DATA_ROOT_MARGIN
    assert not staging_tags(url)
