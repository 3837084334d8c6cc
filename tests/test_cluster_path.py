"""The cluster path with default bundles (issue 25, points 1 and 3): a default bundle's zstd layers
reach Docker 20.10 (the fixture ``docker_host``, overlay2: an engine that reads no zstd) through
``bundle-import serve --compression gzip`` and ``bundle push --compression gzip`` with the image IDs
as built, and a Docker that old asking for zstd without it gets a registry error that says what to do.
An ``--all-platforms`` bundle's layout names its index (skopeo reads every platform from
``oci:BUNDLE:REF``), ``serve`` answers the tag with the index, and Docker 20.10 pulling
``--platform linux/arm64`` gets the arm64 image ID.

Engines covered: Docker 20.10 (overlay2), skopeo, docker-registry; the HTTP checks need none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.kit import engines
from tests.kit.clijson import validate
from tests.kit.fuzzkit import repin_file
from tests.kit.helpers import docker, image_facts, run_cli
from tests.kit.imagegen import layered_context
from tests.kit.layoutgen import ARCHES, REF
from tests.kit.servekit import request, serving
from tests.kit.transferkit import random_bundle

pytestmark = pytest.mark.engine
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OLD_DOCKER = {"User-Agent": "docker/20.10.24+dfsg1 go/go1.19.8 git-commit/5d6db84 kernel/6.1.0 os/linux arch/amd64"}


@pytest.fixture(scope="module")
def zstd_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A default bundle: zstd layers, two images sharing a base layer."""
    return random_bundle(tmp_path_factory.mktemp("zstd") / "carry.bundle", mb=(1, 1), compression="zstd")


@pytest.fixture
def multi(pristine_multi: Path, multi_facts: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The kit's ``--all-platforms`` bundle of an amd64/arm64/ppc64le index (gzip layers; read
    only: a test that changes it copies it first), and what its source layout held."""
    return pristine_multi, multi_facts


def _doc(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "bundle.json").read_text())  # type: ignore[no-any-return]


def test_docker_20_pulls_a_zstd_bundle_through_serve_gzip(zstd_bundle: Path, docker_host: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A default (zstd) bundle served with ``--compression gzip``: Docker 20.10 pulls each image with
    its ID and diff_ids as built (engines: Docker 20.10 overlay2, the old one)."""
    doc = _doc(zstd_bundle)
    assert all(layer["mediaType"].endswith("+zstd") for image in doc["images"] for layer in image["layers"])
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where serve keeps the recompressed layers
    with serving(zstd_bundle / "bundle-import.pyz", zstd_bundle, "--compression", "gzip") as s:
        validate("serve", s.start)
        assert s.start["compression"] == "gzip"
        [work] = tmp_path.glob("sneakernet-serve-*")
        assert work.stat().st_mode & 0o077 == 0  # private
        renamed = s.start["renamedManifests"]
        assert set(renamed) == {image["manifest"]["digest"] for image in doc["images"]}
        for image in doc["images"]:
            ref = f"{s.addr}/{image['refs'][0]}"
            docker(docker_host, "image", "rm", ref, check=False)
            docker(docker_host, "image", "rm", image["config"]["digest"], check=False)  # 20.10 skips an ID it holds
            proc = docker(docker_host, "pull", ref, check=False)
            assert proc.returncode == 0, proc.stderr + s.stderr()
            facts = image_facts(docker_host, ref)
            assert facts is not None and facts[0] == image["config"]["digest"]  # the image ID as built
            assert facts[1] == [layer["diffId"] for layer in image["layers"]]
            status, headers, body = request(s.addr, "GET", f"/v2/{image['refs'][0].replace(':', '/manifests/')}",
                                            OLD_DOCKER)
            assert status == 200 and headers["docker-content-digest"] == renamed[image["manifest"]["digest"]]
            assert all(layer["mediaType"].endswith("+gzip") for layer in json.loads(body)["layers"])
        assert s.stop() == 0
        assert "recompressing layer" in s.stderr()
    assert not list(tmp_path.glob("sneakernet-serve-*"))  # removed when serve stopped
    for image in doc["images"]:
        docker(docker_host, "image", "rm", f"{s.addr}/{image['refs'][0]}", check=False)


