"""Files carried as OCI artifacts (schema 3.6, issue 42, docs/files.md) on every transport, read
with the real oras 1.2: `bundle-import serve` (`oras pull`, `oras copy`), `bundle push` and
`--engine registry` into a loopback docker-registry (also one that refuses chunked uploads), and
the OCI layout target (`oras pull --oci-layout`). Hostile: a served file whose blob changed on
disk after verification is cut before its end."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit import engines
from tests.kit.engines import Registry
from tests.kit.fileskit import MODEL_REF, model_bundle, oras, run_oras, same_bytes
from tests.kit.helpers import run_cli, run_pyz
from tests.kit.servekit import cut_body, request, serving
from tests.kit.transferkit import FlakyProxy

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    oras()  # the tool first: under CI=true a missing one fails here
    return model_bundle(tmp_path_factory.mktemp("ft"), mib=3)


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    with engines.private_registry(f"ft-{os.getpid()}") as reg:
        yield reg


def _art(bundle: Path) -> dict:
    return json.loads((bundle / "bundle.json").read_text())["artifacts"][0]


def test_serve_hands_the_files_to_oras_pull_and_oras_copy(made: tuple[Path, Path], tmp_path: Path) -> None:
    src, bundle = made
    digest = _art(bundle)["manifest"]["digest"]
    with serving(bundle / "bundle-import.pyz", bundle) as s:
        assert {"name": "models/llama", "tags": ["3.1"]} in s.start["repositories"]
        status, _, body = request(s.addr, "GET", "/v2/models/llama/tags/list")
        assert status == 200 and json.loads(body)["tags"] == ["3.1"]
        status, headers, body = request(s.addr, "GET", f"/v2/models/llama/manifests/{digest}")
        assert status == 200 and headers["docker-content-digest"] == digest
        run_oras("pull", "--plain-http", f"{s.addr}/{MODEL_REF}", "-o", str(tmp_path / "pulled"), home=tmp_path)
        run_oras("copy", "--from-plain-http", f"{s.addr}/{MODEL_REF}", "--to-oci-layout",
                 f"{tmp_path / 'copied'}:3.1", home=tmp_path)
    same_bytes(src, tmp_path / "pulled")
    run_oras("pull", "--oci-layout", f"{tmp_path / 'copied'}:3.1", "-o", str(tmp_path / "from-copy"), home=tmp_path)
    same_bytes(src, tmp_path / "from-copy")


def test_a_served_file_changed_on_disk_is_cut_before_its_end(made: tuple[Path, Path], tmp_path: Path) -> None:
    _, original = made
    bundle = tmp_path / "copy.bundle"
    shutil.copytree(original, bundle)
    weights = next(f for f in _art(bundle)["files"] if f["title"] == "model.safetensors")
    path = bundle / "blobs" / "sha256" / weights["digest"][7:]
    with serving(bundle / "bundle-import.pyz", bundle) as s:
        path.chmod(0o644)
        with open(path, "r+b") as f:  # after verification: serve hashes it again as it sends
            f.seek(2 * 1024 * 1024 + 7)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        status, length, got = cut_body(s.addr, f"/v2/models/llama/blobs/{weights['digest']}")
        assert status == 200 and length == weights["size"] and got < length
        assert s.stop() != 0  # it says so when it stops
        err = s.stderr()
    assert "error[serve-blob-damaged]" in err and weights["digest"] in err


def test_bundle_push_hands_the_artifact_on_and_oras_pulls_the_same_files(made: tuple[Path, Path], registry: Registry,
                                                                        tmp_path: Path) -> None:
    src, bundle = made
    art = _art(bundle)
    proc = run_cli("bundle", "push", str(bundle), f"{registry.addr}/ns", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (pushed,) = out["fileArtifacts"]
    assert out["ok"] and out["images"] == []
    assert pushed["pushedTo"] == f"{registry.addr}/ns/{MODEL_REF}" and pushed["status"] == "pushed"
    assert pushed["manifestDigest"] == art["manifest"]["digest"] and pushed["readBack"]["ok"]
    run_oras("pull", "--plain-http", f"{registry.addr}/ns/{MODEL_REF}", "-o", str(tmp_path / "pulled"),
             home=tmp_path)
    same_bytes(src, tmp_path / "pulled")
    proc = run_cli("bundle", "push", str(bundle), f"{registry.addr}/ns", "--json")  # again: nothing sent
    again = json.loads(proc.stdout)["fileArtifacts"][0]
    assert again["status"] == "already-present" and again["blobsUploaded"] == 0


def test_a_registry_refusing_chunked_uploads_gets_each_blob_in_one_request(made: tuple[Path, Path],
                                                                         registry: Registry, tmp_path: Path) -> None:
    src, bundle = made
    with FlakyProxy(registry.port, fail_first=10**6, fail_match=b"PATCH", fail_status=405) as proxy:
        proc = run_cli("bundle", "push", str(bundle), f"127.0.0.1:{proxy.port}/mono", "--json", "--chunk-size", "1M")
        assert proc.returncode == 0, proc.stderr
        assert proxy.failed == 1  # one refused PATCH, then no other
        puts = [line for line in proxy.lines if line.startswith("PUT") and "digest=" in line]
    out = json.loads(proc.stdout)
    assert out["fileArtifacts"][0]["readBack"]["ok"] and len(puts) == out["fileArtifacts"][0]["blobsUploaded"]
    run_oras("pull", "--plain-http", f"{registry.addr}/mono/{MODEL_REF}", "-o", str(tmp_path / "pulled"),
             home=tmp_path)
    same_bytes(src, tmp_path / "pulled")


def test_engine_registry_pushes_a_bundle_of_files_alone(made: tuple[Path, Path], registry: Registry,
                                                        tmp_path: Path) -> None:
    src, bundle = made
    receipt = tmp_path / "receipt.json"
    proc = run_pyz(bundle, "--engine", "registry", "--registry", f"{registry.addr}/imp", "--receipt", str(receipt),
                   "--json")
    assert proc.returncode == 0, proc.stderr
    push = json.loads(receipt.read_text())["push"]
    (pushed,) = push["fileArtifacts"]
    assert pushed["readBack"]["ok"] and pushed["pushedTo"] == f"{registry.addr}/imp/{MODEL_REF}"
    run_oras("pull", "--plain-http", f"{registry.addr}/imp/{MODEL_REF}", "-o", str(tmp_path / "pulled"),
             home=tmp_path)
    same_bytes(src, tmp_path / "pulled")
    assert json.loads(receipt.read_text())["result"] == "pass"


def test_the_oci_layout_target_names_the_artifact_for_oras(made: tuple[Path, Path], tmp_path: Path) -> None:
    src, bundle = made
    art = _art(bundle)
    layout = tmp_path / "layout"
    proc = run_pyz(bundle, "--engine", "oci", "--oci-dir", str(layout))
    assert proc.returncode == 0, proc.stderr
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [e for e in index["manifests"] if e["digest"] == art["manifest"]["digest"]]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == MODEL_REF
    assert entry["artifactType"] == art["artifactType"]
    run_oras("pull", "--oci-layout", f"{layout}@{art['manifest']['digest']}", "-o", str(tmp_path / "pulled"),
             home=tmp_path)
    same_bytes(src, tmp_path / "pulled")
    again = run_pyz(bundle, "--engine", "oci", "--oci-dir", str(layout))  # the same bytes again: fine
    assert again.returncode == 0, again.stderr
