"""File deltas (issue 42 point 4, schema 3.8, docs/files.md): the inventory of a ``--files-to``
folder lists its files by digest; ``bundle export --files ... --have`` leaves out every file the far
side holds (a new model version that changes one shard carries one shard); the importer completes
the delta from the folder, checked by reading it, or refuses before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.kit import engines
from tests.kit.clijson import validate
from tests.kit.fileskit import edit_bundle_json, export_files, sha256sum_c, sharded_model, tree
from tests.kit.helpers import run_cli, run_pyz
from tests.kit.layoutgen import write_layout
from tests.kit.servekit import request, serving

REF1, REF2 = "models/shards:1", "models/shards:2"
KIB = 256


def _doc(bundle: Path) -> dict:
    return json.loads((bundle / "bundle.json").read_text())


def _inventory(target: Path, *bundle: Path) -> dict:
    proc = run_cli("importer", *map(str, bundle), "--inventory", "--files-to", str(target))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _import(bundle: Path, target: Path, *args: str) -> tuple[int, dict]:
    proc = run_pyz(bundle, "--files-to", str(target), "--no-receipt", "--json", "-q", *args)
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def v1_placed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a model of 3 shards, the folder its version 1 bundle was written to)."""
    root = tmp_path_factory.mktemp("delta")
    src = sharded_model(root / "v1", kib=KIB)
    bundle = export_files(root / "v1.bundle", "--files", str(src), "--model", ref=REF1)
    target = root / "placed"
    code, _ = _import(bundle, target)
    assert code == 0
    return src, target


def _v2_delta(tmp_path: Path, have: Path) -> tuple[Path, Path]:
    src = sharded_model(tmp_path / "v2", kib=KIB, changed=(2,))
    return src, export_files(tmp_path / "v2.delta", "--files", str(src), "--model", "--have", str(have), ref=REF2)


def _copy(src: Path, dst: Path) -> Path:
    for rel, (data, mode) in tree(src).items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(data)
        (dst / rel).chmod(mode)
    return dst


def test_the_inventory_of_a_folder_lists_its_files_by_digest(v1_placed: tuple[Path, Path], tmp_path: Path) -> None:
    src, target = v1_placed
    doc = _inventory(target)
    assert doc["inventoryVersion"] == "1.5" and doc["engine"]["kind"] == "folder" and doc["images"] == []
    assert {f["title"]: f["digest"] for f in doc["files"]} == {
        rel: "sha256:" + hashlib.sha256(data).hexdigest() for rel, (data, _) in tree(src).items()}
    validate("inventory", doc)  # schemas/cli/inventory.schema.json, the inventory schema 1.5 in it
    # nothing is followed: a link (to a file or a folder) below DIR is skipped and counted, never read
    other = _copy(src, tmp_path / "other")
    (other / "link.safetensors").symlink_to(other / "config.json")
    (other / "linked").symlink_to(src)
    doc = _inventory(other)
    assert "link.safetensors" not in {f["title"] for f in doc["files"]} and doc["skipped"] == 2
    assert not any(f["title"].startswith("linked/") for f in doc["files"])
    # with a bundle: only the paths its files take are read
    (other / "unrelated.bin").write_bytes(b"x" * 10)
    bundle = export_files(tmp_path / "b", "--file", f"{src / 'config.json'}=config.json",
                          "--file", f"{src / 'config.json'}=missing.json", ref="x/y:1")
    doc = _inventory(other, bundle)
    assert [f["title"] for f in doc["files"]] == ["config.json"] and doc["skipped"] == 1


