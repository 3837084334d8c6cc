"""Records that contradict each other are refused, in a folder and in a tar alike.

Each hostile bundle below is re-pinned after its mutation (bundle.json ``files``, SHA256SUMS, the
manifest and index.json that point at a rewritten blob), so every plain hash check passes and
only the consistency rule under test can catch it:

1. every record of a shared layer blob agrees (mediaType, size, diffId, uncompressedSize, external);
2. ``external`` only in a delta bundle (schema 3.1+), on a layer that is neither listed nor stored;
3. index.json, manifests, configs, the descriptors inside them and ``rootfs`` are JSON objects;
4. SHA256SUMS lists exactly what bundle.json lists (an empty or partial one is refused);
5. SHA256SUMS lines are split as ``sha256sum -c`` splits them (on LF only) and are strict.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bundle.archive import pack_bundle
from importer.format.sums import parse_sums
from importer.verify.archive import verify_archive
from importer.verify.bundle import verify_bundle
from tests.kit.trustkit import regenerate_sums, sums_accept

BLOBS = "blobs/sha256/"
FAKE_DIFF_ID = "sha256:" + "ab" * 32
GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
BASE, APP = 0, 1  # sample_images(): fake/base:1 [base, empty], fake/app:2 [base, empty, top]




# ============================================================================ re-pinning


def _doc(b: Path) -> dict[str, Any]:
    return json.loads((b / "bundle.json").read_text())


def _read_blob(b: Path, digest: str) -> Any:
    return json.loads((b / BLOBS / digest[7:]).read_bytes())


def _put_blob(b: Path, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (b / BLOBS / digest[7:]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def _replace_manifest(b: Path, doc: dict[str, Any], i: int, edit: Callable[[Any], Any]) -> None:
    """Rewrite image i's manifest blob through ``edit``; bundle.json and index.json follow it."""
    image = doc["images"][i]
    old = image["manifest"]["digest"]
    value = edit(_read_blob(b, old))
    (b / BLOBS / old[7:]).unlink()
    desc = _put_blob(b, json.dumps(value).encode())
    image["manifest"].update(desc)
    index = json.loads((b / "index.json").read_text())
    for entry in index["manifests"]:
        if entry["digest"] == old:
            entry.update(desc)
    (b / "index.json").write_text(json.dumps(index))


def _replace_config(b: Path, doc: dict[str, Any], i: int, edit: Callable[[Any], Any]) -> None:
    """Rewrite image i's config blob through ``edit``; its manifest, bundle.json follow it."""
    image = doc["images"][i]
    old = image["config"]["digest"]
    value = edit(_read_blob(b, old))
    (b / BLOBS / old[7:]).unlink()
    desc = _put_blob(b, json.dumps(value).encode())
    image["config"].update(desc)
    _replace_manifest(b, doc, i, lambda m: {**m, "config": {**m["config"], **desc}})


