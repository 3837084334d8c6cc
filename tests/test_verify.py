"""Verification finds every kind of damage, names the file, and collects all problems."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from importer.cli.main import main as import_main
from importer.errors import UnsupportedSchemaVersion
from importer.verify.bundle import verify_bundle
from tests.kit.bundlegen import make_bundle
from tests.kit.fuzzkit import flip_byte
from tests.kit.helpers import run_pyz


def _doc(b: Path) -> dict:
    return json.loads((b / "bundle.json").read_text())


def _blob(b: Path, kind: str) -> Path:
    image = _doc(b)["images"][1]
    digest = image["layers"][-1]["digest"] if kind == "layer" else image[kind]["digest"]
    return b / "blobs" / "sha256" / digest[7:]


def _flip_text(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def _ids(b: Path) -> set[tuple[str, str]]:
    return {(p.id, p.path) for p in verify_bundle(str(b)).problems}


def rel(b: Path, p: Path) -> str:
    return str(p.relative_to(b))


CASES: dict[str, Callable[[Path], tuple[str, str]]] = {}


def case(fn: Callable[[Path], tuple[str, str]]) -> Callable[[Path], tuple[str, str]]:
    CASES[fn.__name__] = fn
    return fn


@case
def flipped_layer(b: Path) -> tuple[str, str]:
    flip_byte(_blob(b, "layer"))
    return "digest-mismatch", rel(b, _blob(b, "layer"))


@case
def flipped_config(b: Path) -> tuple[str, str]:
    flip_byte(_blob(b, "config"))
    return "digest-mismatch", rel(b, _blob(b, "config"))


@case
def flipped_manifest(b: Path) -> tuple[str, str]:
    flip_byte(_blob(b, "manifest"))
    return "digest-mismatch", rel(b, _blob(b, "manifest"))


@case
def flipped_index(b: Path) -> tuple[str, str]:
    flip_byte(b / "index.json", at=5)
    return "digest-mismatch", "index.json"


@case
def flipped_bundle_json(b: Path) -> tuple[str, str]:
    created = _doc(b)["created"]
    _flip_text(b / "bundle.json", created, created.replace("20", "19", 1))
    return "digest-mismatch", "bundle.json"


@case
def flipped_sums(b: Path) -> tuple[str, str]:
    line = (b / "SHA256SUMS").read_text().splitlines()[0]
    _flip_text(b / "SHA256SUMS", line, ("0" if line[0] != "0" else "1") + line[1:])
    return "sums-mismatch", line.split("  ", 1)[1]


@case
def flipped_importer(b: Path) -> tuple[str, str]:
    flip_byte(b / "bundle-import.pyz")
    return "digest-mismatch", "bundle-import.pyz"


@case
def truncated_layer(b: Path) -> tuple[str, str]:
    p = _blob(b, "layer")
    p.write_bytes(p.read_bytes()[:-10])
    return "size-mismatch", rel(b, p)


@case
def appended_byte(b: Path) -> tuple[str, str]:
    p = _blob(b, "layer")
    p.write_bytes(p.read_bytes() + b"\0")
    return "size-mismatch", rel(b, p)


@case
def missing_blob(b: Path) -> tuple[str, str]:
    p = _blob(b, "layer")
    p.unlink()
    return "missing-file", rel(b, p)


@case
def extra_file(b: Path) -> tuple[str, str]:
    (b / "blobs" / "sha256" / ("e" * 64)).write_bytes(b"surprise")
    return "unlisted-file", "blobs/sha256/" + "e" * 64


@case
def swapped_blob(b: Path) -> tuple[str, str]:
    doc = _doc(b)
    layers = doc["images"][1]["layers"]
    src = b / "blobs" / "sha256" / layers[0]["digest"][7:]
    dst = _blob(b, "layer")
    shutil.copy(src, dst)
    return "size-mismatch", rel(b, dst)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tamper_is_found_and_named(bundle: Path, name: str) -> None:
    problem = CASES[name](bundle)
    assert problem in _ids(bundle)


def test_pristine_bundle_has_no_problem(bundle: Path) -> None:
    report = verify_bundle(str(bundle))
    assert report.ok and report.files_checked == len(_doc(bundle)["files"])


def test_every_problem_is_reported_together(bundle: Path) -> None:
    flipped_layer(bundle)
    extra_file(bundle)
    flipped_importer(bundle)
    assert {i for i, _ in _ids(bundle)} >= {"digest-mismatch", "unlisted-file"}
    assert len(_ids(bundle)) >= 3


def test_schema_major_99_is_refused_with_exit_4(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _flip_text(bundle / "bundle.json", '"schemaVersion": "3.0"', '"schemaVersion": "99.0"')
    with pytest.raises(UnsupportedSchemaVersion):
        verify_bundle(str(bundle))
    assert import_main([str(bundle), "--verify-only"]) == 4
    err = capsys.readouterr().err
    assert "error[unsupported-schema-version]" in err and "99.0" in err and "bundle-import.pyz" in err


def test_cli_exit_code_and_message_name_the_blob(bundle: Path) -> None:
    expected = flipped_layer(bundle)
    proc = run_pyz(bundle, "--verify-only", drop_env=())
    assert proc.returncode == 3
    assert "error[verification-failed]" in proc.stderr
    assert f"[{expected[0]}] {expected[1]}" in proc.stderr
    assert "hint: nothing was loaded" in proc.stderr


def test_verify_only_json(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing_blob(bundle)
    assert import_main([str(bundle), "--verify-only", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["problems"][0]["id"] == "missing-file"


def test_gzip_bundle_tamper_is_found(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "gz", compression="gzip")
    flip_byte(_blob(b, "layer"))
    assert ("digest-mismatch", rel(b, _blob(b, "layer"))) in _ids(b)


def test_shallow_verify_checks_every_byte_without_decompressing(bundle: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert import_main([str(bundle), "--verify-only", "--shallow", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verification"]["layersChecked"] == 0
    expected = flipped_layer(bundle)
    assert import_main([str(bundle), "--verify-only", "--shallow"]) == 3
    assert f"[{expected[0]}] {expected[1]}" in capsys.readouterr().err
