"""Files and model weights carried as OCI artifacts (schema 3.6, issue 42, docs/files.md): exported
through the real CLI, checked with plain sha256sum, written on the far side by the bundled importer."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.kit.fileskit import MODEL_FILES, MODEL_REF, export_files, model_bundle, model_dir
from tests.kit.helpers import run_cli
from tests.kit.layoutgen import write_layout
from tests.kit.oci_schemas import validate_oci
from tests.kit.trustkit import sums_accept

WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"


def _doc(bundle: Path) -> dict:
    return json.loads((bundle / "bundle.json").read_text())


def _blob(bundle: Path, digest: str) -> bytes:
    return (bundle / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()


# --------------------------------------------------------------------------------------- export

def test_a_model_folder_is_one_artifact_of_raw_layers(tmp_path: Path) -> None:
    src, bundle = model_bundle(tmp_path)
    doc = _doc(bundle)
    assert doc["schemaVersion"] == "3.6" and doc["images"] == []
    (art,) = doc["artifacts"]
    assert art["ref"] == MODEL_REF and art["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    files = {f["title"]: f for f in art["files"]}
    assert sorted(files) == sorted(MODEL_FILES)
    for title, mode in MODEL_FILES.items():  # one raw layer per file: its digest is sha256sum FILE
        data = (src / title).read_bytes()
        assert files[title]["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
        assert files[title]["size"] == len(data) and files[title]["mode"] == f"0{mode:03o}"
    assert files["model.safetensors"]["mediaType"] == WEIGHT
    assert files["config.json"]["mediaType"] == files["tokenizer/tokenizer.json"]["mediaType"] == WEIGHT_CONFIG
    assert files["README.md"]["mediaType"] == "application/vnd.cncf.model.doc.v1.raw"
    assert files["scripts/run.sh"]["mediaType"] == "application/vnd.cncf.model.code.v1.raw"
    assert sums_accept(bundle)  # sha256sum -c SHA256SUMS checks the weights with nothing else
    sums = (bundle / "SHA256SUMS").read_text().splitlines()
    assert all(f"{f['digest'][7:]}  blobs/sha256/{f['digest'][7:]}" in sums for f in art["files"])
    manifest = json.loads(_blob(bundle, art["manifest"]["digest"]))
    validate_oci("manifest", manifest)
    assert manifest["artifactType"] == art["artifactType"]
    assert [(x["annotations"]["org.opencontainers.image.title"], x["annotations"]["org.cncf.model.filepath"])
            for x in manifest["layers"]] == [(f["title"], f["title"]) for f in art["files"]]
    config = json.loads(_blob(bundle, art["config"]["digest"]))
    assert config["modelfs"]["diff_ids"] == [f["digest"] for f in art["files"]]
    assert config["descriptor"] == {"name": "models/llama", "version": "3.1"}
    index = json.loads((bundle / "index.json").read_text())
    validate_oci("index", index)
    assert index["manifests"] == [{**art["manifest"], "artifactType": art["artifactType"],
                                   "annotations": {"org.opencontainers.image.ref.name": MODEL_REF}}]
    again = export_files(tmp_path / "again.bundle", "--files", str(src), "--model")
    assert _doc(again)["artifacts"] == doc["artifacts"]  # the same files give the same artifact


def test_plain_files_get_the_empty_config(tmp_path: Path) -> None:
    src = model_dir(tmp_path / "m", mib=1)
    bundle = export_files(tmp_path / "b", "--file", f"{src / 'config.json'}=etc/app.json",
                          "--file", str(src / "README.md"), ref="files/app:1")
    (art,) = _doc(bundle)["artifacts"]
    assert art["artifactType"] == "application/vnd.sneakernet.files.v1"
    assert art["config"]["mediaType"] == "application/vnd.oci.empty.v1+json" and art["config"]["size"] == 2
    assert [(f["title"], f["mediaType"]) for f in art["files"]] == [
        ("README.md", "application/octet-stream"), ("etc/app.json", "application/octet-stream")]
    assert _blob(bundle, art["config"]["digest"]) == b"{}"


def test_files_beside_images(tmp_path: Path) -> None:
    write_layout(tmp_path / "layout")
    src = model_dir(tmp_path / "m", mib=1)
    bundle = export_files(tmp_path / "b", f"oci:{tmp_path / 'layout'}:multi/app:1", "--files", str(src))
    doc = _doc(bundle)
    assert doc["schemaVersion"] == "3.6" and [i["refs"] for i in doc["images"]] == [["multi/app:1"]]
    names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name")
             for m in json.loads((bundle / "index.json").read_text())["manifests"]]
    assert "multi/app:1" in names and MODEL_REF in names
    assert run_cli("importer", str(bundle), "--verify-only", "-q").returncode == 0
    clash = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:multi/app:1", "--files", str(src),
                    "--artifact-ref", "multi/app:1", "-o", str(tmp_path / "clash"), "-q")
    assert clash.returncode == 2 and "no image of the bundle carries" in clash.stderr
    assert not (tmp_path / "clash").exists()


@pytest.mark.parametrize("hostile", ["symlink", "fifo", "no-ref", "ref-digest", "duplicate", "file-and-folder",
                                     "empty"])
def test_an_export_that_cannot_carry_the_files_writes_nothing(tmp_path: Path, hostile: str) -> None:
    src = model_dir(tmp_path / "m", mib=1)
    args = ["--files", str(src)]
    ref = ["--artifact-ref", MODEL_REF]
    if hostile == "symlink":
        (src / "tokenizer" / "passwd").symlink_to("/etc/passwd")
    elif hostile == "fifo":
        os.mkfifo(src / "scripts" / "pipe")
    elif hostile == "no-ref":
        ref = []
    elif hostile == "ref-digest":
        ref = ["--artifact-ref", "models/llama@sha256:" + "0" * 64]
    elif hostile == "duplicate":
        args += ["--file", f"{src / 'README.md'}=config.json"]
    elif hostile == "file-and-folder":
        args += ["--file", f"{src / 'README.md'}=scripts/run.sh/x"]
    else:
        (tmp_path / "none").mkdir()
        args = ["--files", str(tmp_path / "none")]
    out = tmp_path / "out"
    proc = run_cli("bundle", "export", *args, *ref, "-o", str(out), "-q")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 2 and proc.stderr.startswith("error[usage]:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", *(["none"] if hostile == "empty" else [])]