def _repin(b: Path, doc: dict[str, Any], *, unlisted: tuple[str, ...] = ()) -> None:
    """bundle.json ``files`` from what is on disk (but ``unlisted``), then SHA256SUMS over them."""
    files = []
    for p in sorted(b.rglob("*")):
        rel = p.relative_to(b).as_posix()
        if p.is_file() and rel not in ("bundle.json", "SHA256SUMS", "bundle.json.sig", *unlisted):
            data = p.read_bytes()
            files.append({"path": rel, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)})
    doc["files"] = files
    (b / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    hidden = [(b / rel, b.parent / f"hidden-{i}") for i, rel in enumerate(unlisted)]
    for src, dst in hidden:  # SHA256SUMS agrees with bundle.json: only the rule under test trips
        src.rename(dst)
    regenerate_sums(b)
    for src, dst in hidden:
        dst.rename(src)


def _problems(b: Path, tmp_path: Path, *, add_members: tuple[str, ...] = ()) -> dict[str, list[tuple[str, str]]]:
    """id -> [(path, message)] for the folder and for the same bundle packed as a tar (plus
    ``add_members``, files of the folder appended to the tar as a hand-made archive would hold)."""
    tar = tmp_path / "packed" / "fake.tar"
    pack_bundle(str(b), str(tar))
    if add_members:
        with tarfile.open(tar, "a", format=tarfile.PAX_FORMAT) as t:
            for rel in add_members:
                data = (b / rel).read_bytes()
                info = tarfile.TarInfo(rel)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    found: dict[str, list[tuple[str, str]]] = {}
    for where, report in (("folder", verify_bundle(str(b))), ("tar", verify_archive(str(tar)))):
        for p in report.problems:
            found.setdefault(f"{where}:{p.id}", []).append((p.path, p.message))
    return found


def _assert_both(found: dict[str, list[tuple[str, str]]], problem_id: str, *words: str) -> None:
    for where in ("folder", "tar"):
        hits = found.get(f"{where}:{problem_id}")
        assert hits, f"{where}: expected [{problem_id}], found {sorted(found)}"
        assert any(all(w in f"{path}: {msg}" for w in words) for path, msg in hits), (where, hits, words)


def test_the_repinned_pristine_bundle_passes(bundle: Path, tmp_path: Path) -> None:
    """The re-pinning itself introduces no problem (so each case below trips its rule only)."""
    doc = _doc(bundle)
    _replace_config(bundle, doc, APP, lambda c: c)
    _repin(bundle, doc)
    assert _problems(bundle, tmp_path) == {}
    assert sums_accept(bundle)


# ============================================================================ 1. shared layer records agree


def _lie_diff_id(b: Path, doc: dict[str, Any]) -> None:
    """The app's config and record claim another diffId for the layer it shares with the base."""
    doc["images"][APP]["layers"][0]["diffId"] = FAKE_DIFF_ID
    _replace_config(b, doc, APP, lambda c: {**c, "rootfs": {**c["rootfs"],
                                                           "diff_ids": [FAKE_DIFF_ID, *c["rootfs"]["diff_ids"][1:]]}})


def _lie_uncompressed_size(b: Path, doc: dict[str, Any]) -> None:
    doc["images"][APP]["layers"][0]["uncompressedSize"] += 4096


def _lie_media_type(b: Path, doc: dict[str, Any]) -> None:
    doc["images"][APP]["layers"][0]["mediaType"] = GZIP
    _replace_manifest(b, doc, APP, lambda m: {**m, "layers": [{**m["layers"][0], "mediaType": GZIP},
                                                               *m["layers"][1:]]})


def _lie_external(b: Path, doc: dict[str, Any]) -> None:
    doc["schemaVersion"] = "3.1"
    doc["images"][APP]["layers"][0]["external"] = True


def _lie_size(b: Path, doc: dict[str, Any]) -> None:
    """Both records external (a valid delta so far), but they disagree on the blob's size."""
    doc["schemaVersion"] = "3.1"
    for image in doc["images"]:
        image["layers"][0]["external"] = True
    (b / BLOBS / doc["images"][BASE]["layers"][0]["digest"][7:]).unlink()
    doc["images"][APP]["layers"][0]["size"] += 1
    _replace_manifest(b, doc, APP, lambda m: {**m, "layers": [{**m["layers"][0], "size": m["layers"][0]["size"] + 1},
                                                               *m["layers"][1:]]})


LIES = {"diffId": _lie_diff_id, "uncompressedSize": _lie_uncompressed_size, "mediaType": _lie_media_type,
        "external": _lie_external, "size": _lie_size}


@pytest.mark.parametrize("field", sorted(LIES))
def test_records_of_a_shared_layer_must_agree(bundle: Path, tmp_path: Path, field: str) -> None:
    doc = _doc(bundle)
    LIES[field](bundle, doc)
    _repin(bundle, doc)
    found = _problems(bundle, tmp_path)
    _assert_both(found, "layer-record-conflict", field, "fake/base:1", "fake/app:2",
                 doc["images"][BASE]["layers"][0]["digest"])


# ============================================================================ 2. external only where a delta allows it


def test_external_layer_listed_in_files_is_refused(bundle: Path, tmp_path: Path) -> None:
    """The top layer claims to be external, yet is stored: its diffId check would be skipped, so
    any bytes could stand there (here: not a layer at all)."""
    doc = _doc(bundle)
    doc["schemaVersion"] = "3.1"
    top = doc["images"][APP]["layers"][2]
    (bundle / BLOBS / top["digest"][7:]).unlink()
    desc = _put_blob(bundle, b"not a layer")
    top.update(desc, external=True)
    _replace_manifest(bundle, doc, APP, lambda m: {**m, "layers": [*m["layers"][:2], {**m["layers"][2], **desc}]})
    _repin(bundle, doc)
    found = _problems(bundle, tmp_path)
    _assert_both(found, "invalid-external-layer", desc["digest"], "listed in files")


def test_external_layer_present_but_unlisted_is_refused(bundle: Path, tmp_path: Path) -> None:
    doc = _doc(bundle)
    doc["schemaVersion"] = "3.1"
    top = doc["images"][APP]["layers"][2]
    top["external"] = True
    path = BLOBS + top["digest"][7:]
    _repin(bundle, doc, unlisted=(path,))
    found = _problems(bundle, tmp_path, add_members=(path,))
    _assert_both(found, "invalid-external-layer", top["digest"], "stored in the bundle")


def test_external_layer_in_a_full_bundle_is_refused(bundle: Path, tmp_path: Path) -> None:
    """schemaVersion 3.0 is not a delta: a layer it leaves out is a missing layer, not a base one."""
    doc = _doc(bundle)
    assert doc["schemaVersion"] == "3.0"
    top = doc["images"][APP]["layers"][2]
    top["external"] = True
    (bundle / BLOBS / top["digest"][7:]).unlink()
    _repin(bundle, doc)
    found = _problems(bundle, tmp_path)
    _assert_both(found, "invalid-external-layer", top["digest"], "3.0")


def test_a_real_delta_still_passes(bundle: Path, tmp_path: Path) -> None:
    doc = _doc(bundle)
    doc["schemaVersion"] = "3.1"
    top = doc["images"][APP]["layers"][2]
    top["external"] = True
    (bundle / BLOBS / top["digest"][7:]).unlink()
    _repin(bundle, doc)
    assert _problems(bundle, tmp_path) == {}


# ============================================================================ 3. JSON documents are objects


def _manifest_is_array(b: Path, doc: dict[str, Any]) -> str:
    _replace_manifest(b, doc, APP, lambda m: [])
    return BLOBS + doc["images"][APP]["manifest"]["digest"][7:]


def _config_is_null(b: Path, doc: dict[str, Any]) -> str:
    _replace_config(b, doc, APP, lambda c: None)
    return BLOBS + doc["images"][APP]["config"]["digest"][7:]


def _layer_descriptor_is_a_string(b: Path, doc: dict[str, Any]) -> str:
    _replace_manifest(b, doc, APP, lambda m: {**m, "layers": [*m["layers"], "junk"]})
    return BLOBS + doc["images"][APP]["manifest"]["digest"][7:]


def _config_descriptor_is_an_array(b: Path, doc: dict[str, Any]) -> str:
    _replace_manifest(b, doc, APP, lambda m: {**m, "config": [m["config"]]})
    return BLOBS + doc["images"][APP]["manifest"]["digest"][7:]


def _index_entry_is_a_number(b: Path, doc: dict[str, Any]) -> str:
    index = json.loads((b / "index.json").read_text())
    index["manifests"].append(42)
    (b / "index.json").write_text(json.dumps(index))
    return "index.json"


def _rootfs_is_an_array(b: Path, doc: dict[str, Any]) -> str:
    _replace_config(b, doc, APP, lambda c: {**c, "rootfs": [c["rootfs"]]})
    return BLOBS + doc["images"][APP]["config"]["digest"][7:]


NOT_OBJECTS = {f.__name__[1:]: f for f in (_manifest_is_array, _config_is_null, _layer_descriptor_is_a_string,
                                           _config_descriptor_is_an_array, _index_entry_is_a_number,
                                           _rootfs_is_an_array)}


@pytest.mark.parametrize("name", sorted(NOT_OBJECTS))
def test_json_documents_must_be_objects(bundle: Path, tmp_path: Path, name: str) -> None:
    doc = _doc(bundle)
    path = NOT_OBJECTS[name](bundle, doc)
    _repin(bundle, doc)
    assert sums_accept(bundle)
    found = _problems(bundle, tmp_path)
    _assert_both(found, "invalid-manifest", path, "expected", "object")


# Found by the fuzzer (tests/test_fuzz.py): descriptors whose fields have the wrong type, an
# index entry describing the manifest with another size, a rootfs that is not of type "layers".


def _config_media_type_is_a_number(b: Path, doc: dict[str, Any]) -> tuple[str, str]:
    _replace_manifest(b, doc, APP, lambda m: {**m, "config": {**m["config"], "mediaType": 2**63}})
    return "invalid-manifest", BLOBS + doc["images"][APP]["manifest"]["digest"][7:]


def _layer_size_is_a_string(b: Path, doc: dict[str, Any]) -> tuple[str, str]:
    _replace_manifest(b, doc, APP, lambda m: {**m, "layers": [{**m["layers"][0], "size": "141"}, *m["layers"][1:]]})
    return "invalid-manifest", BLOBS + doc["images"][APP]["manifest"]["digest"][7:]


def _index_entry_with_another_size(b: Path, doc: dict[str, Any]) -> tuple[str, str]:
    index = json.loads((b / "index.json").read_text())
    index["manifests"][0]["size"] += 1
    (b / "index.json").write_text(json.dumps(index))
    return "invalid-layout", "index.json"


def _rootfs_of_another_type(b: Path, doc: dict[str, Any]) -> tuple[str, str]:
    _replace_config(b, doc, APP, lambda c: {**c, "rootfs": {**c["rootfs"], "type": {}}})
    return "invalid-manifest", BLOBS + doc["images"][APP]["config"]["digest"][7:]


WRONG_FIELDS = {f.__name__[1:]: f for f in (_config_media_type_is_a_number, _layer_size_is_a_string,
                                            _index_entry_with_another_size, _rootfs_of_another_type)}


@pytest.mark.parametrize("name", sorted(WRONG_FIELDS))
def test_descriptor_and_rootfs_fields_are_checked(bundle: Path, tmp_path: Path, name: str) -> None:
    doc = _doc(bundle)
    problem_id, path = WRONG_FIELDS[name](bundle, doc)
    _repin(bundle, doc)
    assert sums_accept(bundle)
    _assert_both(_problems(bundle, tmp_path), problem_id, path, "expected")


# ============================================================================ 4. SHA256SUMS lists every file


def _listed(b: Path) -> set[str]:
    return {f["path"] for f in _doc(b)["files"]} | {"bundle.json"}


def test_empty_sums_is_refused(bundle: Path, tmp_path: Path) -> None:
    (bundle / "SHA256SUMS").write_bytes(b"")
    found = _problems(bundle, tmp_path)
    for where in ("folder", "tar"):
        assert {path for path, _ in found.get(f"{where}:sums-mismatch", [])} == _listed(bundle), where


def test_partial_sums_is_refused(bundle: Path, tmp_path: Path) -> None:
    lines = (bundle / "SHA256SUMS").read_text().splitlines(keepends=True)
    kept = [x for x in lines if x.endswith("  bundle.json\n") or x.endswith("  index.json\n")]
    (bundle / "SHA256SUMS").write_text("".join(kept))
    found = _problems(bundle, tmp_path)
    for where in ("folder", "tar"):
        assert {path for path, _ in found.get(f"{where}:sums-mismatch", [])} == \
            _listed(bundle) - {"bundle.json", "index.json"}, where


# ============================================================================ 5. SHA256SUMS split as coreutils does


@pytest.mark.parametrize("sep", ["\r\n", "\u2028", "\x0b", "\x0c", "\x1c", "\x85"])
def test_sums_split_on_lf_only(bundle: Path, tmp_path: Path, sep: str) -> None:
    raw = (bundle / "SHA256SUMS").read_text()
    (bundle / "SHA256SUMS").write_bytes(raw.replace("\n", sep).encode("utf-8"))
    found = _problems(bundle, tmp_path)
    for where in ("folder", "tar"):
        assert found.get(f"{where}:sums-invalid"), (where, sorted(found))


HEX_A = hashlib.sha256(b"a\n").hexdigest()
HEX_B = hashlib.sha256(b"b\n").hexdigest()

#: crafted SHA256SUMS -> whether parse_sums accepts it; the test also runs `sha256sum -c --strict`
#: on each: whatever coreutils refuses, parse_sums must refuse too (it is stricter in places).
SUMS_CASES: dict[str, tuple[bytes, bool]] = {
    "plain": (f"{HEX_A}  a\n{HEX_B}  b\n".encode(), True),
    "binary-mode": (f"{HEX_A} *a\n{HEX_B}  b\n".encode(), True),
    "no-final-newline": (f"{HEX_A}  a\n{HEX_B}  b".encode(), True),
    "crlf": (f"{HEX_A}  a\r\n{HEX_B}  b\r\n".encode(), False),
    "u2028": (f"{HEX_A}  a\u2028{HEX_B}  b\n".encode(), False),
    "u2029": (f"{HEX_A}  a\u2029{HEX_B}  b\n".encode(), False),
    "nel": (f"{HEX_A}  a\x85{HEX_B}  b\n".encode(), False),
    "vertical-tab": (f"{HEX_A}  a\x0b{HEX_B}  b\n".encode(), False),
    "form-feed": (f"{HEX_A}  a\x0c{HEX_B}  b\n".encode(), False),
    "file-separator": (f"{HEX_A}  a\x1c{HEX_B}  b\n".encode(), False),
    "lone-cr": (f"{HEX_A}  a\r{HEX_B}  b\n".encode(), False),
    "nul": (f"{HEX_A}  a\x00{HEX_B}  b\n".encode(), False),
    "blank-line": (f"{HEX_A}  a\n\n{HEX_B}  b\n".encode(), False),
    "leading-space": (f" {HEX_A}  a\n{HEX_B}  b\n".encode(), False),
    "uppercase-hex": (f"{HEX_A.upper()}  a\n{HEX_B}  b\n".encode(), False),
    "one-space": (f"{HEX_A} a\n{HEX_B}  b\n".encode(), False),
    "empty": (b"", True),  # parses to nothing; the cross-check with bundle.json refuses it (rule 4)
    "only-newline": (b"\n", False),
}


@pytest.mark.parametrize("name", sorted(SUMS_CASES))
def test_sums_parsing_is_never_laxer_than_coreutils(tmp_path: Path, name: str) -> None:
    raw, ours_ok = SUMS_CASES[name]
    (tmp_path / "a").write_bytes(b"a\n")
    (tmp_path / "b").write_bytes(b"b\n")
    (tmp_path / "SHA256SUMS").write_bytes(raw)
    coreutils_ok = subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=tmp_path,
                                  capture_output=True, check=False).returncode == 0
    entries, problems = parse_sums(raw)
    assert (not problems) == ours_ok, problems
    if ours_ok and raw:
        assert coreutils_ok, "parse_sums accepts a file sha256sum -c refuses"
        assert entries == {"a": entries["a"], "b": entries["b"]} and str(entries["a"]) == "sha256:" + HEX_A
    if name in ("plain", "binary-mode", "no-final-newline"):
        assert coreutils_ok