def test_a_new_version_changing_one_shard_carries_one_shard(v1_placed: tuple[Path, Path], tmp_path: Path) -> None:
    _, placed = v1_placed
    target = _copy(placed, tmp_path / "target")
    have = tmp_path / "have.json"
    have.write_text(json.dumps(_inventory(target)))
    src, delta = _v2_delta(tmp_path, have)
    doc = _doc(delta)
    assert doc["schemaVersion"] == "3.8"
    (art,) = doc["artifacts"]
    carried = [f for f in art["files"] if not f.get("external")]
    assert [f["title"] for f in carried] == ["model-00002-of-00003.safetensors"]
    assert len([f for f in art["files"] if f.get("external")]) == 4  # two shards, the config, the index
    blobs = sorted((delta / "blobs" / "sha256").iterdir())
    assert len(blobs) == 3  # the manifest, the config, one shard
    assert sum(p.stat().st_size for p in blobs) < KIB * 1024 + 4096
    assert {f["path"] for f in doc["files"]} >= {"blobs/sha256/" + carried[0]["digest"][7:]}
    assert run_pyz(delta, "--verify-only").returncode == 0
    # the folder holding version 1 becomes version 2 (the changed shard replaced: --force), byte for byte
    code, out = _import(delta, target)
    assert code == 7 and out["error"]["id"] == "file-conflict" and "--force" in out["error"]["hint"]
    code, out = _import(delta, target, "--force")
    assert code == 0, out
    actions = {f["title"]: f["action"] for f in out["files"]["files"]}
    assert actions.pop("model-00002-of-00003.safetensors") == "replaced" and set(actions.values()) == {"held"}
    check = sha256sum_c(src, target)
    assert check.returncode == 0, check.stdout + check.stderr
    assert not [p for p in target.iterdir() if p.name.startswith(".sneakernet-staging-")]
    # an earlier bundle's bundle.json says the same (its files were written at their titles)
    _, again = _v2_delta(tmp_path / "again", placed.parent / "v1.bundle" / "bundle.json")
    assert [f["title"] for f in _doc(again)["artifacts"][0]["files"] if not f.get("external")] == [
        "model-00002-of-00003.safetensors"]


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_a_held_file_missing_or_changed_is_refused_with_nothing_written(v1_placed: tuple[Path, Path],
                                                                        tmp_path: Path, damage: str) -> None:
    _, placed = v1_placed
    have = tmp_path / "have.json"
    have.write_text(json.dumps(_inventory(placed)))
    _, delta = _v2_delta(tmp_path, have)
    target = _copy(placed, tmp_path / "target")
    shard = target / "model-00003-of-00003.safetensors"
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:-1] + b"!")
    before = tree(target)
    code, out = _import(delta, target, "--force")
    assert code == 9 and out["error"]["id"] == "delta-base-missing", out
    message = out["error"]["message"]
    assert "model-00003-of-00003.safetensors" in message and ("missing" if damage == "missing" else "other bytes") \
        in message and "nothing was written" in out["error"]["hint"]
    assert tree(target) == before and sorted(os.listdir(target)) == sorted(before)  # no staging folder either


def test_a_bundle_of_the_wrong_schema_cannot_leave_a_file_out(v1_placed: tuple[Path, Path], tmp_path: Path) -> None:
    src, _ = v1_placed
    bundle = export_files(tmp_path / "full", "--files", str(src), ref=REF1)

    def leave_out(doc: dict) -> None:  # a 3.6 bundle marking a file external: refused, its bytes would go unchecked
        doc["artifacts"][0]["files"][0]["external"] = True

    edit_bundle_json(bundle, leave_out)
    proc = run_pyz(bundle, "--verify-only")
    assert proc.returncode == 4 and "expected schemaVersion 3.8 or later" in proc.stderr, proc.stderr

    def as_delta(doc: dict) -> None:  # 3.8 but the held file still listed (and stored)
        doc["schemaVersion"] = "3.8"

    edit_bundle_json(bundle, as_delta)
    proc = run_pyz(bundle, "--verify-only")
    assert proc.returncode == 4 and "expected a held file not listed in files" in proc.stderr, proc.stderr


def test_the_oci_layout_target_refuses_a_file_delta(v1_placed: tuple[Path, Path], tmp_path: Path) -> None:
    _, placed = v1_placed
    have = tmp_path / "have.json"
    have.write_text(json.dumps(_inventory(placed)))
    _, delta = _v2_delta(tmp_path, have)
    layout = tmp_path / "layout"
    proc = run_pyz(delta, "--engine", "oci", "--oci-dir", str(layout), "--no-receipt")
    assert proc.returncode == 2 and "file delta" in proc.stderr and "--files-to DIR" in proc.stderr, proc.stderr
    assert not (layout / "index.json").exists()


