"""``bundle export --files DIR --artifact-ref REF --as-image`` (issue 42 point 5, docs/files.md): the
files as a runnable-format image (FROM scratch, one tar layer per file at its title, config with
rootfs.diff_ids, an OCI manifest) that is an ordinary image of the bundle, so Docker loads it. Its
layers stream into the bundle through the export loop, nothing staged beside it (the same bundle
as the staged export wrote, no disk beyond the bundle's, a file changing while read refused)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from bundle import asimage
from bundle.asimage import LayerReader, layer_size
from bundle.blobstore import BlobStore
from bundle.cli import main as bundle_main
from bundle.fileartifact import SourceFile
from importer.errors import UsageError
from importer.format.digest import Digest
from tests.kit import engines
from tests.kit.fileskit import export_files, sharded_model, tree
from tests.kit.helpers import run_cli, run_pyz
from tests.kit.spacekit import everything_under, small_fs

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


#: files whose image the staged export (a layout beside -o, read back as oci:) made before the layers
#: streamed: a PAX header (a title over 100 bytes), an empty file, folders, three modes
GOLDEN_FILES = {"weights.bin": (bytes(range(256)) * 40, 0o644), "sub/dir/run.sh": (b"#!/bin/sh\necho hi\n", 0o755),
                "empty": (b"", 0o600), "deep/" + "n" * 120 + ".json": (b'{"k": 1}\n', 0o644)}
#: what that export wrote for them with --platform linux/arm64/v8 (manifest, config, the layers in order)
GOLDEN_MANIFEST = "sha256:e98414ef0166da671d62798987959c9da27163a3a3c1d464c7821e9fb4f4e737"
GOLDEN_CONFIG = "sha256:6ff0766f646fdf5d396bbce6e41ba1ec79e73addfe9a40190759eeec402e0d68"
GOLDEN_LAYERS = ["f9a0371b4690de445189f6610ce6a89fec22a30046f0544e000f73a4a1233305",
                 "ba06e961b23c491a8f06b0815602a51d1a2cd900416a413d3b1230a86a0ac8d1",
                 "e60b67a19e8f8afc98f3de9a54adde3c6f163fd2a42b8f610dcf42b39b0a50b7",
                 "560f712b80c040a92170d132c7b5450aee6eacaeac13411e13671ae2c0ab0776"]


def _golden_files(root: Path) -> Path:
    for rel, (data, mode) in GOLDEN_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        (root / rel).chmod(mode)
    return root


def test_the_streamed_image_is_the_one_the_staged_export_wrote(tmp_path: Path) -> None:
    """Streaming the layers changed how they are written, not one byte of what is written."""
    src = _golden_files(tmp_path / "files")
    bundle = export_files(tmp_path / "img.bundle", "--files", str(src), "--as-image", "--platform",
                          "linux/arm64/v8", ref="models/golden:1")
    doc = json.loads((bundle / "bundle.json").read_text())
    (image,) = doc["images"]
    assert image["manifest"]["digest"] == GOLDEN_MANIFEST and image["config"]["digest"] == GOLDEN_CONFIG
    assert [x["digest"].split(":")[1] for x in image["layers"]] == GOLDEN_LAYERS
    assert image["platform"] == {"os": "linux", "architecture": "arm64", "variant": "v8"}
    assert sorted(p.name for p in (bundle / "blobs" / "sha256").iterdir()) == \
        sorted([*GOLDEN_LAYERS, GOLDEN_MANIFEST.split(":")[1], GOLDEN_CONFIG.split(":")[1]])
    assert doc["source"] == {"kind": "files", "asImage": True}  # no staged layout to name
    # each layer's size was known before it was read (the free-space check and the progress total)
    sizes = {x["digest"].split(":")[1]: x["size"] for x in image["layers"]}
    for digest, title in zip(GOLDEN_LAYERS, sorted(GOLDEN_FILES)):
        data, mode = GOLDEN_FILES[title]
        assert layer_size(SourceFile(str(src / title), title, mode, len(data))) == sizes[digest], title


def test_an_as_image_export_needs_no_disk_beyond_the_bundle(tmp_path: Path) -> None:
    """A file of 8 MiB onto a disk of 11 MiB: the bundle (8 MiB of layer, the importer, the documents)
    fits; a second copy of the layer (the staged layout of old) would not."""
    src = tmp_path / "files"
    src.mkdir()
    (src / "weights.safetensors").write_bytes(os.urandom(8 * 1024 * 1024))
    with small_fs(tmp_path / "usb", "11m") as usb:
        proc = run_cli("bundle", "export", "--files", str(src), "--artifact-ref", REF, "--as-image",
                       "-o", str(usb / "img.bundle"), "-q")
        assert proc.returncode == 0, proc.stderr
        assert [p for p in everything_under(usb) if not p.startswith("img.bundle")] == []
        doc = json.loads((usb / "img.bundle" / "bundle.json").read_text())
        (layer,) = doc["images"][0]["layers"]
        assert layer["size"] > 8 * 1024 * 1024 and layer["digest"] == layer["diffId"]


def _reader(path: Path, size: int | None = None) -> LayerReader:
    return LayerReader(SourceFile(str(path), path.name, 0o644, path.stat().st_size if size is None else size))


def _drain(reader: LayerReader) -> bytes:
    return b"".join(iter(lambda: reader.read(64 * 1024), b""))


def test_a_file_that_changes_while_its_layer_is_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(300 * 1024))
    whole = _drain(_reader(path))
    assert len(whole) == layer_size(SourceFile(str(path), path.name, 0o644, 300 * 1024))
    reader = _reader(path)
    assert reader.read(10) + reader.read(-1) == whole and reader.read(-1) == b"" and reader.read(10) == b""
    reader.close()
    with pytest.raises(UsageError, match=r"\(1 bytes, unchanged while read\), found 307200 bytes "
                       r"\(it changed since it was scanned\)"):
        _drain(_reader(path, size=1))  # grew (or shrank) between the scan and the read
    for change in ("grows", "shrinks", "rewritten"):
        path.write_bytes(os.urandom(300 * 1024))
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        reader = _reader(path)
        assert reader.read(64 * 1024)  # the header and the first bytes
        if change == "grows":
            with open(path, "ab") as f:
                f.write(b"more")
        elif change == "shrinks":
            os.truncate(path, 100 * 1024)
        else:  # the same size, other bytes
            path.write_bytes(os.urandom(300 * 1024))
        with pytest.raises(UsageError, match=r"expected the file as scanned") as e:
            _drain(reader)
        assert "changed while it was read" in str(e.value), change


def test_the_export_of_a_file_changing_while_read_says_so_and_leaves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    src = sharded_model(tmp_path / "model", kib=256)
    victim = src / "model-00002-of-00003.safetensors"
    read = LayerReader.read

    def appending(self: LayerReader, n: int = -1) -> bytes:
        data = read(self, n)
        if self.file.path == str(victim) and data:
            with open(victim, "ab") as f:
                f.write(b"x")  # something still writing the file
        return data

    monkeypatch.setattr(LayerReader, "read", appending)
    out = tmp_path / "out"
    out.mkdir()
    rc = bundle_main(["export", "--files", str(src), "--artifact-ref", REF, "--as-image", "-o", str(out / "b"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error[usage]") and "Traceback" not in err, err
    assert f"exporting --as-image {victim}: expected the file as scanned" in err and "while it was read" in err, err
    assert list(out.iterdir()) == []  # no bundle, no staging folder


def test_have_leaves_out_the_held_files_without_writing_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--have: each layer hashed first, so the loop leaves out what the far side holds unwritten (no disk
    for it, as a delta of model weights wants); a file changing between the two reads is refused."""
    src = sharded_model(tmp_path / "v1", kib=64)
    base = export_files(tmp_path / "base.bundle", "--files", str(src), "--as-image", ref=REF)
    held = {x["digest"] for x in json.loads((base / "bundle.json").read_text())["images"][0]["layers"]}
    changed = src / "model-00002-of-00003.safetensors"
    changed.write_bytes(os.urandom(64 * 1024))
    committed: list[str] = []
    commit = BlobStore.commit

    def spied(self: BlobStore, tmp: str, digest: Digest, size: int) -> Any:
        committed.append(str(digest))
        return commit(self, tmp, digest, size)

    monkeypatch.setattr(BlobStore, "commit", spied)
    argv = ["export", "--files", str(src), "--artifact-ref", REF, "--as-image", "--have", str(base / "bundle.json"),
            "-q"]
    assert bundle_main([*argv, "-o", str(tmp_path / "delta.bundle")]) == 0, capsys.readouterr().err
    layers = json.loads((tmp_path / "delta.bundle" / "bundle.json").read_text())["images"][0]["layers"]
    # config.json, the three shards, the index: only the second shard's layer is carried
    assert [x.get("external", False) for x in layers] == [True, True, False, True, True]
    assert not held & set(committed) and layers[2]["digest"] in committed  # nothing held was ever written
    capsys.readouterr()
    hashed = asimage._hashed

    def then_changed(f: SourceFile) -> Digest:
        digest = hashed(f)
        if f.path == str(changed):
            st = changed.stat()
            changed.write_bytes(os.urandom(64 * 1024))  # the same size and time, other bytes
            os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns))
        return digest

    monkeypatch.setattr(asimage, "_hashed", then_changed)
    out = tmp_path / "again"
    out.mkdir()
    rc = bundle_main([*argv, "-o", str(out / "delta.bundle")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error[usage]") and "Traceback" not in err, err
    assert f"{changed}: expected the file as scanned" in err and "changed between the two reads" in err, err
    assert list(out.iterdir()) == []
