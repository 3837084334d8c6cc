"""`bundle export` from sources that keep compressed layers: containerd's content store
(`containerd:REF`) and an OCI layout (`oci:DIR[:REF]`). The blobs are copied byte for byte
(no recompression), the diff_ids are computed on the way and checked against the config, and
the bundle imports into Docker with the image ID the config pins."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest

from tests.kit import engines
from tests.kit.helpers import docker, image_facts, run_cli
from tests.kit.imagegen import base_and_update
from tests.kit.oci_schemas import validate_oci

pytestmark = pytest.mark.engine
SNAP = "native"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def src(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("src")
    base_and_update(docker_host, busybox, root, "src/app", weights=1 << 20, code="print('two')\n" * 300)
    gz = root / "gz.bundle"  # gzip layers: what containerd keeps after a typical pull
    run_cli("bundle", "export", "src/app:1", "src/app:2", "--compression", "gzip", "-o", str(gz),
            docker_host=docker_host, check=True)
    ids = {r: _facts(docker_host, r)[0] for r in ("src/app:1", "src/app:2")}
    return {"root": root, "gz": gz, "doc": json.loads((gz / "bundle.json").read_text()), "ids": ids}


def _facts(docker_host: str, ref: str) -> tuple[str, list[str]]:
    facts = image_facts(docker_host, ref)
    assert facts is not None, ref
    return facts


def skopeo_manifest_config(layout: Path, manifest: dict) -> str:
    digest = str(manifest["config"]["digest"])
    assert (layout / "blobs" / "sha256" / digest.split(":")[1]).is_file()
    return digest


def _bundle(path: Path) -> dict:
    """bundle.json, checked against schemas/bundle/v3 and every image manifest against the OCI schema."""
    doc = json.loads((path / "bundle.json").read_text())
    schema = json.loads((REPO / "schemas" / "bundle" / "v3.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    for image in doc["images"]:
        validate_oci("manifest", json.loads((path / "blobs" / "sha256" / image["manifest"]["digest"][7:]).read_bytes()))
    return doc


def _images(doc: dict) -> dict:
    return {img["refs"][0] if img["refs"] else "": img for img in doc["images"]}


def _into_docker(bundle: Path, docker_host: str, *refs: str) -> None:
    docker(docker_host, "image", "rm", *refs, check=False)
    proc = run_cli("importer", str(bundle), "--verify", "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 0, proc.stderr


def test_containerd_blobs_are_copied_as_stored(docker_host: str, docker_host_vfs: str, containerd_address: str,
                                               src: dict, tmp_path: Path) -> None:
    ns = "export-src"
    proc = run_cli("importer", str(src["gz"]), "--verify", "--engine", "containerd", "--address",
                   containerd_address, "--namespace", ns, "--snapshotter", SNAP, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "c"
    proc = run_cli("bundle", "export", "containerd:src/app:2", "containerd:docker.io/src/app:1", "-o", str(out),
                   "--address", containerd_address, "--namespace", ns, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = _bundle(out)
    assert doc["source"]["kind"] == "containerd" and doc["source"]["namespace"] == ns
    got, want = _images(doc), _images(src["doc"])
    assert sorted(got) == ["src/app:1", "src/app:2"]
    for ref in got:  # byte for byte: the same gzip blobs, config and diff_ids as the bundle containerd got
        assert got[ref]["config"]["digest"] == want[ref]["config"]["digest"]
        assert [x["digest"] for x in got[ref]["layers"]] == [x["digest"] for x in want[ref]["layers"]]
        assert [x["diffId"] for x in got[ref]["layers"]] == [x["diffId"] for x in want[ref]["layers"]]
        assert {x["mediaType"] for x in got[ref]["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}
        assert [x["uncompressedSize"] for x in got[ref]["layers"]] == \
            [x["uncompressedSize"] for x in want[ref]["layers"]]
    _into_docker(out, docker_host_vfs, "src/app:1", "src/app:2")
    for ref, image_id in src["ids"].items():
        assert _facts(docker_host_vfs, ref)[0] == image_id

    # a delta from the containerd source: only the new layer is read into the bundle
    base = tmp_path / "base"  # what the offline host got last week: src/app:1 alone
    run_cli("bundle", "export", "src/app:1", "--compression", "gzip", "-o", str(base), docker_host=docker_host,
            check=True)
    delta = tmp_path / "d"
    run_cli("bundle", "export", "containerd:src/app:2", "--have", str(base / "bundle.json"), "-o", str(delta),
            "--address", containerd_address, "--namespace", ns, check=True)
    layers = _bundle(delta)["images"][0]["layers"]
    assert [x.get("external", False) for x in layers] == [True, True, False]
    assert [x["digest"] for x in layers] == [x["digest"] for x in want["src/app:2"]["layers"]]
    assert len(list((delta / "blobs" / "sha256").iterdir())) == 3  # new layer, config, manifest


def test_a_missing_containerd_image_is_named(containerd_address: str, tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "containerd:nope/nothing:1", "-o", str(tmp_path / "x"),
                   "--address", containerd_address, "--namespace", "export-empty")
    assert proc.returncode == 5, proc.stderr
    assert "error[image-not-found]" in proc.stderr and "nope/nothing:1" in proc.stderr
    assert "namespace export-empty" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_oci_layout_from_skopeo_exports_and_imports(docker_host: str, src: dict, tmp_path: Path) -> None:
    engines.require("skopeo")
    layout = tmp_path / "layout"
    subprocess.run(["skopeo", "copy", "-q", "--src-daemon-host", docker_host,
                    "docker-daemon:src/app:2", f"oci:{layout}:src/app:2"], check=True, capture_output=True)
    out = tmp_path / "o"
    proc = run_cli("bundle", "export", f"oci:{layout}:src/app:2", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    image = _bundle(out)["images"][0]
    assert image["refs"] == ["src/app:2"]
    skopeo_manifest = json.loads((layout / "index.json").read_text())["manifests"][0]
    manifest = json.loads((layout / "blobs" / "sha256" / skopeo_manifest["digest"].split(":")[1]).read_bytes())
    assert [x["digest"] for x in image["layers"]] == [x["digest"] for x in manifest["layers"]]  # not recompressed
    assert [x["diffId"] for x in image["layers"]] == _facts(docker_host, "src/app:2")[1]
    # skopeo rewrote the config as an OCI config (a new image ID); the bundle pins skopeo's bytes
    assert image["config"]["digest"] == skopeo_manifest_config(layout, manifest)
    proc = run_cli("importer", str(out), "--verify", "--docker-host", docker_host, "--force", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert _facts(docker_host, "src/app:2") == (image["config"]["digest"], [x["diffId"] for x in image["layers"]])


def test_a_bare_tag_layout_is_named_with_tag(docker_host: str, src: dict, tmp_path: Path) -> None:
    engines.require("skopeo")
    layout = tmp_path / "layout"  # `skopeo copy ... oci:DIR:latest`: the ref name is a bare tag
    subprocess.run(["skopeo", "copy", "-q", "--src-daemon-host", docker_host,
                    "docker-daemon:src/app:1", f"oci:{layout}:latest"], check=True, capture_output=True)
    plain = tmp_path / "plain"
    run_cli("bundle", "export", f"oci:{layout}:latest", "-o", str(plain), check=True)
    assert _bundle(plain)["images"][0]["refs"] == []  # "latest" names no repository
    named = tmp_path / "named"
    proc = run_cli("bundle", "export", f"oci:{layout}:latest", "--tag", "team/train:7", "-o", str(named))
    assert proc.returncode == 0, proc.stderr
    image = _bundle(named)["images"][0]
    assert image["refs"] == ["team/train:7"]
    index = json.loads((named / "index.json").read_text())
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == ["team/train:7"]
    docker(docker_host, "image", "rm", "team/train:7", check=False)
    proc = run_cli("importer", str(named), "--verify", "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert _facts(docker_host, "team/train:7")[0] == image["config"]["digest"]
    docker(docker_host, "image", "rm", "team/train:7")
    # one --tag per image; a valid reference; not with the docker-save schemas
    for extra, words in ((["--tag", "a:1", "--tag", "b:1"], "expected one --tag per image (1), found 2"),
                         (["--tag", "Bad Name"], "exporting with --tag 'Bad Name': expected no spaces"),
                         (["--tag", "a:1", "--schema", "2"], "schemas 1 and 2 carry the names")):
        out = tmp_path / "bad"
        proc = run_cli("bundle", "export", f"oci:{layout}:latest", *extra, "-o", str(out))
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert not out.exists()


def test_a_damaged_layout_blob_leaves_no_bundle(src: dict, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    run_cli("importer", str(src["gz"]), "--engine", "oci", "--oci-dir", str(layout), "--no-receipt", check=True)
    layer = _images(src["doc"])["src/app:1"]["layers"][1]
    blob = layout / "blobs" / "sha256" / layer["digest"].split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    proc = run_cli("bundle", "export", f"oci:{layout}:src/app:1", "-o", str(tmp_path / "out"))
    assert proc.returncode == 5, proc.stderr
    assert "error[source]" in proc.stderr and "layer 2/2" in proc.stderr
    assert layer["digest"][:19] in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layout"]  # no bundle, no .partial folder


def test_an_oci_layout_needs_a_ref_when_it_holds_several(src: dict, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    run_cli("importer", str(src["gz"]), "--engine", "oci", "--oci-dir", str(layout), "--no-receipt", check=True)
    proc = run_cli("bundle", "export", f"oci:{layout}", "-o", str(tmp_path / "out"))
    assert proc.returncode == 5, proc.stderr
    assert "expected one image when no :REF is given, found 2" in proc.stderr
    assert "src/app:1" in proc.stderr and "src/app:2" in proc.stderr


def test_sources_cannot_be_mixed_or_unsupported(tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "src/app:1", "containerd:src/app:2", "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and "expected images from one source" in proc.stderr, proc.stderr
    proc = run_cli("bundle", "export", "docker-archive:/tmp/x.tar", "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and "the docker-archive: source is not supported" in proc.stderr, proc.stderr
    proc = run_cli("bundle", "export", "docker://127.0.0.1:5000/x:1", "src/app:1", "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and "expected images from one source" in proc.stderr, proc.stderr
    proc = run_cli("bundle", "export", f"oci:{tmp_path}:x", "--schema", "1", "-o", str(tmp_path / "y"))
    assert proc.returncode == 2 and "need a Docker source" in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
