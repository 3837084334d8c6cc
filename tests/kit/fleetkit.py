"""The fleet as tests make one on one machine: our importer run under another host name (its own
UTS namespace), so its receipts name that host as a node's would, and ``fleet-report`` over the
receipts, its JSON checked against its schema and its table against the JSON."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.kit import engines
from tests.kit.clijson import validate
from tests.kit.helpers import run_cli


def on_host(host: str, *args: str, docker_host: str = "", stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m importer ARGS`` with ``host`` as this machine's name (its own UTS namespace), so
    its receipts name that host as a node's would."""
    engines.require_root("running the importer under another host name (unshare --uts)")
    unshare = engines.require("unshare")
    return run_cli("importer", *args, prefix=(unshare, "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host),
                   docker_host=docker_host or None, input=stdin, timeout=600)


def report(*args: str) -> tuple[int, Any]:
    code, doc, _ = report_and_table(*args)
    return code, doc


def report_and_table(*args: str) -> tuple[int, Any, str]:
    """The exit code, the --json document (checked against its schema) and the table, which must
    give the same verdict and show every row's reasons and notes whole."""
    proc = run_cli("importer", "fleet-report", *args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    validate("fleet-report", doc)
    table = run_cli("importer", "fleet-report", *args)  # the same verdict as a table
    assert "Traceback" not in table.stderr, table.stderr
    assert table.returncode == proc.returncode and f"fleet: {doc['verdict']}:" in table.stdout
    for h in doc["hosts"]:
        shown = [*(h["reasons"] if h["verdict"] != "pass" else []), *(f"note: {n}" for n in h["notes"])]
        for line in shown:
            if line.isprintable():  # hostile strings come out escaped (tests/test_report_escaping.py)
                assert f"{h['row']}: {line}" in table.stdout.splitlines(), (line, table.stdout)
    return proc.returncode, doc, table.stdout


def hosts(doc: Any) -> dict[str, Any]:
    return {h["hostname"]: h for h in doc["hosts"]}


def rows(doc: Any) -> dict[tuple[str, Any], Any]:
    """The report's rows by (host, engine kind): a host with receipts of two engines has two."""
    return {(h["hostname"], (h["engine"] or {}).get("kind")): h for h in doc["hosts"]}


def table_row(table: str, host: str, engine: str) -> dict[str, str]:
    """The table line of ``host`` and ``engine`` as {column: cell}, cut where the header's columns start."""
    import re

    lines = table.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    names = lines[0].split()
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1])]
        if cells[:2] == [host, engine]:
            return dict(zip(names, cells))
    raise AssertionError(f"no row {host} {engine} in:\n{table}")
