"""Issue 24 class 6: reports print data, not terminal commands. Strings taken from receipts,
bundles and registries reach the terminal through importer/format/text.py ``printable`` (the one
escaping function): ESC, CR, BEL, C1 controls (the 8-bit CSI ``\\x9b``), line separators and lone
surrogates are shown escaped, never written raw (and a lone surrogate never raises
UnicodeEncodeError)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from importer.format.text import printable
from tests.kit.bundlegen import make_bundle
from tests.kit.helpers import run_cli

HOSTILE = "\x1b]0;owned\x07\x1b[2J\rnode\x9b31m\u2028\u202e"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u2028", "\u202e")


def test_printable_escapes_controls_c1_and_lone_surrogates() -> None:
    assert printable("a\x1b[31mb\rc\x07d\x9be\x85f") == "a\\x1b[31mb\\rc\\x07d\\x9be\\x85f"
    assert printable("x\udc80y\ud800") == "x\\udc80y\\ud800"
    assert printable("caf\u00e9 \U0001f600") == "caf\u00e9 \U0001f600"  # letters and a surrogate pair unchanged
    printable("\udc80").encode("utf-8")  # encodable: no UnicodeEncodeError on a terminal


@pytest.fixture(scope="module")
def receipt(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real import receipt (engine-free: the OCI layout target)."""
    tmp = tmp_path_factory.mktemp("esc")
    proc = run_cli("importer", str(pristine), "--engine", "oci", "--oci-dir", str(tmp / "out"),
                   "--receipt", str(tmp / "r.json"), "-q")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads((tmp / "r.json").read_text()))


def _hostile_receipts(receipt: dict[str, Any], folder: Path) -> Path:
    folder.mkdir()
    good = json.loads(json.dumps(receipt))
    good["host"]["hostname"] = "ok" + HOSTILE
    good["engine"]["kind"] = "oci" + HOSTILE
    (folder / "a.json").write_text(json.dumps(good))
    failed = json.loads(json.dumps(receipt))
    failed["host"]["hostname"] = "bad\udc80" + HOSTILE
    failed["result"], failed["ok"] = "fail", False
    failed["error"] = {"id": "x" + HOSTILE, "message": "boom" + HOSTILE + "\udc80"}
    (folder / "b.json").write_text(json.dumps(failed))
    (folder / ("c" + "\x1b[31m" + ".json")).write_text("not json" + HOSTILE)
    return folder


def test_fleet_report_prints_hostile_receipt_strings_escaped(receipt: dict[str, Any], tmp_path: Path) -> None:
    folder = _hostile_receipts(receipt, tmp_path / "receipts")
    proc = run_cli("importer", "fleet-report", str(folder))
    assert proc.returncode == 12, proc.stderr  # a host failed and a file is not a receipt
    assert "Traceback" not in proc.stderr and "UnicodeEncodeError" not in proc.stderr, proc.stderr
    for raw in RAW:
        assert raw not in proc.stdout, (raw, proc.stdout)
    assert "\\x1b]0;owned\\x07" in proc.stdout and "\\udc80" in proc.stdout, proc.stdout
    assert "ok\\x1b" in proc.stdout  # the host is still named, escaped
    doc = json.loads(run_cli("importer", "fleet-report", str(folder), "--json").stdout)
    assert any(h["hostname"] == "ok" + HOSTILE for h in doc["hosts"])  # --json keeps the exact strings


def test_the_import_table_and_inspect_escape_bundle_strings(tmp_path: Path) -> None:
    """bundle.json strings no schema rule keeps plain (platform values, the tool version, created)
    are shown escaped by the import table and both inspect commands."""
    from tests.kit.trustkit import regenerate_sums

    b = make_bundle(tmp_path / "b.bundle")
    doc = json.loads((b / "bundle.json").read_text())
    doc["tool"]["version"] = "1" + HOSTILE
    doc["created"] = "2026" + HOSTILE
    (b / "bundle.json").write_text(json.dumps(doc))
    regenerate_sums(b)
    for argv in (["importer", str(b), "--engine", "oci", "--oci-dir", str(tmp_path / "out")],
                 ["bundle", "inspect", str(b)]):
        proc = run_cli(*argv)
        assert proc.returncode == 0, proc.stderr
        for raw in RAW:
            assert raw not in proc.stdout + proc.stderr, (argv, raw)
    proc = run_cli("bundle", "inspect", str(b))
    assert "\\x1b]0;owned" in proc.stdout, proc.stdout


def test_smoke_and_check_only_tables_go_through_printable() -> None:
    """The smoke CLI, fleet-report and the check-only/import table write through printable_block
    (the same function): a table line holding ESC comes out escaped."""
    import contextlib
    import io

    from importer.cli import fleet
    from importer.cli import smoke as smoke_cli

    for out in (smoke_cli._out, fleet._out):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            out("HOST\n" + HOSTILE + "\udc80")
        assert not any(raw in buf.getvalue() for raw in RAW) and "\\udc80" in buf.getvalue()
        assert buf.getvalue().count("\n") == 2  # the table's own line breaks kept


def test_copy_prints_escaped(tmp_path: Path) -> None:
    src = make_bundle(tmp_path / ("b" + "\x1b[31m"))
    dst = tmp_path / ("dst\x07")
    proc = run_cli("importer", "copy", str(src), str(dst))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr
    shutil.rmtree(dst)
