"""The offline side fills the site's registry for Docker 20.10 nodes by itself (issue 40, point 2):
`bundle-import BUNDLE --engine registry --compression gzip` recompresses a default (zstd) bundle's
layers on the way (each diff_id checked, as `bundle push` and `serve --compression` do), the
receipt says so, and Docker 20.10 pulls the images with their IDs as built. Its notes never send
the far side to the online tool.

Engines: docker-registry on 127.0.0.1, Docker 20.10 (``docker_host``, an engine that reads no zstd)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from tests.kit import engines
from tests.kit.clijson import validate
from tests.kit.helpers import docker, image_facts, run_pyz
from tests.kit.transferkit import random_bundle
from tests.kit.trustkit import error_id

OCI_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


@pytest.fixture(scope="module")
def zstd_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A default bundle: zstd layers, two images sharing a base layer."""
    return random_bundle(tmp_path_factory.mktemp("offline") / "carry.bundle", mb=(1, 1), compression="zstd", seed=40)


@pytest.mark.engine
def test_offline_gzip_import_is_pulled_by_docker_20(zstd_bundle: Path, docker_host: str, tmp_path: Path) -> None:
    doc = json.loads((zstd_bundle / "bundle.json").read_text())
    with engines.private_registry(f"offline-{os.getpid()}") as reg:
        receipt = tmp_path / "r.json"
        proc = run_pyz(zstd_bundle, "--engine", "registry", "--registry", f"{reg.addr}/site", "--compression", "gzip",
                       "--receipt", str(receipt), "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        validate("import", out)
        assert out == json.loads(receipt.read_text())
        push = out["push"]
        assert push["compression"] == "gzip"
        renamed = push["renamedManifests"]
        assert "bundle push" not in proc.stderr and "cannot pull them" not in proc.stderr, proc.stderr
        for image in doc["images"]:
            pushed = next(r for r in push["images"] if r["ref"] == image["refs"][0])
            assert pushed["manifestDigest"] == renamed[image["manifest"]["digest"]] != image["manifest"]["digest"]
            assert pushed["configDigest"] == image["config"]["digest"] and pushed["readBack"]["ok"]
            req = urllib.request.Request(f"http://{reg.addr}/v2/{pushed['repository']}/manifests/{pushed['tag']}",
                                         headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                manifest = json.loads(r.read())
            assert [x["mediaType"] for x in manifest["layers"]] == [OCI_GZIP] * len(image["layers"])
            docker(docker_host, "image", "rm", image["config"]["digest"], check=False)
            pulled = docker(docker_host, "pull", pushed["pushedTo"], check=False)  # 127.0.0.0/8: insecure
            assert pulled.returncode == 0, pulled.stderr
            facts = image_facts(docker_host, pushed["pushedTo"])
            assert facts is not None and facts[0] == image["config"]["digest"]  # the image ID as built
            assert facts[1] == [layer["diffId"] for layer in image["layers"]]
            docker(docker_host, "image", "rm", pushed["pushedTo"], check=False)
        again = run_pyz(zstd_bundle, "--engine", "registry", "--registry", f"{reg.addr}/site", "--compression",
                        "gzip", "--no-receipt", "--json")  # the same bytes again: nothing to send, nothing moved
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["push"]["blobs"]["uploaded"] == 0
        kept = run_pyz(zstd_bundle, "--engine", "registry", "--registry", f"{reg.addr}/kept", "--no-receipt")
        assert kept.returncode == 0, kept.stderr
        assert "Docker before 23.0 cannot pull them" in kept.stderr and "--compression gzip" in kept.stderr
        assert "bundle push" not in kept.stderr  # the far side has no online tool


def test_compression_is_for_the_registry_engine_only(zstd_bundle: Path, tmp_path: Path) -> None:
    proc = run_pyz(zstd_bundle, "--engine", "oci", "--oci-dir", str(tmp_path / "out"), "--compression", "gzip")
    assert proc.returncode == 2 and error_id(proc.stderr) == "usage", proc.stderr
    assert "--engine registry" in proc.stderr and not (tmp_path / "out").exists()