def test_docker_20_asking_for_zstd_gets_an_error_that_says_what_to_do(zstd_bundle: Path, docker_host: str) -> None:
    """Without ``--compression``: a warning at start; Docker 20.10 gets an error naming
    ``--compression gzip``, Docker 26 and containerd User-Agents get the manifest (engines: Docker 20.10)."""
    doc = _doc(zstd_bundle)
    image = doc["images"][0]
    with serving(zstd_bundle / "bundle-import.pyz", zstd_bundle) as s:
        assert "Docker before 23.0 cannot pull them" in s.stderr()  # the warning at start
        path = f"/v2/{image['refs'][0].replace(':', '/manifests/')}"
        status, _, body = request(s.addr, "GET", path, OLD_DOCKER)
        assert status == 404 and "--compression gzip" in json.loads(body)["errors"][0]["message"]
        by_digest = f"/v2/{image['refs'][0].split(':')[0]}/manifests/{image['manifest']['digest']}"
        assert request(s.addr, "HEAD", by_digest, OLD_DOCKER)[0] == 404  # by digest, HEAD too
        layer = image["layers"][0]["digest"]
        assert request(s.addr, "HEAD", f"/v2/{image['refs'][0].split(':')[0]}/blobs/{layer}", OLD_DOCKER)[0] == 200
        new = {"User-Agent": "docker/26.1.5 go/go1.22 os/linux arch/amd64"}
        assert request(s.addr, "GET", path, new)[0] == 200  # a Docker that reads zstd gets it
        assert request(s.addr, "GET", path, {"User-Agent": "containerd/1.6.20"})[0] == 200
        ref = f"{s.addr}/{image['refs'][0]}"
        docker(docker_host, "image", "rm", image["config"]["digest"], check=False)
        proc = docker(docker_host, "pull", ref, check=False)
        assert proc.returncode != 0 and "--compression gzip" in proc.stderr  # the real Docker 20.10 shows it
        assert s.stop() == 0