def test_a_registry_completes_a_file_delta_from_the_repository(v1_placed: tuple[Path, Path], tmp_path: Path) -> None:
    """bundle push of the delta: the held files must be in the destination repository (HEAD), else
    exit 9 with nothing pushed; there, only the changed shard is uploaded and the artifact reads back whole."""
    _, placed = v1_placed
    v1 = placed.parent / "v1.bundle"
    _, delta = _v2_delta(tmp_path, v1 / "bundle.json")
    with engines.private_registry(f"fdelta-{os.getpid()}") as reg:
        proc = run_cli("bundle", "push", str(delta), f"{reg.addr}/other", "--json")  # the base is not there
        assert proc.returncode == 9, proc.stdout + proc.stderr
        error = json.loads(proc.stdout)["error"]
        assert error["id"] == "delta-base-missing" and "nothing was pushed" in error["hint"]
        assert "model-00001-of-00003.safetensors" in (error.get("context") or "")
        assert run_cli("bundle", "push", str(v1), f"{reg.addr}/ns", "--json").returncode == 0
        # the registry's inventory lists its blobs by digest: a delta against it leaves the same files out
        inventory = run_cli("importer", "--inventory", "--registry", f"{reg.addr}/ns", check=True).stdout
        (tmp_path / "reg.json").write_text(inventory)
        _, against = _v2_delta(tmp_path / "reg", tmp_path / "reg.json")
        assert [f["title"] for f in _doc(against)["artifacts"][0]["files"] if not f.get("external")] == [
            "model-00002-of-00003.safetensors"]
        proc = run_cli("bundle", "push", str(against), f"{reg.addr}/ns", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (pushed,) = json.loads(proc.stdout)["fileArtifacts"]
        assert pushed["readBack"]["ok"] and pushed["blobsUploaded"] == 2  # the changed shard and the config
        assert pushed["bytesUploaded"] < KIB * 1024 + 4096


def test_a_missing_held_file_is_found_before_any_image_is_loaded(v1_placed: tuple[Path, Path], tmp_path: Path) -> None:
    """A bundle of an image and a file delta: the held files are read before the engine is even asked
    (here none answers), so nothing is loaded when one is missing."""
    _, placed = v1_placed
    write_layout(tmp_path / "layout")
    have = tmp_path / "have.json"
    have.write_text(json.dumps(_inventory(placed)))
    src = sharded_model(tmp_path / "v2", kib=KIB, changed=(2,))
    bundle = export_files(tmp_path / "both", f"oci:{tmp_path / 'layout'}:multi/app:1", "--files", str(src),
                          "--have", str(have), ref=REF2)
    assert _doc(bundle)["schemaVersion"] == "3.8" and len(_doc(bundle)["images"]) == 1
    target = tmp_path / "empty"
    target.mkdir()
    proc = run_pyz(bundle, "--files-to", str(target), "--engine", "docker", "--docker-host",
                   f"unix://{tmp_path / 'no-engine.sock'}", "--no-receipt", "-q")
    assert proc.returncode == 9 and "delta-base-missing" in proc.stderr and "no-engine" not in proc.stderr, proc.stderr
    assert list(target.iterdir()) == []


def test_serve_leaves_a_file_delta_out_and_says_so(v1_placed: tuple[Path, Path], tmp_path: Path) -> None:
    """serve cannot complete a file delta (its held files are not in the bundle): the artifact is not
    served (no tag, its manifest unknown), one line says why, the rest of the bundle is served."""
    _, placed = v1_placed
    _, delta = _v2_delta(tmp_path, placed.parent / "v1.bundle" / "bundle.json")
    manifest = _doc(delta)["artifacts"][0]["manifest"]["digest"]
    with serving(delta / "bundle-import.pyz", delta) as s:
        assert not [r for r in s.start["repositories"] if r["name"] == "models/shards"]
        status, _, _ = request(s.addr, "GET", f"/v2/models/shards/manifests/{manifest}")
        assert status == 404
        assert f"not serving the artifact {REF2}: it is a file delta" in s.stderr()
