"""Schema 1 and 2 bundles (one docker-archive) import into every engine that loads a
docker-archive (Docker, podman, containerd) under the same rules as schema 3: the engine lock,
the space preflight, verification first, tag conflicts refused, the post-load check. Engines
without such a loader (an OCI layout, a registry) refuse them before anything is read."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import jsonschema
import pytest

from importer.pipeline.lock import engine_lock
from tests.kit import engines
from tests.kit.engine_stores import ctr
from tests.kit.helpers import REPO, docker, image_facts, run_cli
from tests.kit.imagegen import simple_context

pytestmark = pytest.mark.engine
GOLDEN = Path(__file__).resolve().parent / "golden" / "bundles"
REFS = ("fake/base:1", "fake/app:2")


def _golden(version: str, tmp_path: Path) -> tuple[Path, dict]:
    bundle = tmp_path / version
    shutil.copytree(GOLDEN / version, bundle)
    doc = json.loads((bundle / "bundle.json").read_text())
    return bundle, {i["refs"][0]: i for i in doc["images"]}


def _import(bundle: Path, *args: str, receipt: Path | None = None) -> object:
    out = ["--receipt", str(receipt)] if receipt else ["--no-receipt"]
    return run_cli("importer", str(bundle), "--verify", *args, *out)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_legacy_bundle_imports_into_containerd(version: str, containerd_address: str, tmp_path: Path) -> None:
    bundle, images = _golden(version, tmp_path)
    ns = f"legacy-{version}-{uuid.uuid4().hex[:6]}"
    args = ("--engine", "containerd", "--address", containerd_address, "--namespace", ns, "--snapshotter", "native")
    receipt = tmp_path / "r.json"
    proc = _import(bundle, *args, "--deep", receipt=receipt)
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    doc = json.loads(receipt.read_text())
    assert doc["result"] == "pass" and doc["engine"]["kind"] == "containerd"
    schema = json.loads((REPO / "schemas" / "receipt" / "import-v1.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    for image in doc["images"]:
        assert image["identityRule"] == "config-digest+diff-ids" and image["result"] == "match"
        assert image["deep"]["ok"] is True and len(image["deep"]["layers"]) == len(image["expected"]["diffIds"])
    for ref in REFS:
        full = f"docker.io/{ref}"
        check = ctr(containerd_address, ns, "images", "check", "--snapshotter", "native", f"name=={full}")
        assert "complete (" in check and check.split()[-1] == "true", check
        manifest = json.loads(ctr(containerd_address, ns, "content", "get",
                                  ctr(containerd_address, ns, "images", "ls").split(full)[1].split()[1]))
        assert manifest["config"]["digest"] == images[ref]["configDigest"]
        config = json.loads(ctr(containerd_address, ns, "content", "get", images[ref]["configDigest"]))
        assert config["rootfs"]["diff_ids"] == images[ref]["diffIds"]
        assert [x["digest"] for x in manifest["layers"]] == images[ref]["diffIds"]  # stored as the layers
    again = _import(bundle, *args, receipt=receipt)
    assert again.returncode == 0, again.stderr  # type: ignore[attr-defined]
    assert {i["status"] for i in json.loads(receipt.read_text())["images"]} == {"already-present"}
    # --deep reads the engine's bytes: a damaged layer blob is named, and nothing is changed
    top = images["fake/app:2"]["diffIds"][-1]
    blob = Path(containerd_address).parent / "root" / "io.containerd.content.v1.content" / "blobs" / "sha256" / top[7:]
    data = blob.read_bytes()
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    try:
        proc = _import(bundle, *args, "--deep")
    finally:
        blob.write_bytes(data)
    assert proc.returncode == 8 and "error[deep-mismatch]" in proc.stderr, proc.stderr  # type: ignore
    assert "fake/app:2" in proc.stderr and "layer 3" in proc.stderr, proc.stderr  # type: ignore
    assert ctr(containerd_address, ns, "images", "ls", "-q").split() == [f"docker.io/{r}" for r in sorted(REFS)]


def test_legacy_bundle_into_podman_gets_the_names_schema_3_gives(podman_vfs: object, tmp_path: Path) -> None:
    bundle, images = _golden("v2", tmp_path)
    store = podman_vfs
    for ref in REFS:
        for name in (f"docker.io/{ref}", f"localhost/{ref}"):
            store.podman("untag", name, check=False)  # type: ignore[attr-defined]
    proc = _import(bundle, *store.importer_args(), "--deep")  # type: ignore[attr-defined]
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    listing = store.podman("images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}").stdout  # type: ignore[attr-defined]
    names = dict(line.split() for line in listing.splitlines())
    for ref in REFS:
        assert images[ref]["configDigest"].startswith("sha256:" + names[f"docker.io/{ref}"])
        assert f"localhost/{ref}" not in names  # what a bare `podman load` would have called it


@pytest.mark.parametrize("target", ["oci", "registry"])
def test_legacy_bundle_into_an_engine_without_an_archive_loader_is_refused(target: str, tmp_path: Path) -> None:
    bundle, _ = _golden("v2", tmp_path)
    layout = tmp_path / "layout"
    args = (["--engine", "oci", "--oci-dir", str(layout)] if target == "oci"
            else ["--engine", "registry", "--registry", "127.0.0.1:9"])  # nothing listens; nothing is sent
    proc = _import(bundle, *args)
    assert proc.returncode == 2, proc.stderr  # type: ignore[attr-defined]
    err = proc.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err and "error[usage]: importing the schema 2 bundle" in err
    assert "expected an engine that loads a docker-archive" in err and "--schema 3" in err
    assert not layout.exists()


@pytest.fixture
def other_image(docker_host: str, busybox: str, tmp_path: Path) -> str:
    ctx = simple_context(tmp_path / "ctx", busybox, f"other {uuid.uuid4().hex}\n")
    engines.build_image(docker_host, ctx, "legacy/other:1")
    return "legacy/other:1"


def test_legacy_import_into_docker_holds_the_lock_checks_space_and_tags(docker_host: str, other_image: str,
                                                                        tmp_path: Path) -> None:
    bundle, images = _golden("v2", tmp_path)
    for ref in REFS:
        docker(docker_host, "image", "rm", ref, check=False)
    lock_dir = tmp_path / "locks"
    os.environ["SNEAKERNET_LOCK_DIR"] = str(lock_dir)
    try:
        # another import holds the engine: refused (exit 6), nothing loaded
        with engine_lock(docker_host, bundle="/elsewhere"):
            proc = _import(bundle, "--docker-host", docker_host)
        assert proc.returncode == 6 and "error[engine-locked]" in proc.stderr, proc.stderr  # type: ignore
        assert all(image_facts(docker_host, ref) is None for ref in REFS)
        # a bundle tag on another image: refused (exit 7) unless --force, nothing loaded
        docker(docker_host, "tag", other_image, "fake/app:2")
        proc = _import(bundle, "--docker-host", docker_host)
        assert proc.returncode == 7 and "error[tag-conflict]: tagging fake/app:2" in proc.stderr, proc.stderr  # type: ignore
        assert image_facts(docker_host, "fake/base:1") is None
        docker(docker_host, "image", "rm", "fake/app:2")
        receipt = tmp_path / "r.json"
        proc = _import(bundle, "--docker-host", docker_host, receipt=receipt)
        assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    finally:
        del os.environ["SNEAKERNET_LOCK_DIR"]
    doc = json.loads(receipt.read_text())
    assert Path(doc["staging"]["lockFile"]).parent == lock_dir
    uncompressed = json.loads((bundle / "bundle.json").read_text())["uncompressedSize"]
    space = [c for c in doc["preflight"]["checks"] if c["name"] == "space"]
    assert any("2 x the uncompressed archive" in " ".join(c["purposes"]) for c in space), space
    assert max(c["needBytes"] for c in space) >= 2 * uncompressed + (16 << 20)
    for ref in REFS:
        facts = image_facts(docker_host, ref)
        assert facts is not None and facts[0] == images[ref]["configDigest"]
    # present but untagged: the import names it again without loading anything
    docker(docker_host, "tag", "fake/base:1", "legacy/keep:1")
    docker(docker_host, "image", "rm", "fake/base:1")
    proc = _import(bundle, "--docker-host", docker_host, receipt=receipt)
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    base = next(i for i in json.loads(receipt.read_text())["images"] if i["refs"] == ["fake/base:1"])
    assert base["status"] == "already-present" and base["tagsApplied"] == ["fake/base:1"]
    assert image_facts(docker_host, "fake/base:1") is not None
    docker(docker_host, "image", "rm", "legacy/keep:1")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_legacy_bundle_into_dockers_containerd_store_is_checked_by_that_stores_rule(
        version: str, docker_host_ctrstore: str, tmp_path: Path) -> None:
    """Docker's containerd store reports no config digest: a schema 1/2 bundle loaded there is
    checked by that store's rule (diff_ids; the ID is the manifest the docker-archive load makes,
    predicted from the archive's sizes), not refused as a mismatch; --deep re-hashes the bytes."""
    bundle, images = _golden(version, tmp_path)
    for ref in REFS:
        docker(docker_host_ctrstore, "image", "rm", ref, check=False)
    receipt = tmp_path / "r.json"
    proc = _import(bundle, "--docker-host", docker_host_ctrstore, "--deep", receipt=receipt)
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    doc = json.loads(receipt.read_text())
    assert doc["result"] == "pass" and doc["engine"]["imageStore"] == "containerd"
    for image in doc["images"]:
        assert image["identityRule"] == "diff-ids+manifest" and image["result"] == "match", image
        assert image["idVerified"] is True, image["detail"]  # the predicted docker-archive manifest
        assert image["deep"]["ok"] is True
        facts = image_facts(docker_host_ctrstore, image["refs"][0])
        assert facts is not None and facts[0] == image["found"]["imageId"]
        assert list(image["found"]["diffIds"]) == images[image["refs"][0]]["diffIds"]
    # a second run finds them held (no load) and passes by the same rule
    proc = _import(bundle, "--docker-host", docker_host_ctrstore, receipt=receipt)
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    assert {i["status"] for i in json.loads(receipt.read_text())["images"]} == {"already-present"}
    for ref in REFS:
        docker(docker_host_ctrstore, "image", "rm", ref, check=False)
