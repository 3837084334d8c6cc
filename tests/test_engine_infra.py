"""The engine test infrastructure itself: private dockerds, image builds, skip/fail policy."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.kit import engines
from tests.kit.imagegen import layered_context


def _scratch_context(tmp_path: Path, busybox: str) -> Path:
    return layered_context(tmp_path / "ctx", busybox=busybox,
                           steps=['RUN ["/bin/busybox", "--install", "-s", "/bin"]', "RUN echo hi > /a"])


@pytest.mark.engine
@pytest.mark.parametrize("host_fixture", ["docker_host", "docker_host_vfs", "docker_host_ctrstore"])
def test_build_scratch_image(
    request: pytest.FixtureRequest, host_fixture: str, busybox: str, tmp_path: Path
) -> None:
    host = request.getfixturevalue(host_fixture)
    tag = f"sneakernet-test/infra:{host_fixture.replace('_', '-')}"
    image_id = engines.build_image(host, _scratch_context(tmp_path, busybox), tag)
    assert image_id.startswith("sha256:")

    info = json.loads(engines.docker(host, "image", "inspect", tag))[0]
    assert info["Id"] == image_id
    assert tag in info["RepoTags"]
    assert len(info["RootFS"]["Layers"]) == 3  # COPY + 2 x RUN

    out = engines.docker(
        host, "run", "--rm", "--pull", "never", "--network", "none", tag, "cat", "/a"
    )
    assert out == "hi\n"


@pytest.mark.engine
def test_containerd_store_dockerd(docker_host_ctrstore: str) -> None:
    """Debian 13's dockerd 26 with the containerd image store, loopback only."""
    info = json.loads(engines.docker(docker_host_ctrstore, "info", "--format", "{{json .}}"))
    assert info["ServerVersion"].startswith("26.")
    assert ["driver-type", "io.containerd.snapshotter.v1"] in info["DriverStatus"]
    drivers = engines.docker(docker_host_ctrstore, "network", "ls", "--format", "{{.Driver}}")
    assert "bridge" not in drivers.split()
    # Its own managed containerd answers under the exec-root, namespace moby.
    out = engines._run([*engines.ctrstore_ctr(docker_host_ctrstore), "version"], timeout=30)
    assert "1.7." in out.stdout


@pytest.mark.engine
def test_two_dockerds_side_by_side(docker_host: str, docker_host_vfs: str) -> None:
    assert docker_host != docker_host_vfs
    fmt = "{{json .}}"
    with ThreadPoolExecutor(max_workers=2) as pool:
        infos = list(
            pool.map(
                lambda h: json.loads(engines.docker(h, "info", "--format", fmt)),
                [docker_host, docker_host_vfs],
            )
        )
    overlay, vfs = infos
    assert overlay["Driver"] == "overlay2"
    assert vfs["Driver"] == "vfs"
    assert overlay["DockerRootDir"] != vfs["DockerRootDir"]
    for host in (docker_host, docker_host_vfs):
        # loopback-only daemons: no bridge network exists
        drivers = engines.docker(host, "network", "ls", "--format", "{{.Driver}}").split()
        assert "bridge" not in drivers


def test_static_elf_detection(busybox: str) -> None:
    assert engines.is_static_elf(busybox)
    python = Path(sys.executable).resolve()
    assert not engines.is_static_elf(__file__)  # not ELF at all
    # CPython builds are normally dynamically linked; only assert when it has an interpreter
    if b"ld-linux" in python.read_bytes()[:4096]:
        assert not engines.is_static_elf(python)


def test_unavailable_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"install-deps\.sh"):
        engines.require("sneakernet-no-such-tool")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="sneakernet-no-such-tool"):
        engines.require("sneakernet-no-such-tool")
    assert engines.require("sh").endswith("/sh")
