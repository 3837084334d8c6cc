"""The containerd sink against a real standalone containerd (docker/scripts/containerd.sh):
the naming trap, the Docker-containerd-store identity rule, snapshot checks, snapshotter choice
and engine detection on a Kubernetes-style node. Uses the engine-free bundle of
tests/kit/bundlegen.py, so no dockerd is needed."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from importer.errors import EngineNotChosen
from importer.format.identity import chain_ids, docker_archive_manifest_digest
from importer.sinks.choose import EngineOptions, choose_sink
from importer.sinks.dockerarchive import write_docker_archive
from importer.sinks.ociarchive import write_oci_archive
from importer.verify.bundle import verify_bundle
from tests.kit.engine_stores import ctr
from tests.kit.helpers import run_cli

pytestmark = pytest.mark.engine


def _images(bundle: Path) -> list:  # type: ignore[type-arg]
    manifest = verify_bundle(str(bundle)).manifest
    assert manifest is not None
    return list(manifest.images)


def _import(sock: str, namespace: str, archive: bytes, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", "--address", sock, "--namespace", namespace, "images", "import", *extra, "-"],
                          input=archive.decode("latin-1"), capture_output=True, text=True, encoding="latin-1",
                          timeout=300, check=False)


def _importer(bundle: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("importer", str(bundle), *args, env={"SNEAKERNET_LOCK_DIR": str(tmp / "locks")},
                   drop_env=("DOCKER_", "CONTAINERD_"), timeout=600)


def test_an_oci_archive_without_ref_names_imports_nothing_and_exits_0(containerd_address: str,
                                                                      pristine: Path) -> None:
    """Why the sink names every entry: containerd 1.6 silently skips unnamed index entries."""
    images = _images(pristine)
    named = io.BytesIO()
    write_oci_archive(named, str(pristine), [(img, f"docker.io/{img.refs[0]}") for img in images])
    unnamed = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(named.getvalue())) as src, tarfile.open(fileobj=unnamed, mode="w") as dst:
        for member in src:
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == "index.json":
                index = json.loads(data)
                for entry in index["manifests"]:
                    entry.pop("annotations")
                data = json.dumps(index).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    proc = _import(containerd_address, "trap", unnamed.getvalue())
    assert proc.returncode == 0, proc.stderr
    assert ctr(containerd_address, "trap", "images", "ls", "-q").split() == []
    proc = _import(containerd_address, "trap", named.getvalue())
    assert proc.returncode == 0, proc.stderr
    assert sorted(ctr(containerd_address, "trap", "images", "ls", "-q").split()) == [
        "docker.io/fake/app:2", "docker.io/fake/base:1"]


def test_a_docker_archive_load_gets_the_predicted_manifest_digest(containerd_address: str,
                                                                  pristine: Path) -> None:
    """Docker's containerd image store loads a docker-archive through this importer of
    containerd: the image ID (manifest digest) is predictable from bundle.json."""
    images = _images(pristine)
    archive = io.BytesIO()
    write_docker_archive(archive, str(pristine), images, with_tags=True)
    proc = _import(containerd_address, "docker-like", archive.getvalue(), "--no-unpack")
    assert proc.returncode == 0, proc.stderr
    listed = ctr(containerd_address, "docker-like", "images", "ls").splitlines()[1:]
    digests = {line.split()[0]: line.split()[2] for line in listed}
    for image in images:
        assert digests[f"docker.io/{image.refs[0]}"] == docker_archive_manifest_digest(image)


def test_import_into_k8s_namespace_keeps_the_bundle_manifest(containerd_address: str, pristine: Path,
                                                             tmp_path: Path) -> None:
    proc = _importer(pristine, "--engine", "containerd", "--address", containerd_address, "--namespace", "k8s.io",
                     "--snapshotter", "native", "--json", "--no-receipt", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt["engine"]["imageStore"] == "oci" and receipt["engine"]["namespace"] == "k8s.io"
    images = {img.refs[0]: img for img in _images(pristine)}
    for check in receipt["images"]:
        image = images[check["refs"][0]]
        assert check["identityRule"] == "manifest-digest" and check["idVerified"] is True
        assert check["found"]["imageId"] == str(image.manifest.digest)
        assert check["found"]["configDigest"] == str(image.config.digest)
        assert check["tagsApplied"] == list(image.refs)
    listed = ctr(containerd_address, "k8s.io", "images", "ls").splitlines()[1:]
    names = {line.split()[0]: line.split()[2] for line in listed}  # the session's other tests share k8s.io
    for ref, image in images.items():
        assert names[f"docker.io/{ref}"] == str(image.manifest.digest)
    snapshots = ctr(containerd_address, "k8s.io", "snapshots", "--snapshotter", "native", "ls")
    for image in images.values():
        for chain in chain_ids([str(x.diff_id) for x in image.layers]):
            assert chain in snapshots


def test_a_missing_snapshot_is_reported_and_repaired(containerd_address: str, pristine: Path,
                                                     tmp_path: Path) -> None:
    args = ("--engine", "containerd", "--address", containerd_address, "--namespace", "snapcheck",
            "--snapshotter", "native", "--json", "--no-receipt")
    assert _importer(pristine, *args, tmp=tmp_path).returncode == 0
    app = next(img for img in _images(pristine) if img.refs == ("fake/app:2",))
    top = chain_ids([str(x.diff_id) for x in app.layers])[-1]
    ctr(containerd_address, "snapcheck", "snapshots", "--snapshotter", "native", "rm", top)
    inventory = run_cli("importer", "--inventory", *args[:8], timeout=300)
    assert inventory.returncode == 0, inventory.stderr
    entry = next(i for i in json.loads(inventory.stdout)["images"] if "docker.io/fake/app:2" in i["names"])
    assert entry["problems"] == ["not unpacked in snapshotter native"]
    proc = _importer(pristine, *args, tmp=tmp_path)  # found incomplete: imported (unpacked) again
    assert proc.returncode == 0, proc.stderr
    statuses = {c["refs"][0]: c["status"] for c in json.loads(proc.stdout)["images"]}
    assert statuses == {"fake/base:1": "already-present", "fake/app:2": "loaded"}
    assert top in ctr(containerd_address, "snapcheck", "snapshots", "--snapshotter", "native", "ls")


def test_an_unknown_snapshotter_is_refused_with_the_usable_ones(containerd_address: str, pristine: Path,
                                                                tmp_path: Path) -> None:
    proc = _importer(pristine, "--address", containerd_address, "--snapshotter", "zfs-nope", "--no-receipt",
                     tmp=tmp_path)
    assert proc.returncode == 6, proc.stderr
    assert "error[engine-unavailable]" in proc.stderr and "zfs-nope" in proc.stderr
    assert "native" in proc.stderr and "overlayfs" in proc.stderr


def test_detection_names_containerd_and_its_k8s_namespace(containerd_address: str,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    for name in ("DOCKER_HOST", "CONTAINERD_ADDRESS", "CONTAINERD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    if "k8s.io" not in ctr(containerd_address, "default", "namespaces", "ls", "-q").split():
        ctr(containerd_address, "default", "namespaces", "create", "k8s.io", timeout=60)
    with pytest.raises(EngineNotChosen) as e:  # found, and said, but never chosen silently
        choose_sink(EngineOptions(), docker_socket=str(tmp_path / "no-docker.sock"),
                    containerd_socket=containerd_address, which=lambda name: name if name != "podman" else None)
    assert e.value.message.endswith(
        f"found containerd on {containerd_address} (namespace k8s.io exists: a Kubernetes node) answering instead")
    assert e.value.hint == ("name the engine to load into: "
                            f"--engine containerd --address {containerd_address} --namespace k8s.io")
