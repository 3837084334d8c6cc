"""``bundle export --files DIR --artifact-ref REF --as-image`` (issue 42 point 5, docs/files.md): the
files as a runnable-format image (FROM scratch, one tar layer per file at its title, config with
rootfs.diff_ids, an OCI manifest) that is an ordinary image of the bundle, so Docker loads it."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import zstandard

from tests.kit import engines
from tests.kit.fileskit import export_files, sharded_model, tree
from tests.kit.helpers import run_cli, run_pyz

REF = "models/shards:img"


def _blob(bundle: Path, digest: str) -> bytes:
    return (bundle / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()


def _tar_of(bundle: Path, layer: dict) -> bytes:
    raw = _blob(bundle, layer["digest"])
    return zstandard.ZstdDecompressor().decompressobj().decompress(raw) if layer["mediaType"].endswith("+zstd") \
        else raw


def test_the_files_are_one_image_of_one_tar_layer_per_file(tmp_path: Path) -> None:
    src = sharded_model(tmp_path / "model", kib=64)
    (src / "sub").mkdir()
    (src / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (src / "sub" / "run.sh").chmod(0o755)
    bundle = export_files(tmp_path / "img.bundle", "--files", str(src), "--as-image", ref=REF)
    doc = json.loads((bundle / "bundle.json").read_text())
    assert "artifacts" not in doc and [i["refs"] for i in doc["images"]] == [[REF]]
    (image,) = doc["images"]
    files = tree(src)
    assert len(image["layers"]) == len(files)
    config = json.loads(_blob(bundle, image["config"]["digest"]))
    assert config["rootfs"] == {"type": "layers", "diff_ids": [x["diffId"] for x in image["layers"]]}
    assert "Cmd" not in config["config"] and "Entrypoint" not in config["config"]
    manifest = json.loads(_blob(bundle, image["manifest"]["digest"]))
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    found = {}
    for layer, (title, (_, mode)) in zip(image["layers"], sorted(files.items())):
        raw = _tar_of(bundle, layer)
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == layer["diffId"]
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            members = tar.getmembers()
            regular = [m for m in members if m.isfile()]
            assert [m.name for m in regular] == [title] and all(m.isdir() for m in members if not m.isfile())
            assert regular[0].mode == mode and regular[0].mtime == 0 and regular[0].uid == 0
            found[title] = tar.extractfile(regular[0]).read()  # type: ignore[union-attr]
    assert found == {t: d for t, (d, _) in files.items()}
    # every layer an uncompressed tar (the "one uncompressed tar layer per file"), the script too, so
    # the bundle's manifest is the image's own: its digest is the layout's, the layers' digests their diff_ids
    assert {x["mediaType"] for x in image["layers"]} == {"application/vnd.oci.image.layer.v1.tar"}
    assert all(x["digest"] == x["diffId"] for x in image["layers"])
    assert manifest["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sneakernet-as-image-")]  # its layout removed
    # the same files give the same image
    again = export_files(tmp_path / "again.bundle", "--files", str(src), "--as-image", ref=REF)
    assert json.loads((again / "bundle.json").read_text())["images"][0]["config"] == image["config"]


def test_as_image_needs_files_alone(tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "--as-image", "--artifact-ref", REF, "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.startswith("error[usage]"), proc.stderr
    assert not (tmp_path / "x").exists()
    src = sharded_model(tmp_path / "m", kib=4)
    proc = run_cli("bundle", "export", "app:1", "--files", str(src), "--artifact-ref", REF, "--as-image",
                   "-o", str(tmp_path / "y"))
    assert proc.returncode == 2 and "expected the files alone" in proc.stderr, proc.stderr
    assert not (tmp_path / "y").exists()


def test_docker_loads_the_image_and_holds_each_file_byte_for_byte(docker_host: str, tmp_path: Path) -> None:
    src = sharded_model(tmp_path / "model", kib=64)
    bundle = export_files(tmp_path / "img.bundle", "--files", str(src), "--as-image", ref=REF)
    proc = run_pyz(bundle, "--docker-host", docker_host, "--no-receipt", "-q", "--force")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((bundle / "bundle.json").read_text())
    (inspected,) = json.loads(engines.docker(docker_host, "image", "inspect", f"docker.io/{REF}"))
    assert inspected["RootFS"]["Layers"] == [x["diffId"] for x in doc["images"][0]["layers"]]
    container = engines.docker(docker_host, "create", f"docker.io/{REF}", "/none").strip()  # never started
    try:
        for title, (data, _) in tree(src).items():
            out = subprocess.run(["docker", "cp", f"{container}:/{title}", "-"], capture_output=True, timeout=120,
                                 env=engines.docker_env(docker_host), check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(out)) as tar:
                member = tar.getmembers()[0]
                assert tar.extractfile(member).read() == data, title  # type: ignore[union-attr]
    finally:
        engines.docker(docker_host, "rm", container)
