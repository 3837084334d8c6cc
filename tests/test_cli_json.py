"""``--json`` is dependable: every command prints exactly one JSON object on stdout, success or
failure, and it validates against its schema in schemas/cli/ (issue 16, point 6).

Engine-free: a generated bundle, an OCI layout as the engine; a registry push only fails here
(tests/test_registry_push.py pushes for real)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.kit.clijson import SCHEMAS, failed, ok, one_json, validate
from tests.kit.helpers import run_cli


def _tamper(bundle: Path) -> None:
    blob = max((bundle / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))


def _into_oci(bundle: Path, layout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("importer", str(bundle), "--engine", "oci", "--oci-dir", str(layout), "--json", *args)


# ------------------------------ bundle-import
def test_import(bundle: Path, tmp_path: Path) -> None:
    doc = ok("import", _into_oci(bundle, tmp_path / "layout", "--no-receipt"))
    assert doc["result"] == "pass" and len(doc["images"]) == 2
    _tamper(bundle)
    doc = failed("import", _into_oci(bundle, tmp_path / "l2", "--no-receipt"), "verification-failed", 3)
    assert doc["result"] == "fail" and doc["receiptVersion"]  # the receipt, marked ok false
    gone = failed("import", _into_oci(tmp_path / "nothing", tmp_path / "l3"), "bundle-not-found", 2)
    assert "receiptVersion" not in gone


def test_verify_only(bundle: Path) -> None:
    ok("verify", run_cli("importer", str(bundle), "--verify-only", "--json"))
    _tamper(bundle)
    doc = failed("verify", run_cli("importer", str(bundle), "--verify-only", "--json"), "verification-failed", 3)
    assert doc["problems"] and doc["problems"][0]["id"] == "digest-mismatch"


def test_inventory(bundle: Path, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    _into_oci(bundle, layout, "--no-receipt")
    proc = run_cli("importer", "--inventory", "--engine", "oci", "--oci-dir", str(layout), "--json")
    ok("inventory", proc)
    (tmp_path / "have.json").write_text(proc.stdout)  # "ok" is under the checksum: still a --have input
    from importer.inventory.engine import load_inventory

    assert load_inventory((tmp_path / "have.json").read_bytes(), what="have.json")["ok"] is True
    proc = run_cli("importer", "--inventory", "--engine", "docker", "--docker-host", "unix:///nonexistent/d.sock",
                   "--json")
    doc = one_json(proc)
    assert doc["ok"] is False and proc.returncode == doc["error"]["exitCode"] == 6, proc.stderr
    validate("inventory", doc)


def test_usage_errors_are_json_too(bundle: Path) -> None:
    failed("import", run_cli("importer", str(bundle), "--engine", "nope", "--json"), "usage", 2)
    failed("verify", run_cli("importer", "--json", "--verify-only"), "usage", 2)
    failed("inspect", run_cli("bundle", "inspect", "--json"), "usage", 2)
    failed("copy", run_cli("importer", "copy", str(bundle), "--json"), "usage", 2)


def test_import_smoke_refused(bundle: Path, tmp_path: Path) -> None:
    failed("import-smoke", _into_oci(bundle, tmp_path / "layout", "--smoke"), "smoke-config", 2)


def test_smoke_failure() -> None:
    doc = failed("smoke", run_cli("importer", "smoke", "--no-container", "--gates", "bogus", "--json"),
                 "smoke-config", 2)
    assert doc["verdict"] is None and doc["exitCode"] == 2


def test_smoke_and_import_smoke_results(bundle: Path, tmp_path: Path) -> None:
    """The suite for real in this Python (CPU, one cheap gate): a candidate, ok false, exit 10."""
    from tests.kit.smokekit import require_torch

    require_torch()
    args = ("--no-container", "--device", "cpu", "--gates", "shutdown", "--no-receipt", "--json")
    proc = run_cli("importer", "smoke", *args)
    doc = one_json(proc)
    assert proc.returncode == doc["exitCode"] == 10 and doc["ok"] is False and doc["verdict"] == "candidate"
    validate("smoke", doc)
    proc = _into_oci(bundle, tmp_path / "layout", "--smoke", *args)
    doc = one_json(proc)
    assert proc.returncode == doc["exitCode"] == 10 and doc["ok"] is False and doc["import"]["ok"] is True
    validate("import-smoke", doc)


# ------------------------------ copy (both CLIs)
@pytest.mark.parametrize("cli", ["bundle", "importer"])
def test_copy(cli: str, bundle: Path, tmp_path: Path) -> None:
    doc = ok("copy", run_cli(cli, "copy", str(bundle), str(tmp_path / "dst"), "--json"))
    assert doc["verification"]["ok"] is True
    doc = failed("copy", run_cli(cli, "copy", "/nonexistent", str(tmp_path / "d2"), "--json"), "bundle-not-found", 2)
    assert "/nonexistent" in doc["error"]["message"] and not (tmp_path / "d2").exists()


# ------------------------------ bundle
def test_export(bundle: Path, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    _into_oci(bundle, layout, "--no-receipt")
    doc = ok("export", run_cli("bundle", "export", f"oci:{layout}:fake/app:2", "-o", str(tmp_path / "x"), "--json"))
    assert [i["refs"] for i in doc["images"]] == [["fake/app:2"]]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "f").write_text("keep")
    failed("export", run_cli("bundle", "export", f"oci:{layout}:fake/app:2", "-o", str(tmp_path / "mine"), "--force",
                             "--json"), "destination-in-use", 2)


def test_inspect(bundle: Path, tmp_path: Path) -> None:
    ok("inspect", run_cli("bundle", "inspect", str(bundle), "--json"))
    failed("inspect", run_cli("bundle", "inspect", str(tmp_path / "nope"), "--json"), "bundle-not-found", 2)


def test_pack(bundle: Path, tmp_path: Path) -> None:
    doc = ok("pack", run_cli("bundle", "pack", str(bundle), str(tmp_path / "b.tar"), "--split", "64K", "--json"))
    assert len(doc["parts"]) > 1
    (tmp_path / "empty").mkdir()
    failed("pack", run_cli("bundle", "pack", str(tmp_path / "empty"), str(tmp_path / "c.tar"), "--json"),
           "invalid-manifest", 4)


def test_push_failure(bundle: Path) -> None:
    proc = run_cli("bundle", "push", str(bundle), "127.0.0.1:9/team", "--json", "-q", timeout=300)
    doc = one_json(proc)
    assert doc["ok"] is False and proc.returncode == doc["error"]["exitCode"] == 6, proc.stderr
    validate("push", doc)


def test_keygen_and_sign(bundle: Path, tmp_path: Path) -> None:
    prefix = str(tmp_path / "k")
    doc = ok("keygen", run_cli("bundle", "keygen", "-o", prefix, "--json"))
    assert doc["encrypted"] is False
    failed("keygen", run_cli("bundle", "keygen", "-o", prefix, "--json"), "invalid-key", 2)  # never overwrites
    ok("sign", run_cli("bundle", "sign", str(bundle), "--sign-key", prefix + ".key", "--json"))
    failed("sign", run_cli("bundle", "sign", str(bundle), "--sign-key", prefix + ".pub", "--json"), "invalid-key", 2)


def test_every_cli_schema_is_exercised() -> None:
    """Each schema in schemas/cli/ is validated by some test: here (ok/failed) or in the test of a
    command that needs an engine or a server (validate("NAME", ...))."""
    names = {p.name.split(".")[0] for p in (SCHEMAS / "cli").glob("*.schema.json")}
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(Path(__file__).parent.glob("test_*.py")))
    used = {n for n in names if any(f'{call}("{n}"' in text for call in ("ok", "failed", "validate"))}
    assert names - {"error"} <= used, f"no test validates {sorted(names - used)}"
