"""Issue 24 class 7: odd files and odd text in a bundle.

A FIFO, a device or a symlink where a blob, bundle.json, SHA256SUMS, index.json, oci-layout or
bundle.json.sig is expected is refused without being opened (no hang, nothing read through a
link) by every command that reads a bundle folder; a ``null`` or wrong-typed carried index or
bundle.json field is a typed error that leaves nothing behind; a lone surrogate (``"\\udc80"``)
anywhere in bundle.json, an index or a parts index is a typed error, never a UnicodeEncodeError
when a command prints or writes it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.kit.helpers import run_cli
from tests.kit.trustkit import regenerate_sums

#: every command that reads a bundle folder (serve would serve forever: it must refuse at once)
COMMANDS = {
    "verify": ["importer", "{b}", "--verify-only"],
    "import": ["importer", "{b}", "--engine", "oci", "--oci-dir", "{t}/out"],
    "serve": ["importer", "serve", "{b}", "--listen", "127.0.0.1:0", "-q"],
    "bundle-inspect": ["bundle", "inspect", "{b}"],
    "pack": ["bundle", "pack", "{b}", "{t}/b.tar"],
    "bundle-copy": ["bundle", "copy", "{b}", "{t}/copy1"],
    "import-copy": ["importer", "copy", "{b}", "{t}/copy2"],
}
NAMES = ("bundle.json", "SHA256SUMS", "index.json", "oci-layout", "bundle.json.sig", "blob")



def _blob_name(b: Path) -> str:
    doc = json.loads((b / "bundle.json").read_text())
    return str(doc["images"][0]["layers"][0]["digest"]).replace("sha256:", "blobs/sha256/")


def _plant(b: Path, rel: str, kind: str, tmp_path: Path) -> None:
    path = b / rel
    if path.exists():
        (tmp_path / "elsewhere").write_bytes(path.read_bytes())  # a link to the very bytes expected
        path.unlink()
    else:
        (tmp_path / "elsewhere").write_bytes(b"{}")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero") if os.geteuid() != 0 else os.mknod(path, 0o600 | 0o020000, os.makedev(1, 5))
    else:
        path.symlink_to(tmp_path / "elsewhere")


CASES = [(name, kind) for name in NAMES for kind in ("fifo", "symlink")] + \
    [(name, "device") for name in ("bundle.json", "SHA256SUMS", "blob")]


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_an_odd_file_in_a_bundle_is_refused_by_every_command(pristine: Path, tmp_path: Path, name: str,
                                                              kind: str) -> None:
    b = tmp_path / "b.bundle"
    shutil.copytree(pristine, b)
    _plant(b, _blob_name(b) if name == "blob" else name, kind, tmp_path)
    for cmd, args in COMMANDS.items():
        argv = [a.format(b=b, t=tmp_path) for a in args]
        proc = run_cli(*argv, timeout=60)  # a FIFO opened for reading would block: the timeout fails the test
        assert proc.returncode in (3, 4, 7), f"{cmd}: {proc.returncode} {proc.stderr}"
        assert "Traceback" not in proc.stderr and "error[internal]" not in proc.stderr, proc.stderr
        assert not (tmp_path / "out").exists() and not (tmp_path / "b.tar").exists(), cmd


@pytest.mark.parametrize("name", ["SHA256SUMS", "index.json", "oci-layout"])
def test_nothing_is_read_through_a_link(pristine: Path, tmp_path: Path, name: str) -> None:
    """A link to a file whose content verification would judge: only the link is reported, so
    the content was never read (the old reader followed it and judged the content too)."""
    b = tmp_path / "b.bundle"
    shutil.copytree(pristine, b)
    target = tmp_path / "read-me"
    target.write_text("0" * 64 + "  read-through-the-link\n" if name == "SHA256SUMS" else '{"manifests": 5}')
    (b / name).unlink()
    (b / name).symlink_to(target)
    proc = run_cli("importer", str(b), "--verify-only", "--json")
    assert proc.returncode == 3, proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert {p["id"] for p in problems if p["path"] == name} == {"not-a-regular-file"}, problems
    assert not [p for p in problems if "read-through-the-link" in p["path"] + p["message"]], problems
    assert not [p for p in problems if p["id"] in ("invalid-layout", "invalid-manifest")], problems


def _rewrite(b: Path, old: str, new: str) -> None:
    raw = (b / "bundle.json").read_text()
    assert old in raw
    (b / "bundle.json").write_text(raw.replace(old, new, 1))
    regenerate_sums(b)


@pytest.mark.parametrize("field", ["source", "created", "tool-version", "platform", "extra-key"])
def test_a_lone_surrogate_in_bundle_json_is_a_typed_error(pristine: Path, tmp_path: Path, field: str) -> None:
    b = tmp_path / "b.bundle"
    shutil.copytree(pristine, b)
    doc = json.loads((b / "bundle.json").read_text())
    if field == "source":
        doc["source"]["kind"] = "te\udc80st"
    elif field == "created":
        doc["created"] = "2026\ud800"
    elif field == "tool-version":
        doc["tool"]["version"] = "\udfff"
    elif field == "platform":
        doc["images"][0]["platform"]["os"] = "linux\udc80"
    else:
        doc["x\udc80"] = 1
    (b / "bundle.json").write_text(json.dumps(doc, indent=2))  # ensure_ascii: written as \\udc80 escapes
    regenerate_sums(b)
    for argv in (["importer", str(b), "--verify-only"], ["importer", str(b), "--verify-only", "--json"],
                 ["importer", str(b), "--engine", "oci", "--oci-dir", str(tmp_path / "out"),
                  "--receipt", str(tmp_path / "r.json")],
                 ["bundle", "inspect", str(b)], ["bundle", "inspect", str(b), "--json"]):
        proc = run_cli(*argv)
        assert proc.returncode == 4, f"{argv}: {proc.returncode} {proc.stderr}"
        assert "error[invalid-manifest]" in proc.stderr and "surrogate" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "UnicodeEncodeError" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists()


def test_a_lone_surrogate_in_a_parts_index_is_a_typed_error(pristine: Path, tmp_path: Path) -> None:
    proc = run_cli("bundle", "pack", str(pristine), str(tmp_path / "b.tar"), "--split", "64K")
    assert proc.returncode == 0, proc.stderr
    index = tmp_path / "b.tar.parts.json"
    doc = json.loads(index.read_text())
    doc["note\udc80"] = "\udc80"
    index.write_text(json.dumps(doc))
    proc = run_cli("importer", str(index), "--verify-only", "--json")
    assert proc.returncode == 4, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["id"] in ("invalid-parts-index", "invalid-manifest") and "surrogate" in error["message"], error


def test_a_lone_surrogate_in_a_carried_index_is_a_typed_error(multi_bundle: Path) -> None:
    from tests.kit.fuzzkit import rewrite_index

    b = multi_bundle

    def odd(doc: dict) -> dict:
        doc["manifests"][1]["platform"]["os"] = "linux\udc80"
        return doc

    rewrite_index(b, odd)
    proc = run_cli("importer", str(b), "--verify-only")
    assert proc.returncode == 3, proc.stderr
    assert "error[verification-failed]" in proc.stderr and "surrogate" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("change", [
    ('"index": {', '"index": null, "x": {'),
    ('"index": {', '"index": 7, "x": {'),
    ('"platforms": [', '"platforms": null, "x": ['),
    ('"platform": {', '"platform": null, "x": {'),
    ('"platform": {', '"platform": "linux/amd64", "x": {'),
])
def test_a_null_or_wrong_typed_field_of_a_multiplatform_bundle_is_a_typed_error(multi_bundle: Path, tmp_path: Path,
                                                                                 change: tuple[str, str]) -> None:
    b = multi_bundle
    _rewrite(b, *change)
    out = tmp_path / "out"
    proc = run_cli("importer", str(b), "--engine", "oci", "--oci-dir", str(out), "--json")
    assert proc.returncode == 4, proc.stderr
    assert json.loads(proc.stdout)["error"]["id"] == "invalid-manifest"
    assert not out.exists()  # no staging ref, nothing written: refused before any side effect
