"""Multi-platform images (issue 17, points 2 and 3; bundle schema 3.2): an OCI layout holding one
image index for linux/amd64, linux/arm64 and linux/ppc64le (tiny layers and configs written by
the test) exported with ``--all-platforms`` keeps the index byte for byte and every platform's
blobs; several ``--platform`` carry just those; the amd64 Docker in CI imports the amd64 image
from it (the config's image ID); a bundle without the host's platform is refused before any
change, naming the platforms it has; a damaged blob of a platform the host does not run still
fails verification; bundle.json validates against schemas/bundle/v3.schema.json."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.kit import engines
from tests.kit.clijson import validate
from tests.kit.helpers import REPO, docker, image_facts, image_ids, run_cli
from tests.kit.layoutgen import ARCHES, REF, write_layout

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    if platform.machine() not in ("x86_64", "amd64"):
        pytest.fail(f"this test expects an amd64 host (the CI machine's), found {platform.machine()}")
    root = tmp_path_factory.mktemp("multi") / "layout"
    return root, write_layout(root)


def export(layout: Path, out: Path, *args: str) -> dict[str, Any]:
    proc = run_cli("bundle", "export", f"oci:{layout}:{REF}", "-o", str(out), "--json", "-q", *args)
    assert proc.returncode == 0, proc.stderr
    validate("export", json.loads(proc.stdout))
    doc = json.loads((out / "bundle.json").read_text())
    schema = json.loads((REPO / "schemas" / "bundle" / "v3.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    return doc


def stored(bundle: Path) -> set[str]:
    return {f"sha256:{p.name}" for p in (bundle / "blobs" / "sha256").iterdir()}


def test_all_platforms_keeps_the_index_and_docker_gets_its_own(layout: tuple[Path, dict[str, Any]],
                                                               docker_host: str, tmp_path: Path) -> None:
    src, facts = layout
    out = tmp_path / "all.bundle"
    doc = export(src, out, "--all-platforms")
    assert doc["schemaVersion"] == "3.3"
    [image] = doc["images"]
    assert image["refs"] == [REF] and image["platform"]["architecture"] == "amd64"  # this host's is the primary
    assert image["index"]["digest"] == facts["index"]
    assert (out / "blobs" / "sha256" / facts["index"][7:]).read_bytes() == facts["index_bytes"]  # byte for byte
    assert [p["platform"]["architecture"] for p in image["platforms"]] == ["arm64", "ppc64le"]
    for arch in ARCHES:
        assert {facts["arch"][arch][k] for k in ("config", "layer", "manifest")} <= stored(out)
    inspected = json.loads(run_cli("bundle", "inspect", str(out), "--json").stdout)
    assert [p["architecture"] for p in inspected["images"][0]["platforms"]] == list(ARCHES)
    assert inspected["images"][0]["indexDigest"] == facts["index"]
    table = run_cli("bundle", "inspect", str(out)).stdout
    assert "linux/amd64, linux/arm64, linux/ppc64le" in table
    # Docker (amd64) imports the amd64 image: the config's image ID, every platform verified first
    docker(docker_host, "image", "rm", REF, check=False)
    receipt = tmp_path / "r.json"
    proc = run_cli("importer", str(out), "--verify", "--docker-host", docker_host, "--receipt", str(receipt), "-q")
    assert proc.returncode == 0, proc.stderr
    found = image_facts(docker_host, REF)
    assert found is not None and found[0] == facts["arch"]["amd64"]["config"]
    checked = json.loads(receipt.read_text())
    verification = checked["verification"]
    # every file, the arm64 and ppc64le blobs too: the amd64 layer's bytes in the load stream
    assert verification["filesChecked"] + verification["layersCheckedWhileLoading"] == len(doc["files"])
    assert verification["layersCheckedWhileLoading"] == 1
    # --check-only proves the engine holds the platform it runs
    proc = run_cli("importer", str(out), "--check-only", "--docker-host", docker_host, "--no-receipt", "-q")
    assert proc.returncode == 0, proc.stderr
    docker(docker_host, "image", "rm", REF)


def test_several_platforms_carry_just_those(layout: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    src, facts = layout
    out = tmp_path / "two.bundle"
    doc = export(src, out, "--platform", "linux/arm64", "--platform", "linux/amd64")
    [image] = doc["images"]
    assert doc["schemaVersion"] == "3.2" and "index" not in image  # a subset cannot keep the index digest
    assert image["platform"]["architecture"] == "amd64"
    assert [p["platform"]["architecture"] for p in image["platforms"]] == ["arm64"]
    assert facts["arch"]["arm64"]["layer"] in stored(out) and facts["arch"]["amd64"]["layer"] in stored(out)
    assert facts["arch"]["ppc64le"]["layer"] not in stored(out)


def test_a_bundle_without_the_hosts_platform_is_refused_before_any_change(
        layout: tuple[Path, dict[str, Any]], docker_host: str, tmp_path: Path) -> None:
    src, _ = layout
    out = tmp_path / "foreign.bundle"
    doc = export(src, out, "--platform", "linux/arm64,linux/ppc64le")
    assert doc["images"][0]["platform"]["architecture"] == "arm64"  # no host platform: the first asked
    before = image_ids(docker_host)
    proc = run_cli("importer", str(out), "--verify", "--docker-host", docker_host, "--no-receipt", "--json")
    assert proc.returncode == 7 and json.loads(proc.stdout)["error"]["id"] == "platform-mismatch", proc.stderr
    assert "linux/arm64, linux/ppc64le" in proc.stderr and "linux/amd64" in proc.stderr
    assert image_ids(docker_host) == before


def test_a_damaged_blob_of_another_platform_fails_verification(layout: tuple[Path, dict[str, Any]],
                                                                tmp_path: Path) -> None:
    src, facts = layout
    out = tmp_path / "all.bundle"
    export(src, out, "--all-platforms")
    blob = out / "blobs" / "sha256" / facts["arch"]["ppc64le"]["layer"][7:]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    proc = run_cli("importer", str(out), "--verify-only", "--json")
    assert proc.returncode == 3, proc.stderr
    assert facts["arch"]["ppc64le"]["layer"][7:] in proc.stdout


def test_docker_cannot_carry_several_platforms(tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "some/image:1", "--all-platforms", "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and "several platforms" in proc.stderr and not (tmp_path / "x").exists()
    proc = run_cli("bundle", "export", "oci:/nowhere:x", "--all-platforms", "--platform", "linux/amd64",
                   "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and "expected one of them" in proc.stderr


@pytest.fixture(scope="module")
def registry_index(layout: tuple[Path, dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The same index pushed into a real docker-registry by skopeo (``copy --all``, digests kept)."""
    src, facts = layout
    with engines.private_registry(f"multi-{os.getpid()}") as reg:
        proc = subprocess.run([engines.require("skopeo"), "--insecure-policy", "copy", "--all",
                               "--dest-tls-verify=false", f"oci:{src}:{REF}", f"docker://{reg.addr}/{REF}"],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        yield f"{reg.addr}/{REF}", facts


def test_a_registry_index_is_carried_whole_or_one_platform(registry_index: tuple[str, dict[str, Any]],
                                                           tmp_path: Path) -> None:
    ref, facts = registry_index
    proc = run_cli("bundle", "export", f"docker://{ref}", "--all-platforms", "-o", str(tmp_path / "all"), "-q")
    assert proc.returncode == 0, proc.stderr
    [image] = json.loads((tmp_path / "all" / "bundle.json").read_text())["images"]
    assert image["index"]["digest"] == facts["index"]  # the registry's index, byte for byte
    assert (tmp_path / "all" / "blobs" / "sha256" / facts["index"][7:]).read_bytes() == facts["index_bytes"]
    assert image["refs"] == [ref] and len(image["platforms"]) == 2
    proc = run_cli("bundle", "export", f"docker://{ref}", "--platform", "linux/arm64", "-o", str(tmp_path / "arm"),
                   "-q")
    assert proc.returncode == 0, proc.stderr
    blobs = stored(tmp_path / "arm")
    assert {facts["arch"]["arm64"][k] for k in ("config", "layer", "manifest")} <= blobs
    assert not {facts["arch"][a][k] for a in ("amd64", "ppc64le") for k in ("config", "layer", "manifest")} & blobs


def test_an_oci_layout_target_keeps_the_whole_index(layout: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """An OCI layout gets every platform and the index, its digest unchanged, named by the ref;
    skopeo reads it back (an independent reader) as the original index bytes."""
    src, facts = layout
    out = tmp_path / "all.bundle"
    export(src, out, "--all-platforms")
    target = tmp_path / "target"
    receipt = tmp_path / "r.json"
    proc = run_cli("importer", str(out), "--verify", "--engine", "oci", "--oci-dir", str(target),
                   "--receipt", str(receipt), "-q")
    assert proc.returncode == 0, proc.stderr
    index = json.loads((target / "index.json").read_text())
    [entry] = [e for e in index["manifests"] if e.get("annotations", {}).get("org.opencontainers.image.ref.name")
               == REF]
    assert entry["digest"] == facts["index"] and entry["mediaType"] == "application/vnd.oci.image.index.v1+json"
    held = {f"sha256:{p.name}" for p in (target / "blobs" / "sha256").iterdir()}
    for arch in ARCHES:
        assert {facts["arch"][arch][k] for k in ("config", "layer", "manifest")} <= held
    raw = subprocess.run([engines.require("skopeo"), "--insecure-policy", "inspect", "--raw", f"oci:{target}:{REF}"],
                         capture_output=True, timeout=120, check=False)
    assert raw.returncode == 0 and raw.stdout == facts["index_bytes"], raw.stderr
    assert json.loads(receipt.read_text())["images"][0]["result"] == "match"
    # a second import finds it whole (already present), nothing rewritten
    proc = run_cli("importer", str(out), "--verify", "--engine", "oci", "--oci-dir", str(target),
                   "--receipt", str(receipt), "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(receipt.read_text())["images"][0]["status"] == "already-present"
    assert json.loads((target / "index.json").read_text()) == index


def test_a_registry_target_gets_the_whole_index(layout: tuple[Path, dict[str, Any]], docker_host: str,
                                                tmp_path: Path) -> None:
    """`bundle-import --engine registry` (the push) puts every platform's manifest by digest, then
    the index under the tag, its digest unchanged; skopeo reads it back as the original bytes, and
    `docker pull` (another independent reader) gets the amd64 image."""
    src, facts = layout
    out = tmp_path / "all.bundle"
    export(src, out, "--all-platforms")
    with engines.private_registry(f"multi-target-{os.getpid()}") as reg:
        receipt = tmp_path / "r.json"
        proc = run_cli("importer", str(out), "--verify", "--engine", "registry", "--registry", f"{reg.addr}/site",
                       "--receipt", str(receipt), "-q")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(receipt.read_text())["images"][0]["result"] == "match"
        # again without --force: the tag names the bundle's own index, which names the image (no conflict)
        again = run_cli("importer", str(out), "--engine", "registry", "--registry", f"{reg.addr}/site",
                        "--receipt", str(receipt), "-q")
        assert again.returncode == 0, again.stderr
        assert [i["status"] for i in json.loads(receipt.read_text())["images"]] == ["already-present"]
        raw = subprocess.run([engines.require("skopeo"), "--insecure-policy", "inspect", "--raw",
                              "--tls-verify=false", f"docker://{reg.addr}/site/{REF}"],
                             capture_output=True, timeout=120, check=False)
        assert raw.returncode == 0 and raw.stdout == facts["index_bytes"], raw.stderr
        for arch in ARCHES:  # each platform resolves through the index (skopeo picks by --override-arch)
            cfg = subprocess.run([engines.require("skopeo"), "--insecure-policy", "--override-arch", arch,
                                  "inspect", "--config", "--raw", "--tls-verify=false",
                                  f"docker://{reg.addr}/site/{REF}"], capture_output=True, timeout=120, check=False)
            assert cfg.returncode == 0 and json.loads(cfg.stdout)["architecture"] == arch, cfg.stderr
        pulled = f"{reg.addr}/site/{REF}"
        docker(docker_host, "pull", pulled)
        found = image_facts(docker_host, pulled)
        assert found is not None and found[0] == facts["arch"]["amd64"]["config"]
        docker(docker_host, "image", "rm", pulled)
