"""Files and model weights carried as OCI artifacts (schema 3.6, issue 42, docs/files.md): exported
through the real CLI, checked with plain sha256sum, written on the far side by the bundled importer."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.kit.fileskit import MODEL_FILES, MODEL_REF, edit_bundle_json, export_files, model_bundle, model_dir, tree
from tests.kit.helpers import run_cli, run_pyz, start_pyz
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
    info = json.loads(run_cli("bundle", "inspect", str(bundle), "--json", check=True).stdout)
    (shown,) = info["artifacts"]  # bundle inspect lists the file artifacts (it showed images only)
    assert (shown["ref"], shown["manifestDigest"], [f["title"] for f in shown["files"]]) == (
        "files/app:1", art["manifest"]["digest"], ["README.md", "etc/app.json"])
    assert shown["size"] == art["manifest"]["size"] + 2 + sum(f["size"] for f in art["files"])
    table = run_cli("bundle", "inspect", str(bundle), check=True).stdout
    assert "files/app:1" in table and "application/vnd.sneakernet.files.v1" in table


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


# --------------------------------------------------------------------------------------- import

def _import(bundle: Path, dest: Path, *extra: str, pyz: Path | None = None,
            receipts: Path | None = None) -> tuple[int, str, dict]:
    """The bundled importer (python3 only) with --files-to DEST; (exit code, stderr, receipt)."""
    receipts = receipts or dest.parent
    receipt = receipts / f"{dest.name}-{len(list(receipts.glob('*.receipt.json')))}.receipt.json"
    proc = run_pyz(bundle, "--files-to", str(dest), "--receipt", str(receipt), "-q", *extra, pyz=pyz)
    doc = json.loads(receipt.read_text()) if receipt.exists() else {}
    return proc.returncode, proc.stderr, doc


def test_import_writes_the_files_byte_identical_with_modes(tmp_path: Path) -> None:
    src, bundle = model_bundle(tmp_path)
    dest = tmp_path / "dest"
    code, err, receipt = _import(bundle, dest)
    assert code == 0, err
    assert tree(dest) == tree(src)  # bytes and modes, nested folders, the empty file
    assert receipt["result"] == "pass" and receipt["engine"] is None
    rows = {f["title"]: f for f in receipt["files"]["files"]}
    assert sorted(rows) == sorted(MODEL_FILES) and {f["action"] for f in rows.values()} == {"written"}
    assert rows["model.safetensors"]["digest"] == "sha256:" + hashlib.sha256(
        (src / "model.safetensors").read_bytes()).hexdigest()
    assert rows["scripts/run.sh"]["mode"] == "0755" and rows["model.safetensors"]["size"] == 3 * 1024 * 1024
    code, err, receipt = _import(bundle, dest)  # a second import is a no-op
    assert code == 0, err
    assert {f["action"] for f in receipt["files"]["files"]} == {"unchanged"}
    assert tree(dest) == tree(src)


def test_an_existing_different_file_is_refused_and_nothing_written(tmp_path: Path) -> None:
    src, bundle = model_bundle(tmp_path, mib=1)
    dest = tmp_path / "dest"
    (dest / "tokenizer").mkdir(parents=True)
    (dest / "tokenizer" / "tokenizer.json").write_text("mine")
    code, err, receipt = _import(bundle, dest)
    assert code == 7 and "error[file-conflict]" in err and "tokenizer/tokenizer.json" in err, err
    assert "Traceback" not in err and receipt["result"] == "fail"
    assert tree(dest) == {"tokenizer/tokenizer.json": (b"mine", 0o644)}
    code, err, _ = _import(bundle, dest, "--force")  # --force replaces a file (never a folder or a link)
    assert code == 0, err
    assert tree(dest) == tree(src)


@pytest.mark.parametrize("form", ["folder", "parts"])
def test_an_interrupted_import_resumes(tmp_path: Path, form: str) -> None:
    """Killed mid-import (SIGKILL), run again: it resumes; from parts smaller than the weights
    file too (a file that crosses parts, as a 70 GB file crosses 4 GiB parts)."""
    src, bundle = model_bundle(tmp_path)
    given, pyz = bundle, bundle / "bundle-import.pyz"
    if form == "parts":
        run_cli("bundle", "pack", str(bundle), str(tmp_path / "usb" / "m.tar"), "--split", "1M", "-q", check=True)
        given, pyz = tmp_path / "usb" / "m.tar.parts.json", tmp_path / "usb" / "bundle-import.pyz"
        assert len(list((tmp_path / "usb").glob("m.tar.part[0-9]*"))) > 3  # the 3 MiB weights span parts
    dest, held = tmp_path / "dest", tmp_path / "held.pid"
    proc = start_pyz(pyz, str(given), "--files-to", str(dest), "--no-receipt", "-q",
                     env={"SNEAKERNET_TEST_HOLD_AT": "files-staged", "SNEAKERNET_TEST_HOLD_FILE": str(held)})
    deadline = time.monotonic() + 60
    while not held.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held.exists(), proc.communicate()
    proc.send_signal(signal.SIGKILL)  # a crash: no clean-up runs
    proc.wait()
    staged = [p for p in dest.glob(".sneakernet-staging-*/*")]
    assert len(staged) == 1 and not any((dest / t).exists() for t in MODEL_FILES)
    code, err, receipt = _import(given, dest, pyz=pyz)
    assert code == 0, err
    actions = [f["action"] for f in receipt["files"]["files"]]
    assert actions.count("resumed") == 1 and actions.count("written") == len(MODEL_FILES) - 1
    assert tree(dest) == tree(src) and not list(dest.glob(".sneakernet-staging-*"))


@pytest.mark.parametrize("form", ["tar", "parts"])
def test_a_tar_or_parts_import_the_same(tmp_path: Path, form: str) -> None:
    src, bundle = model_bundle(tmp_path, mib=2)
    tar = tmp_path / "model.tar"
    split = ["--split", "1M"] if form == "parts" else []
    run_cli("bundle", "pack", str(bundle), str(tar), *split, "-q", check=True)
    given = tmp_path / "model.tar.parts.json" if form == "parts" else tar
    code, err, _ = _import(given, tmp_path / "dest", pyz=tmp_path / "bundle-import.pyz")
    assert code == 0, err
    assert tree(tmp_path / "dest") == tree(src)


def test_verify_only_covers_the_files(tmp_path: Path) -> None:
    _, bundle = model_bundle(tmp_path, mib=1)
    art = _doc(bundle)["artifacts"][0]
    weights = bundle / "blobs" / "sha256" / art["files"][0]["digest"][7:]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    proc = run_pyz(bundle, "--verify-only", "-q")
    assert proc.returncode == 3 and "digest-mismatch" in proc.stderr, proc.stderr
    code, err, _ = _import(bundle, tmp_path / "dest")
    assert code == 3 and not (tmp_path / "dest").exists(), err


def _retitle(title: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["artifacts"][0]["files"][0]["title"] = title
    return change


def _lying_size(doc: dict) -> None:
    f = doc["artifacts"][0]["files"][-1]
    f["size"] += 1
    for entry in doc["files"]:
        if entry["digest"] == f["digest"]:
            entry["size"] += 1


@pytest.mark.parametrize("change, code, what", [
    (_retitle("../x"), 4, "normalized path"),
    (_retitle("/etc/x"), 4, "absolute"),
    (_retitle("a/../../x"), 4, "normalized path"),
    (_retitle("."), 4, "normalized path"),
    (_retitle(".."), 4, "normalized path"),
    (_retitle("a\x00b"), 4, "control character"),
    (_retitle("d/" + "n" * 300), 4, "at most 255"),
    (_retitle("config.json"), 4, "each title once"),
    (_lying_size, 3, "size-mismatch"),
], ids=["dotdot", "absolute", "inner-dotdot", "dot", "just-dotdot", "nul", "too-long", "duplicate", "lying-size"])
def test_a_hostile_bundle_writes_nothing(tmp_path: Path, change: Callable[[dict], None], code: int,
                                          what: str) -> None:
    _, bundle = model_bundle(tmp_path, mib=1)
    edit_bundle_json(bundle, change)
    dest = tmp_path / "box" / "dest"
    got, err, _ = _import(bundle, dest, receipts=tmp_path)
    assert got == code and what in err and "Traceback" not in err, err
    assert not (tmp_path / "box").exists() and not (tmp_path / "x").exists()


def test_a_link_in_the_target_is_never_followed(tmp_path: Path) -> None:
    _, bundle = model_bundle(tmp_path, mib=1)
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest.mkdir()
    (dest / "tokenizer").symlink_to(elsewhere)
    code, err, _ = _import(bundle, dest)
    assert code == 2 and "error[unwritable-destination]" in err, err
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in dest.iterdir()) == ["tokenizer"]


def test_files_only_leaves_the_images_and_a_files_bundle_needs_no_files_to(tmp_path: Path) -> None:
    write_layout(tmp_path / "layout")
    src = model_dir(tmp_path / "m", mib=1)
    both = export_files(tmp_path / "both", f"oci:{tmp_path / 'layout'}:multi/app:1", "--files", str(src))
    code, err, receipt = _import(both, tmp_path / "dest", "--files-only")
    assert code == 0 and receipt["images"] == [] and tree(tmp_path / "dest") == tree(src), err
    _, only = model_bundle(tmp_path / "o", mib=1)
    proc = run_pyz(only, "--no-receipt", "-q", "--engine", "docker", env={"DOCKER_HOST": "unix:///nonexistent"})
    assert proc.returncode == 2 and "--files-to DIR" in proc.stderr, proc.stderr  # refused before any engine
    proc = run_pyz(only, "--no-receipt", "-q", "--engine", "oci", "--oci-dir", str(tmp_path / "oci-only"))
    assert proc.returncode == 0, proc.stderr  # an OCI layout takes the artifact itself (tests/test_files_transports.py)
    into = run_pyz(both, "--files-to", str(tmp_path / "dest2"), "--engine", "oci", "--oci-dir", str(tmp_path / "oci"),
                   "--no-receipt", "-q")
    assert into.returncode == 0 and tree(tmp_path / "dest2") == tree(src), into.stderr
    assert (tmp_path / "oci" / "index.json").exists()
