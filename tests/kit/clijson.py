"""Our CLIs' ``--json`` documents checked against their schemas (schemas/cli/*.schema.json, with
the other schemas they refer to): ``validate(command, doc)``; ``ok``/``failed`` for a finished
run (exactly one JSON object on stdout, the exit code, the error id)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tests.kit.helpers import REPO, run_cli

SCHEMAS = REPO / "schemas"


def _registry() -> Registry:
    resources = []
    for path in SCHEMAS.rglob("*.schema.json"):
        doc = json.loads(path.read_text(encoding="utf-8"))
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validate(command: str, doc: Any) -> None:
    schema = json.loads((SCHEMAS / "cli" / f"{command}.schema.json").read_text(encoding="utf-8"))
    errors = [f"{e.json_path}: {e.message}" for e in
              Draft202012Validator(schema, registry=REGISTRY).iter_errors(doc)]
    assert not errors, f"schemas/cli/{command}.schema.json: {errors[:5]}"


def one_json(proc: subprocess.CompletedProcess[str]) -> Any:
    """stdout is exactly one JSON object (nothing before or after it)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict), proc.stdout
    return doc


def ok(command: str, proc: subprocess.CompletedProcess[str]) -> Any:
    doc = one_json(proc)
    assert proc.returncode == 0 and doc["ok"] is True, proc.stderr
    validate(command, doc)
    return doc


def failed(command: str, proc: subprocess.CompletedProcess[str], error_id: str, code: int) -> Any:
    doc = one_json(proc)
    assert proc.returncode == code, proc.stderr
    assert doc["ok"] is False and doc["error"]["id"] == error_id and doc["error"]["exitCode"] == code, doc
    assert f"error[{error_id}]" in proc.stderr  # stderr still says it for people
    validate(command, doc)
    return doc


def export_json(*args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``bundle export ARGS --json -q``: the run and its one JSON document (None when it printed
    none), checked against the export schema (the error schema when it failed)."""
    proc = run_cli("bundle", "export", *args, "--json", "-q")
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    if doc is not None:
        validate("export" if proc.returncode == 0 else "error", doc)
    return proc, doc
