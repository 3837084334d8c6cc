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
    proc = run_cli("importer", "fleet-report", *args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    validate("fleet-report", doc)
    table = run_cli("importer", "fleet-report", *args)  # the same verdict as a table
    assert table.returncode == proc.returncode and f"fleet: {doc['verdict']}:" in table.stdout
    return proc.returncode, doc


def hosts(doc: Any) -> dict[str, Any]:
    return {h["hostname"]: h for h in doc["hosts"]}