def test_an_all_platforms_layout_names_the_index(multi: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The 3.3 layout: skopeo reads the index from ``oci:BUNDLE:REF`` and copies every platform;
    folder and tar verify (engines: skopeo)."""
    bundle, facts = multi
    doc = _doc(bundle)
    assert doc["schemaVersion"] == "3.3"
    entries = json.loads((bundle / "index.json").read_text())["manifests"]
    named = [e for e in entries if e.get("annotations")]
    assert [(e["digest"], e["mediaType"]) for e in named] == [(facts["index"], OCI_INDEX)]
    skopeo = engines.require("skopeo")
    raw = subprocess.run([skopeo, "--insecure-policy", "inspect", "--raw", f"oci:{bundle}:{REF}"],
                         capture_output=True, timeout=120, check=True).stdout
    assert raw == facts["index_bytes"]  # every platform, to a layout reader
    copy = subprocess.run([skopeo, "--insecure-policy", "copy", "--all", f"oci:{bundle}:{REF}",
                           f"oci:{tmp_path / 'copy'}:{REF}"], capture_output=True, text=True, timeout=300)
    assert copy.returncode == 0, copy.stderr
    for arch in ARCHES:
        assert (tmp_path / "copy" / "blobs" / "sha256" / facts["arch"][arch]["config"][7:]).is_file()
    proc = run_cli("importer", str(bundle), "--verify-only", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "all.tar"), check=True)  # archive verification too
    proc = run_cli("importer", str(tmp_path / "all.tar"), "--verify-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_32_layout_naming_the_primary_still_verifies(multi: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """Bundles written before 3.3 name the primary platform's manifest: still accepted (no engine)."""
    bundle, _ = multi
    old = tmp_path / "old.bundle"
    shutil.copytree(bundle, old)
    entries = json.loads((old / "index.json").read_text())["manifests"]
    refs = [e["annotations"] for e in entries if e.get("annotations")]
    rest = [e for e in entries if not e.get("annotations")]
    rest[0] = {**rest[0], "annotations": refs[0]}  # the ref on the primary platform's manifest, as 3.2 wrote it
    (old / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": rest}))
    doc = _doc(old)
    doc["schemaVersion"] = "3.2"
    (old / "bundle.json").write_text(json.dumps(doc, indent=2))
    repin_file(old, "index.json")
    proc = run_cli("importer", str(old), "--verify-only", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_serve_answers_the_tag_with_the_index_and_docker_gets_arm64(multi: tuple[Path, dict[str, Any]],
                                                                   docker_host: str) -> None:
    """``serve`` of an ``--all-platforms`` bundle: the tag is the index, every platform by digest;
    Docker 20.10 (amd64) pulling ``--platform linux/arm64`` gets the arm64 image ID (engines: Docker 20.10)."""
    bundle, facts = multi
    with serving(bundle / "bundle-import.pyz", bundle) as s:
        status, headers, body = request(s.addr, "GET", "/v2/multi/app/manifests/1", {"Accept": OCI_INDEX})
        assert status == 200 and body == facts["index_bytes"] and headers["content-type"] == OCI_INDEX
        for arch in ARCHES:
            assert request(s.addr, "HEAD", f"/v2/multi/app/manifests/{facts['arch'][arch]['manifest']}")[0] == 200
            assert request(s.addr, "HEAD", f"/v2/multi/app/blobs/{facts['arch'][arch]['layer']}")[0] == 200
        ref = f"{s.addr}/{REF}"
        docker(docker_host, "image", "rm", ref, check=False)
        docker(docker_host, "image", "rm", facts["arch"]["arm64"]["config"], check=False)
        proc = docker(docker_host, "pull", "--platform", "linux/arm64", ref, check=False)
        assert proc.returncode == 0, proc.stderr
        found = image_facts(docker_host, ref)
        assert found is not None and found[0] == facts["arch"]["arm64"]["config"]  # arm64, its ID as built
        docker(docker_host, "image", "rm", ref)
        assert s.stop() == 0


def test_docker_20_pulls_a_zstd_bundle_after_push_gzip(zstd_bundle: Path, docker_host: str) -> None:
    """``bundle push --compression gzip`` into a docker-registry: gzip layers, the image IDs as built,
    the new manifest digests in --json; Docker 20.10 pulls them (engines: docker-registry, Docker 20.10)."""
    doc = _doc(zstd_bundle)
    with engines.private_registry(f"cl-{os.getpid()}") as reg:
        proc = run_cli("bundle", "push", str(zstd_bundle), f"{reg.addr}/site", "--compression", "gzip", "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        validate("push", out)
        assert out["ok"] and out["compression"] == "gzip"
        renamed = out["renamedManifests"]
        for image, pushed in zip(doc["images"], out["images"]):
            assert pushed["manifestDigest"] == renamed[image["manifest"]["digest"]] != image["manifest"]["digest"]
            assert pushed["configDigest"] == image["config"]["digest"]
            req = urllib.request.Request(f"http://{reg.addr}/v2/{pushed['repository']}/manifests/{pushed['tag']}",
                                         headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                manifest = json.loads(r.read())
            assert [x["mediaType"] for x in manifest["layers"]] == [OCI_GZIP] * len(image["layers"])
            docker(docker_host, "image", "rm", image["config"]["digest"], check=False)
            pulled = docker(docker_host, "pull", pushed["pushedTo"], check=False)
            assert pulled.returncode == 0, pulled.stderr
            facts = image_facts(docker_host, pushed["pushedTo"])
            assert facts is not None and facts[0] == image["config"]["digest"]  # the image ID as built
            assert facts[1] == [layer["diffId"] for layer in image["layers"]]
            docker(docker_host, "image", "rm", pushed["pushedTo"], check=False)
        plain = run_cli("bundle", "push", str(zstd_bundle), f"{reg.addr}/keep")
        assert plain.returncode == 0, plain.stderr
        assert "Docker before 23.0 cannot pull them" in plain.stderr and "--compression gzip" in plain.stdout
        imported = run_cli("importer", str(zstd_bundle), "--verify", "--engine", "registry", "--registry",
                           f"{reg.addr}/imported", "--no-receipt")
        assert imported.returncode == 0, imported.stderr
        assert "Docker before 23.0 cannot pull them" in imported.stderr  # --engine registry says so too


def test_recompressing_a_layer_that_is_not_its_diff_id_fails_and_keeps_nothing(tmp_path: Path) -> None:
    """Hostile: a zstd layer swapped for another valid zstd stream (bundle.json's digest made to
    match, so only the diff_id check can see it) is refused by the recompression, typed, and no
    recompressed blob of it is left in the work folder."""
    import dataclasses

    import zstandard

    from importer.errors import DigestMismatch
    from importer.format.digest import Digest
    from importer.format.manifest import load_bundle_manifest
    from importer.input.opened import open_bundle
    from importer.registry.transcode import transcode

    bundle = random_bundle(tmp_path / "b.bundle", mb=(1, 1), compression="zstd")
    opened = open_bundle(str(bundle))
    manifest = load_bundle_manifest(opened.raw_bundle_json)
    image = manifest.images[0]
    layer = image.layers[0]
    other = zstandard.ZstdCompressor().compress(b"\0" * layer.uncompressed_size)  # the right size, not the tar
    swapped = dataclasses.replace(layer, digest=Digest.of_bytes(other), size=len(other))
    (bundle / swapped.digest.blob_path).write_bytes(other)
    bad = dataclasses.replace(manifest, images=(dataclasses.replace(image, layers=(swapped, *image.layers[1:])),
                                                *manifest.images[1:]))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(DigestMismatch, match="expected diff_id"):
        transcode(opened, bad, "gzip", str(work))
    assert [p.name for p in work.iterdir()] == []


def test_only_a_docker_before_23_is_taken_for_too_old() -> None:
    """The User-Agent rule serve refuses zstd by: hostile, odd and other clients are served."""
    from importer.serve.serve import too_old_for_zstd

    assert too_old_for_zstd(OLD_DOCKER["User-Agent"]) == "20.10.24+dfsg1"
    assert too_old_for_zstd("docker/19.03.15 go/go1.13") == "19.03.15"
    assert too_old_for_zstd("docker/22.06.0-beta.0") == "22.06.0-beta.0"
    for served in ("docker/23.0.0 go/go1.19", "docker/26.1.5", "containerd/1.6.20", "skopeo/1.9",
                   "Go-http-client/1.1", "", "docker/", "docker/x.y", "xdocker/20.10", "docker/" + "9" * 5000,
                   "buildkit/v0.11 docker/20.10"):
        assert too_old_for_zstd(served) is None, served


def test_export_auto_for_a_docker_20_inventory_writes_gzip(docker_host: str, tmp_path: Path) -> None:
    """``bundle export --have`` the inventory of Docker 20.10 (real, ``docker_host``) with the default
    ``--compression auto``: gzip layers, and that Docker pulls them from ``serve`` without --compression."""
    held = "cluster/held:1"  # the inventory lists at least one image
    engines.build_image(docker_host, layered_context(tmp_path / "held", files={"/msg": f"held {os.getpid()}"}), held)
    inventory = run_cli("importer", "--inventory", "--engine", "docker", "--docker-host", docker_host, check=True)
    assert json.loads(inventory.stdout)["engine"]["version"].startswith("20.10")
    (tmp_path / "have.json").write_text(inventory.stdout)  # held stays: it keeps the layers the delta leaves out
    ref = "cluster/auto:1"
    # one layer no other image has: a delta's left-out layer is pulled by its blob digest, which
    # Docker 20.10 knows only from an earlier pull of that same blob (other tests' images would decide)
    only_here = layered_context(tmp_path / "ctx", files={"/msg": f"auto {os.getpid()} {time.time_ns()}"})
    engines.build_image(docker_host, only_here, ref)
    out = tmp_path / "auto.bundle"
    proc = run_cli("bundle", "export", ref, "-o", str(out), "--have", str(tmp_path / "have.json"), "-q",
                   docker_host=docker_host)
    assert proc.returncode == 0, proc.stderr
    [image] = _doc(out)["images"]
    carried = [x["mediaType"] for x in image["layers"] if not x.get("external")]
    assert carried and all(t.endswith("+gzip") or t.endswith(".tar.gzip") for t in carried), carried
    docker(docker_host, "image", "rm", ref)
    with serving(out / "bundle-import.pyz", out) as s:
        assert "zstd" not in s.stderr()  # no warning: nothing to warn about
        pulled = docker(docker_host, "pull", f"{s.addr}/{ref}", check=False)
        assert pulled.returncode == 0, pulled.stderr
        facts = image_facts(docker_host, f"{s.addr}/{ref}")
        assert facts is not None and facts[0] == image["config"]["digest"]
        assert s.stop() == 0
    docker(docker_host, "image", "rm", f"{s.addr}/{ref}", held)


def test_push_recompressed_keeps_every_platform(multi: tuple[Path, dict[str, Any]]) -> None:
    """``bundle push --compression zstd`` of an ``--all-platforms`` bundle (gzip layers): the tag names
    a rewritten index listing every platform's rewritten manifest, each with its config (image ID) as
    built and zstd layers (engines: docker-registry)."""
    bundle, facts = multi
    with engines.private_registry(f"clm-{os.getpid()}") as reg:
        proc = run_cli("bundle", "push", str(bundle), f"{reg.addr}/site", "--compression", "zstd", "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["ok"]
        renamed = out["renamedManifests"]
        [pushed] = out["images"]
        assert pushed["readBack"]["manifestDigest"] == renamed[facts["index"]]  # the tag names the new index
        assert pushed["manifestDigest"] == renamed[facts["arch"]["amd64"]["manifest"]]  # the primary's, new

        def get(ref: str, accept: str) -> Any:
            req = urllib.request.Request(f"http://{reg.addr}/v2/{pushed['repository']}/manifests/{ref}",
                                         headers={"Accept": accept})
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())

        index = get(pushed["tag"], OCI_INDEX)
        listed = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}
        assert set(listed) == set(ARCHES)
        for arch in ARCHES:
            assert listed[arch] == renamed[facts["arch"][arch]["manifest"]]
            manifest = get(listed[arch], "application/vnd.oci.image.manifest.v1+json")
            assert manifest["config"]["digest"] == facts["arch"][arch]["config"]  # its image ID as built
            assert [x["mediaType"] for x in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+zstd"]


@pytest.mark.parametrize("damage", ["index-size", "ref-dropped"])
def test_a_33_layout_that_misdescribes_the_index_fails_verification(multi: tuple[Path, dict[str, Any]],
                                                                    tmp_path: Path, damage: str) -> None:
    """Hostile: index.json's entry for the index with a wrong size, or the ref on nothing (both
    re-pinned in bundle.json and SHA256SUMS, so only the layout check can see it)."""
    bundle, facts = multi
    bad = tmp_path / "bad.bundle"
    shutil.copytree(bundle, bad)
    entries = json.loads((bad / "index.json").read_text())["manifests"]
    for e in entries:
        if e["digest"] == facts["index"]:
            if damage == "index-size":
                e["size"] += 1
            else:
                del e["annotations"]
    (bad / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}))
    repin_file(bad, "index.json")
    proc = run_cli("importer", str(bad), "--verify-only", "--json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "invalid-layout" in proc.stdout and ("index of" in proc.stdout or "its index" in proc.stdout)
